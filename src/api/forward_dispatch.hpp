// Runtime -> compile-time dispatch of the forward: picks the Hopper kernel instantiation for a
// validated problem, or says which CMake option would have built it.
#pragma once

#include <cuda_runtime.h>

#include "api/problem.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

// The forward of a validated problem: the Hopper kernel, or for the corner cases it does not take
// (no keys at all, stride-0 broadcast inputs) the simple reference kernel at fp32.
Status run_forward(const Problem& problem, const ForwardTensors& tensors, cudaStream_t stream);

}  // namespace hopattn
