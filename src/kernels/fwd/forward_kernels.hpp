// The Hopper forward kernels as the API sees them: one launcher per (dtype, kernel head dim),
// compiled in its own translation unit (see src/kernels/instantiations/), no CuTe types here.
#pragma once

#include <cuda_runtime.h>

#include "api/device.hpp"
#include "api/problem.hpp"

namespace hopattn {

template <DType kDType, int kHeadDim>
cudaError_t launch_forward_kernel(const Problem& problem, const ForwardTensors& tensors, const DeviceLimits& device,
                                  cudaStream_t stream);

}  // namespace hopattn
