// Runtime -> compile-time dispatch of the backward: the Hopper kernels for a validated problem,
// the reference where they do not reach yet, or which CMake option would have built them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/problem.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

// Workspace bytes run_backward needs for this problem.
size_t backward_workspace_bytes(const Problem& problem, const BackwardTensors& tensors);

// dQ, dK, dV of a validated problem; `workspace` holds backward_workspace_bytes bytes.
Status run_backward(const Problem& problem, const BackwardTensors& tensors, void* workspace, bool deterministic,
                    cudaStream_t stream);

}  // namespace hopattn
