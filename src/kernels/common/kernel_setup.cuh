// Set-up steps the warp-specialized kernels share: the parameters of a TMA pipeline whose producer
// is warpgroup 0, and the per-device opt-in to large dynamic shared memory on the host.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <atomic>
#include <cstdint>

namespace hopattn {

// Warpgroup 0 produces (thread 0 arms the stage barriers with `stage_bytes`), the other threads
// consume; `consumers` is their count.
template <class Pipeline>
CUTE_DEVICE typename Pipeline::Params tma_pipeline_params(int warpgroup, uint32_t stage_bytes, int consumers) {
  typename Pipeline::Params params;
  params.transaction_bytes = stage_bytes;
  params.role = warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  params.is_leader = threadIdx.x == 0;
  params.num_consumers = consumers;
  return params;
}

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) once per device and kernel; setting it is
// idempotent, so a race between host threads only repeats the work.
template <auto* kKernel>
cudaError_t allow_shared_bytes(int bytes) {
  static std::atomic<uint64_t> configured_devices{0};
  int ordinal = 0;
  if (cudaError_t e = cudaGetDevice(&ordinal); e != cudaSuccess) return e;
  const uint64_t bit = ordinal < 64 ? (uint64_t{1} << ordinal) : 0;
  if (bit != 0 && (configured_devices.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess) {
    return e;
  }
  configured_devices.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

}  // namespace hopattn
