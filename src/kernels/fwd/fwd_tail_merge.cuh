// The split tail's workspace and merge (see TileScheduler for the split itself).
//
// Workspace (caller-allocated, sized by forward_workspace_size()):
//   flags     (ctas) int32, zeroed by a one-warp kernel ahead of the forward kernel, which starts
//             under it (programmatic dependent launch) and waits for it only where the split tail
//             first touches a flag: how many consumer threads of that CTA have left their
//             partial in its slot
//   partials  (ctas, kSlotFloats) fp32: slot c holds CTA c's partial, each consumer thread's
//             normalised O fragment and its rows' LSE (natural log), value-major so that a warp's
//             stores and loads of one value are 128 contiguous bytes
// The partial is written and read back by the same thread index of the same fragment layout, so
// it never needs a shuffle. The owner merges in slot order: the result is the same on every run.
#pragma once

#include <cute/tensor.hpp>

#include <cstddef>
#include <cstdint>

#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/mma_layouts.cuh"
#include "kernels/fwd/fwd_params.cuh"

namespace hopattn {

template <class Traits>
struct ForwardTailWorkspace {
  static constexpr int kRowsPerThread = 2;  // of a 64-row WGMMA accumulator
  static constexpr long long kOFloats = static_cast<long long>(Traits::kBlockM) * Traits::kHeadDim;
  static constexpr long long kSlotFloats = kOFloats + kRowsPerThread * Traits::kConsumerThreads;
  static constexpr size_t kAlignment = 256;

  static size_t flags_bytes(int ctas) { return (ctas * sizeof(int32_t) + kAlignment - 1) / kAlignment * kAlignment; }
  static size_t bytes_for(int ctas) { return flags_bytes(ctas) + ctas * kSlotFloats * sizeof(float) + kAlignment; }

  // Sets the workspace pointers of `params` in `base` (16-byte aligned, bytes_for(ctas) bytes).
  static void carve(void* base, int ctas, ForwardParams<Traits>& params) {
    const uintptr_t at = (reinterpret_cast<uintptr_t>(base) + kAlignment - 1) / kAlignment * kAlignment;
    params.tail_flags = reinterpret_cast<int32_t*>(at);
    params.tail_partials = reinterpret_cast<float*>(at + flags_bytes(ctas));
  }
};

// Zeroes the split tail's flags, letting the forward kernel start at once (see above). A template
// like the kernel it serves, so that each instantiation unit has its own.
template <class Traits>
__global__ void __launch_bounds__(32) reset_tail_flags_kernel(int32_t* flags, int count) {
  allow_next_kernel_to_start();
  for (int i = threadIdx.x; i < count; i += blockDim.x) flags[i] = 0;
}

// A piece that is not its tile's last: leaves this thread's share of the normalised O and LSE in
// the CTA's slot, then counts itself in the slot's flag (release: the owner that sees every
// thread counted sees their values).
template <class Traits, class AccO, int kRows>
CUTE_DEVICE void store_tail_partial(const ForwardParams<Traits>& params, int slot, AccO const& tOrO,
                                    const float (&lse)[kRows], int thread) {
  using Workspace = ForwardTailWorkspace<Traits>;
  static_assert(kRows == Workspace::kRowsPerThread, "slot layout assumes two rows per thread");
  constexpr int kThreads = Traits::kConsumerThreads;
  float* part = params.tail_partials + slot * Workspace::kSlotFloats;
  cute::Tensor o = as_row_col(tOrO);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(o); ++c) __stcg(part + o.layout()(r, c) * kThreads + thread, o(r, c));
    __stcg(part + Workspace::kOFloats + r * kThreads + thread, lse[r]);
  }
  wait_for_previous_kernel();  // the flags are zeroed
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(params.tail_flags + slot) : "memory");
}

// The owner of a split tile: folds the partials of the slots [merge_first, merge_first +
// merge_count) into its own normalised O and LSE, waiting for each until all its writers are in.
template <class Traits, class AccO, int kRows>
CUTE_DEVICE void merge_tail_partials(const ForwardParams<Traits>& params, const TailPiece& piece, AccO& tOrO,
                                     float (&lse)[kRows], int thread) {
  using Workspace = ForwardTailWorkspace<Traits>;
  constexpr int kThreads = Traits::kConsumerThreads;
  cute::Tensor o = as_row_col(tOrO);
  wait_for_previous_kernel();  // the flags are zeroed
  for (int i = 0; i < piece.merge_count; ++i) {
    const int slot = piece.merge_first + i;
    const int32_t* flag = params.tail_flags + slot;
    int32_t arrived = 0;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(arrived) : "l"(flag) : "memory");
    } while (arrived < kThreads);
    const float* part = params.tail_partials + slot * Workspace::kSlotFloats;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // Both sides are normalised: weigh them by their share of the combined sum exp(lse).
      const float other = __ldcg(part + Workspace::kOFloats + r * kThreads + thread);
      const float top = fmaxf(lse[r], other);
      if (top == -INFINITY) continue;  // neither side saw a key: O stays 0
      const float own_weight = expf(lse[r] - top);
      const float other_weight = expf(other - top);
      const float total = own_weight + other_weight;
      const float own_share = own_weight / total;
      const float other_share = other_weight / total;
      lse[r] = top + logf(total);
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(o); ++c) {
        o(r, c) = o(r, c) * own_share + __ldcg(part + o.layout()(r, c) * kThreads + thread) * other_share;
      }
    }
  }
}

}  // namespace hopattn
