#include "api/device.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>

namespace hopattn {
namespace {

// Devices with a larger ordinal are checked afresh on every call: still correct, only slower.
constexpr int kMaxCachedDevices = 64;

// What is known of one device ordinal. multiprocessors stays 0 until the device has passed
// check_current_device(); it is stored last, with release ordering, so a thread that reads it
// non-zero with acquire ordering also sees l2_bytes. Only a supported device is cached, so the
// error path rebuilds its message each time; a device cannot change while the process runs, so an
// entry never goes stale, and threads racing on a first check store the same values.
struct CachedDevice {
  std::atomic<long long> l2_bytes;
  std::atomic<int> multiprocessors;
};
CachedDevice g_devices[kMaxCachedDevices];  // static storage: zero-initialised

bool cacheable(int device) { return device >= 0 && device < kMaxCachedDevices; }

// The cached limits of a device that passed the check; all zeros for any other.
DeviceLimits cached_limits(int device) {
  if (!cacheable(device)) return DeviceLimits{};
  const int multiprocessors = g_devices[device].multiprocessors.load(std::memory_order_acquire);
  if (multiprocessors == 0) return DeviceLimits{};
  return DeviceLimits{multiprocessors, g_devices[device].l2_bytes.load(std::memory_order_relaxed)};
}

Status no_device(cudaError_t error, const char* what) {
  cudaGetLastError();  // clear the (non-sticky) error so later runtime calls start clean
  return Status(StatusCode::kDeviceUnavailable, std::string("no usable CUDA device (") + what + ": " +
                                                    cudaGetErrorString(error) +
                                                    "); hopattn needs an NVIDIA Hopper GPU (sm_90: H100/H200)");
}

// Whether a CUDA context is current on this host thread: the driver's cuCtxGetCurrent, through
// the runtime's entry-point query (the library links the runtime statically, not the driver).
// Unknown (the query failed) counts as none.
bool context_is_current() {
  using GetCurrent = CUresult (*)(CUcontext*);
  static const GetCurrent get_current = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t error =
        cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &function, 4000, cudaEnableDefault, &found);
#else
    const cudaError_t error = cudaGetDriverEntryPoint("cuCtxGetCurrent", &function, cudaEnableDefault, &found);
#endif
    if (error != cudaSuccess) cudaGetLastError();
    return error == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<GetCurrent>(function)
                                                                        : nullptr;
  }();
  CUcontext context = nullptr;
  return get_current != nullptr && get_current(&context) == CUDA_SUCCESS && context != nullptr;
}

}  // namespace

Status check_current_device() {
  // Asked every time: the current device is per host thread and the caller may switch it.
  int device = -1;
  if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return no_device(error, "cudaGetDevice");
  // A host thread whose runtime calls so far needed no context (cudaGetDevice does not; PyTorch's
  // autograd worker thread, running our backward first) has none current, and the launch's TMA
  // descriptors are encoded through the driver, which then fails (CUDA_ERROR_INVALID_CONTEXT) and
  // leaves them garbage: the kernel stopped with an illegal instruction. cudaSetDevice makes the
  // device's primary context current; a context already current (the caller's own) is kept.
  if (!context_is_current()) {
    if (cudaError_t error = cudaSetDevice(device); error != cudaSuccess) return no_device(error, "cudaSetDevice");
  }
  if (cached_limits(device).multiprocessors > 0) return Status();

  int major = 0, minor = 0, multiprocessors = 0, l2_bytes = 0;
  const std::pair<int*, cudaDeviceAttr> queries[] = {{&major, cudaDevAttrComputeCapabilityMajor},
                                                     {&minor, cudaDevAttrComputeCapabilityMinor},
                                                     {&multiprocessors, cudaDevAttrMultiProcessorCount},
                                                     {&l2_bytes, cudaDevAttrL2CacheSize}};
  for (const auto& [value, attribute] : queries) {
    if (cudaError_t error = cudaDeviceGetAttribute(value, attribute, device); error != cudaSuccess) {
      return no_device(error, "cudaDeviceGetAttribute");
    }
  }
  if (major != 9 || minor != 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) cudaGetLastError();  // the name is only cosmetic
    return Status(StatusCode::kDeviceUnavailable, "CUDA device " + std::to_string(device) + " (" + prop.name +
                                                      ") is sm_" + std::to_string(major) + std::to_string(minor) +
                                                      "; hopattn's kernels are built for sm_90a (H100/H200)");
  }
  if (multiprocessors > 0 && cacheable(device)) {
    g_devices[device].l2_bytes.store(l2_bytes, std::memory_order_relaxed);
    g_devices[device].multiprocessors.store(multiprocessors, std::memory_order_release);
  }
  return Status();
}

DeviceLimits current_device_limits() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return DeviceLimits{};
  }
  if (DeviceLimits cached = cached_limits(device); cached.multiprocessors > 0) return cached;
  // Not checked yet (or an ordinal past the cache): ask directly rather than guess.
  int multiprocessors = 0, l2_bytes = 0;
  if (cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
    cudaGetLastError();
  }
  return DeviceLimits{multiprocessors, l2_bytes};
}

Status cuda_status(int cuda_error, const char* what) {
  if (cuda_error == cudaSuccess) return Status();
  return Status(StatusCode::kCudaError,
                std::string(what) + " failed: " + cudaGetErrorString(static_cast<cudaError_t>(cuda_error)));
}

}  // namespace hopattn
