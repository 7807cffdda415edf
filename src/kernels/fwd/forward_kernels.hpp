// The Hopper forward kernels as the API sees them: one launcher per (dtype, kernel head dim),
// compiled in its own translation unit (see src/kernels/instantiations/), no CuTe types here.
#pragma once

#include <cuda_runtime.h>

#include "api/problem.hpp"

namespace hopattn {

// Facts about the device a launch is for, read once per device by the caller.
struct LaunchDevice {
  int multiprocessors = 0;
  long long l2_bytes = 0;
};

template <DType kDType, int kHeadDim>
cudaError_t launch_forward_kernel(const Problem& problem, const ForwardTensors& tensors, const LaunchDevice& device,
                                  cudaStream_t stream);

// Head dims with a kernel; any other head_dim runs on the next one up, zero-padded by TMA.
constexpr int kKernelHeadDims[] = {64, 96, 128, 192, 256};

}  // namespace hopattn
