// The Hopper forward kernels as the API sees them: one launcher per (dtype, kernel head dim),
// compiled in its own translation unit (see src/kernels/instantiations/), no CuTe types here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "api/device.hpp"
#include "api/problem.hpp"

namespace hopattn {

// Device memory for the dynamic schedule's tile counter (one int, padded to the workspace
// alignment).
inline constexpr size_t kForwardTileCounterBytes = 16;

// `tile_counter`: kForwardTileCounterBytes of device memory, reset on `stream` before the launch
// (dynamic schedule), or null (static schedule).
template <DType kDType, int kHeadDim>
cudaError_t launch_forward_kernel(const Problem& problem, const ForwardTensors& tensors, int* tile_counter,
                                  const DeviceLimits& device, cudaStream_t stream);

}  // namespace hopattn
