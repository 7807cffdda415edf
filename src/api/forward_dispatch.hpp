// Runtime -> compile-time dispatch of the forward: picks the Hopper kernel instantiation for a
// validated problem, or says which CMake option would have built it.
#pragma once

#include <cuda_runtime.h>

#include "api/problem.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

Status run_forward_kernel(const Problem& problem, const ForwardTensors& tensors, cudaStream_t stream);

}  // namespace hopattn
