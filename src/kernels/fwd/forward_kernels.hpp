// The Hopper forward kernels as the API sees them: one launcher per (dtype, kernel head dims),
// compiled in its own translation unit (see src/kernels/instantiations/), no CuTe types here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/device_limits.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/common/score_variant.hpp"

namespace hopattn {

// `workspace`: null, or forward_workspace_bytes() bytes (16-byte aligned) that the kernel may use
// to split its last round of tiles along the keys or to take its tiles from a counter
// (fwd_workspace.cuh). kScores must be score_variant(problem).
template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
cudaError_t launch_forward_kernel(const Problem& problem, const ForwardTensors& tensors, const DeviceLimits& device,
                                  void* workspace, cudaStream_t stream);

// The workspace that launch_forward_kernel can use for `problem` on `device` (0: none).
template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
size_t forward_workspace_bytes(const Problem& problem, const DeviceLimits& device);

}  // namespace hopattn
