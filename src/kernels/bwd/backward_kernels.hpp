// The Hopper backward kernels as the API sees them: one launcher per (dtype, kernel head dim),
// compiled in its own translation unit (see src/kernels/instantiations/), no CuTe types here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/device_limits.hpp"
#include "kernels/bwd/bwd_workspace.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/common/score_variant.hpp"

namespace hopattn {

// Preprocess, main and postprocess kernels on `stream`; `workspace` holds at least
// BackwardWorkspace::bytes_for(problem, {kHeadDim, kHeadDimV}) bytes. kScores must be
// score_variant(problem).
template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
cudaError_t launch_backward_kernels(const Problem& problem, const BackwardTensors& tensors, void* workspace,
                                    bool deterministic, const DeviceLimits& device, cudaStream_t stream);

}  // namespace hopattn
