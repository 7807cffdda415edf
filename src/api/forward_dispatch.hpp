// Runtime -> compile-time dispatch of the forward: picks the Hopper kernel instantiation for a
// validated problem, or says which CMake option would have built it.
#pragma once

#include <cuda_runtime.h>

#include "api/problem.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

// An input dimension of extent > 1 with stride 0 (one K broadcast over the batch, say) is legal
// but is not given to TMA, which may reject such a descriptor; those calls take the simple path.
bool has_broadcast_input(const Problem& p, const RowTensor& q, const RowTensor& k, const RowTensor& v);

// The forward of a validated problem: the Hopper kernel, or for the corner cases it does not take
// (no keys at all, stride-0 broadcast inputs) the simple reference kernel at fp32.
Status run_forward(const Problem& problem, const ForwardTensors& tensors, cudaStream_t stream);

}  // namespace hopattn
