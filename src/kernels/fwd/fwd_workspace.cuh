// The forward's optional workspace (caller-allocated, sized by forward_workspace_size()). Without
// one the forward runs a static schedule; with one it takes its tiles from a counter (tile lengths
// vary: masked or varlen problems) or splits the last round's tiles (equal tiles, see
// TileScheduler). Layout, from a 256-byte aligned start:
//   counters  int32, zeroed by a one-warp kernel ahead of the forward kernel, which starts under
//             it (programmatic dependent launch) and waits for it only where it first touches one:
//             [0]          the next tile to hand out, less gridDim.x (dynamic schedule)
//             [1, 1+ctas)  per split-tail slot, how many consumer threads of its CTA have left
//                          their partial in it
//   partials  (ctas, kSlotFloats) fp32, split tail only: slot c holds CTA c's partial, each
//             consumer thread's normalised O fragment and its rows' LSE (natural log),
//             value-major so that a warp's stores and loads of one value are 128 contiguous bytes
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/grid_dependency.cuh"
#include "kernels/fwd/fwd_params.cuh"

namespace hopattn {

template <class Traits>
struct ForwardWorkspace {
  static constexpr int kRowsPerThread = 2;  // of a 64-row WGMMA accumulator
  static constexpr long long kOFloats = static_cast<long long>(Traits::kBlockM) * Traits::kHeadDim;
  static constexpr long long kSlotFloats = kOFloats + kRowsPerThread * Traits::kConsumerThreads;
  static constexpr size_t kAlignment = 256;

  static int counters(int ctas, bool split) { return 1 + (split ? ctas : 0); }
  static size_t counters_bytes(int ctas, bool split) {
    return (counters(ctas, split) * sizeof(int32_t) + kAlignment - 1) / kAlignment * kAlignment;
  }
  static size_t bytes_for(int ctas, bool split) {
    const size_t partials = split ? ctas * kSlotFloats * sizeof(float) : 0;
    return counters_bytes(ctas, split) + partials + kAlignment;
  }

  // Points `params` into `base` (16-byte aligned, bytes_for(ctas, split) bytes): the tile counter
  // where `dynamic`, the split tail's flags and partials where `split`.
  static void carve(void* base, int ctas, bool dynamic, bool split, ForwardParams<Traits>& params) {
    const uintptr_t at = (reinterpret_cast<uintptr_t>(base) + kAlignment - 1) / kAlignment * kAlignment;
    params.workspace_counters = reinterpret_cast<int32_t*>(at);
    params.workspace_counter_count = counters(ctas, split);
    if (dynamic) params.tile_counter = params.workspace_counters;
    if (split) {
      params.tail_flags = params.workspace_counters + 1;
      params.tail_partials = reinterpret_cast<float*>(at + counters_bytes(ctas, split));
    }
  }
};

// Zeroes the workspace's counters, letting the forward kernel start at once (see above). A
// template like the kernel it serves, so that each instantiation unit has its own.
template <class Traits>
__global__ void __launch_bounds__(32) reset_forward_counters_kernel(int32_t* counters, int count) {
  allow_next_kernel_to_start();
  for (int i = threadIdx.x; i < count; i += blockDim.x) counters[i] = 0;
}

}  // namespace hopattn
