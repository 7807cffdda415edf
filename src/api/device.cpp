#include "api/device.hpp"

#include <cuda_runtime.h>

#include <string>

namespace hopattn {

Status check_current_device() {
  int device = -1;
  const cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return Status(StatusCode::kDeviceUnavailable, std::string("no usable CUDA device (") + cudaGetErrorString(error) +
                                                      "); hopattn needs an NVIDIA Hopper GPU (sm_90: H100/H200)");
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    return Status(StatusCode::kDeviceUnavailable, "CUDA device " + std::to_string(device) + " (" + prop.name +
                                                      ") is sm_" + std::to_string(major) + std::to_string(minor) +
                                                      "; hopattn's kernels are built for sm_90a (H100/H200)");
  }
  return Status();
}

Status cuda_status(int cuda_error, const char* what) {
  if (cuda_error == cudaSuccess) return Status();
  return Status(StatusCode::kCudaError,
                std::string(what) + " failed: " + cudaGetErrorString(static_cast<cudaError_t>(cuda_error)));
}

}  // namespace hopattn
