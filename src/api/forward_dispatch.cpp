#include "api/forward_dispatch.hpp"

#include <string>

#include "api/device.hpp"
#include "kernels/fwd/forward_kernels.hpp"

namespace hopattn {
namespace {

using ForwardLauncher = cudaError_t (*)(const Problem&, const ForwardTensors&, const LaunchDevice&, cudaStream_t);

struct ForwardKernelEntry {
  DType dtype;
  int head_dim;
  ForwardLauncher launch;
};

// One entry per instantiation this build compiled (generated from HOPATTN_HEADDIMS/HOPATTN_DTYPES).
constexpr ForwardKernelEntry kForwardKernels[] = {
#define HOPATTN_KERNEL(dtype, head_dim) {DType::dtype, head_dim, &launch_forward_kernel<DType::dtype, head_dim>},
#include "kernels/instantiations/kernel_list.inc"
#undef HOPATTN_KERNEL
};

// The smallest compiled kernel head dim >= head_dim for this dtype (the kernel zero-pads the rest).
const ForwardKernelEntry* find_forward_kernel(DType dtype, int head_dim) {
  const ForwardKernelEntry* best = nullptr;
  for (const ForwardKernelEntry& e : kForwardKernels) {
    if (e.dtype != dtype || e.head_dim < head_dim) continue;
    if (best == nullptr || e.head_dim < best->head_dim) best = &e;
  }
  return best;
}

}  // namespace

Status run_forward_kernel(const Problem& problem, const ForwardTensors& tensors, cudaStream_t stream) {
  const ForwardKernelEntry* kernel = find_forward_kernel(problem.dtype, problem.head_dim);
  if (kernel == nullptr) {
    return Status(StatusCode::kNotSupported,
                  std::string("this build has no forward kernel for dtype ") + dtype_name(problem.dtype) +
                      " with head_dim >= " + std::to_string(problem.head_dim) +
                      "; rebuild with it in the CMake options HOPATTN_DTYPES / HOPATTN_HEADDIMS");
  }
  const DeviceLimits limits = current_device_limits();
  const LaunchDevice device{limits.multiprocessors, limits.l2_bytes};
  return cuda_status(kernel->launch(problem, tensors, device, stream), "forward kernel launch");
}

}  // namespace hopattn
