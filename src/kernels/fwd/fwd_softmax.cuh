// Online softmax over the key blocks of one query tile, in the exp2 domain.
//
// Scores arrive raw (Q K^T, masked entries -inf) together with a positive factor that takes them
// to log2 units (softmax_scale * log2(e)), so the max is taken on raw scores and each probability
// costs one FFMA and one EX2: P = exp2(s * factor - max * factor). A negative softmax_scale is
// handled by the caller, which multiplies the scores by it first and passes factor 1. Each thread
// owns slices of whole rows; the four threads of a quad share a row, so the max needs a quad
// all-reduce every block while the running sum stays per-thread until the end.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

#include "kernels/common/constants.hpp"
#include "kernels/common/fast_exp2.cuh"

namespace hopattn {

template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  return op(x, __shfl_xor_sync(0xffffffff, x, 2));
}

// Reduces row r of a (rows x cols) view with a pairwise tree: depth log2(cols) instead of cols.
template <int kCols, class RowCol, class Op>
CUTE_DEVICE float reduce_columns(RowCol const& s, int r, Op op) {
  float v[kCols];
  CUTE_UNROLL
  for (int c = 0; c < kCols; ++c) v[c] = s(r, c);
  CUTE_UNROLL
  for (int stride = 1; stride < kCols; stride *= 2) {
    CUTE_UNROLL
    for (int c = 0; c + stride < kCols; c += 2 * stride) v[c] = op(v[c], v[c + stride]);
  }
  return v[0];
}

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];  // running max of the raw scores; -inf: nothing visible seen yet
  float row_sum[kRows];  // this thread's part of sum exp2(s - row_max)

  CUTE_DEVICE void reset() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Turns the scores of one block (rows x cols view) into unnormalised probabilities and returns,
  // per row, the factor by which earlier contributions (O and the sum) must be rescaled.
  // kSplitExp2: every fourth column's exp2 on the FMA pipe (emulated_exp2) rather than MUFU, for
  // kernels whose MUFU time per block is as long as their GEMMs': FP8, whose WGMMAs run at twice
  // the bf16 rate (d128: 1.7-2.4% faster with it on the H200, 4k-16k). Every other column (about 9
  // instructions each for one MUFU slot) left the bf16 softcap forward issue-bound, and even a
  // quarter lost 3-4% there (non-causal 8k-16k): softcap keeps MUFU only (docs/perf-log.md).
  // The column reductions are pairwise trees and each step runs over all rows at once: a serial
  // chain of 32 dependent FMNMX/FADD per row would leave the warp waiting on their latency.
  template <bool kSplitExp2 = false, class ScoreTensor>
  CUTE_DEVICE void update(ScoreTensor&& s, float factor, float (&rescale)[kRows]) {
    static_assert(decltype(cute::size<0>(s))::value == kRows, "one softmax row per score row");
    constexpr int kCols = decltype(cute::size<1>(s))::value;
    const auto max_op = [](float a, float b) { return fmaxf(a, b); };
    float new_max[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) new_max[r] = fmaxf(row_max[r], reduce_columns<kCols>(s, r, max_op));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) new_max[r] = quad_allreduce(new_max[r], max_op);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // A row that has seen only masked keys keeps max -inf; subtracting 0 instead keeps its
      // probabilities at exp2(-inf) = 0 rather than NaN.
      // Both products are rounded on their own (no FFMA contraction): an unchanged maximum then
      // gives exactly exp2(0) = 1, and the caller skips O's rescale for the warp. Contracted, the
      // difference was the product's rounding error and the factor was almost never exactly 1.
      const float offset = new_max[r] == -INFINITY ? 0.f : __fmul_rn(new_max[r], factor);
      rescale[r] = fast_exp2(__fmul_rn(row_max[r], factor) - offset);
      row_max[r] = new_max[r];
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const float x = fmaf(s(r, c), factor, -offset);
        s(r, c) = kSplitExp2 && c % 4 == 3 ? emulated_exp2(x) : fast_exp2(x);
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_sum[r] = fmaf(row_sum[r], rescale[r], reduce_columns<kCols>(s, r, [](float a, float b) { return a + b; }));
    }
  }

  // After the last block: the factor that normalises O (0 for rows with no visible key, so they
  // come out as 0) and each row's natural-log LSE (-inf for such rows).
  CUTE_DEVICE void finalize(float factor, float (&inv_sum)[kRows], float (&lse)[kRows]) const {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_allreduce(row_sum[r], [](float a, float b) { return a + b; });
      inv_sum[r] = sum == 0.f ? 0.f : 1.f / sum;
      lse[r] = sum == 0.f ? -INFINITY : (row_max[r] * factor + log2f(sum)) * kLn2;
    }
  }
};

}  // namespace hopattn
