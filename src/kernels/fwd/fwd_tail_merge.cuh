// The split tail's partials and their merge (see TileScheduler for the split itself, and
// fwd_workspace.cuh for where the partials and flags live). The partial is written and read back
// by the same thread index of the same fragment layout, so it never needs a shuffle. The owner
// merges in slot order: the result is the same on every run. The key splits' combine kernel
// (fwd_split_combine.cuh) merges with the same rule (log_sum_exp.hpp).
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/log_sum_exp.hpp"
#include "kernels/common/mma_layouts.cuh"
#include "kernels/fwd/fwd_workspace.cuh"

namespace hopattn {

// A piece that is not its tile's last: leaves this thread's share of the normalised O and LSE in
// the CTA's slot, then counts itself in the slot's flag (release: the owner that sees every
// thread counted sees their values).
template <class Traits, class AccO, int kRows>
CUTE_DEVICE void store_tail_partial(const ForwardParams<Traits>& params, int slot, AccO const& tOrO,
                                    const float (&lse)[kRows], int thread) {
  using Workspace = ForwardWorkspace<Traits>;
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
  wait_for_previous_kernel();  // the flags are zeroed (fwd_workspace.cuh)
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(params.tail_flags + slot) : "memory");
}

// The owner of a split tile: folds the partials of the slots [merge_first, merge_first +
// merge_count) into its own normalised O and LSE, in slot order, waiting for each until all its
// writers are in. Each fold merges two pieces by the rule of log_sum_exp.hpp.
template <class Traits, class AccO, int kRows>
CUTE_DEVICE void merge_tail_partials(const ForwardParams<Traits>& params, const TailPiece& piece, AccO& tOrO,
                                     float (&lse)[kRows], int thread) {
  using Workspace = ForwardWorkspace<Traits>;
  constexpr int kThreads = Traits::kConsumerThreads;
  cute::Tensor o = as_row_col(tOrO);
  wait_for_previous_kernel();  // the flags are zeroed (fwd_workspace.cuh)
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
      const float other = __ldcg(part + Workspace::kOFloats + r * kThreads + thread);
      LogSumExp merged;
      merged.add(lse[r]);
      merged.add(other);
      const float total = merged.value();
      if (total == -INFINITY) continue;  // neither side saw a key: O stays 0
      const float own_share = piece_weight(lse[r], total);
      const float other_share = piece_weight(other, total);
      lse[r] = total;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(o); ++c) {
        o(r, c) = o(r, c) * own_share + __ldcg(part + o.layout()(r, c) * kThreads + thread) * other_share;
      }
    }
  }
}

}  // namespace hopattn
