// Programmatic dependent launch between the kernels of one call (sm_90). A kernel launched with
// `launch_overlapping_previous` may start while the previous kernel of the stream still runs, once
// every CTA of that kernel has called `allow_next_kernel_to_start` (or exited): its CTAs set up
// (barriers, TMA descriptors, loads of inputs the previous kernel does not write) during the
// previous kernel's last wave instead of after it. Before touching anything the previous kernel
// writes, a thread calls `wait_for_previous_kernel`, which returns once that kernel has completed
// and its writes are visible. Both device calls do nothing in a kernel launched the usual way.
//
// Only a kernel of ours may precede one launched this way: the early part of the dependent kernel
// reads the call's inputs, which a caller's kernel that lets its dependents start early could
// still be writing.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include <cute/config.hpp>

namespace hopattn {

CUTE_DEVICE void allow_next_kernel_to_start() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

CUTE_DEVICE void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

template <class... Params, class... Args>
cudaError_t launch_overlapping_previous(void (*kernel)(Params...), dim3 grid, dim3 block, int shared_bytes,
                                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace hopattn
