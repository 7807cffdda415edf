// Runtime -> compile-time dispatch of the forward: picks the Hopper kernel instantiation for a
// validated problem, or says which CMake option would have built it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/problem.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

// An input dimension of extent > 1 with stride 0 (one K broadcast over the batch, say) is legal
// but is not given to TMA, which may reject such a descriptor; those calls take the simple path.
bool has_broadcast_input(const Problem& p, const RowTensor& q, const RowTensor& k, const RowTensor& v);

// kNotSupported, naming the CMake options, when this build compiled no forward kernel for the
// problem's dtype and head dim.
Status check_forward_kernel_built(const Problem& problem);

// The workspace the forward of a validated problem can use on the current device (0: none; see
// forward_workspace_size). Expects check_current_device() to have passed.
size_t forward_workspace_bytes(const Problem& problem, const ForwardTensors& tensors);

// The forward of a validated problem: the Hopper kernel, or for what it does not take (no keys at
// all, stride-0 broadcast inputs, FP8 inputs) the simple reference kernel at fp32. `workspace`:
// null, or forward_workspace_bytes() bytes.
Status run_forward(const Problem& problem, const ForwardTensors& tensors, void* workspace, cudaStream_t stream);

}  // namespace hopattn
