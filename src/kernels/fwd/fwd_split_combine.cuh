// The key splits' combine step (see fwd_split_plan.hpp): after the forward kernel, merges each
// output row's pieces, left in the workspace as normalised O and LSE (fwd_workspace.cuh), into O
// and LSE by the rule the split tail's owners use (log_sum_exp.hpp):
//   lse = log(sum_s exp(lse_s)),   O = sum_s exp(lse_s - lse) * O_s.
// A CTA takes kRows output rows of one sequence. First each warp works out one row's lse, its
// lanes reading the pieces' LSE side by side; then every warp sums its share of the pieces
// (kPiecesPerRound consecutive pieces a round, rounds dealt to the warps in turn) for all kRows
// rows, so that a few rows with many pieces (decode with MQA: 32 rows, 128 pieces, 8 CTAs) have
// kWarps * kPiecesPerRound * kRows independent loads in flight; last, the warps' sums are added in
// warp order. Every order is fixed, so the result is the same on every run, whatever CTA finished
// which piece first.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/log_sum_exp.hpp"
#include "kernels/fwd/fwd_split_plan.hpp"
#include "kernels/fwd/fwd_workspace.cuh"

namespace hopattn {

// What the combine kernel reads: the problem (its sequences and heads), the pieces' partials and
// the outputs, taken from the forward's params, so that one combine kernel serves every tile shape
// of a head dim and output type (it was instantiated once per forward tile configuration).
struct SplitCombineParams {
  Problem problem;
  const float* split_o;
  const float* split_lse;
  long long split_output_rows;
  int key_splits;
  RowTensor o;
  RowTensor lse;       // lse.data may be null
  const float* sinks;  // null: none
};

template <class Traits>
SplitCombineParams split_combine_params(const ForwardParams<Traits>& params) {
  SplitCombineParams c;
  c.problem = params.problem;
  c.split_o = params.split_o;
  c.split_lse = params.split_lse;
  c.split_output_rows = params.split_output_rows;
  c.key_splits = params.scheduler.key_splits();
  c.o = params.o;
  c.lse = params.lse;
  c.sinks = params.sinks;
  return c;
}

// kWideCtas: where the combine has fewer CTAs than SMs (decode at batch 1; MQA: 32 rows, 8 CTAs),
// more warps share each CTA's pieces, since each warp's rounds are one memory latency each: with 4
// warps the combine took 12.8 us of a 32/1 decode step's ~35 (128 pieces, 8 rounds a warp; H100,
// ncu). Where there are CTAs enough, 4 warps: 16 were 9% slower (32/1, batch 16, 4 queries).
template <int kHeadDimV, bool kWideCtas = false>
struct SplitCombineShape {
  static constexpr int kRows = ForwardSplitModel::kCombineRowsPerCta;  // output rows per CTA
  // Wide: 16 warps at head dim 128, 8 elsewhere, so that the warps' partial sums stay within 32 KB
  // of shared memory and each thread within its share of the registers (at 512 threads ptxas
  // spilled the d64 kernel's 64 loads of a round).
  static constexpr int kWarps = !kWideCtas ? kRows : kHeadDimV == 128 ? 16 : 8;
  static_assert(kWarps >= kRows, "the first and last steps take a row per warp");
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kColumnsPerLane = kHeadDimV / 32;  // lane l: columns l, l + 32, ...
  static_assert(kHeadDimV % 32 == 0, "a warp covers a row in steps of 32 columns");
  // Pieces whose loads a warp issues before it uses any: one memory latency per round. With one
  // piece a round, MQA decode's 128 pieces took 32 latencies per warp (32/1 heads, 32k keys, b1:
  // 0.25 TB/s on the H200 against 0.42 with 32 pieces). 16 values of O per lane and round keep the
  // registers in bounds at every head dim (d256: two pieces).
  static constexpr int kPiecesPerRound = kColumnsPerLane >= 16 ? 1 : 16 / kColumnsPerLane;
};

// The warp's LogSumExp accumulators merged (butterfly: every lane ends with the same value,
// computed in the same order on every run).
CUTE_DEVICE LogSumExp warp_merge(LogSumExp acc) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    LogSumExp other;
    other.top = __shfl_xor_sync(0xffffffff, acc.top, offset);
    other.sum = __shfl_xor_sync(0xffffffff, acc.sum, offset);
    acc.merge(other);
  }
  return acc;
}

// Grid: one CTA per kRows output rows of each sequence, blockIdx.x = batch * row_blocks + block,
// row_blocks = ceil(max_seqlen_q * heads / kRows). Output row i of a sequence is (query i / heads,
// head i % heads); rows past the sequence's queries are not written, as in the forward. Element:
// O's type.
template <class Element, int kHeadDimV, bool kWideCtas>
__global__ void __launch_bounds__(SplitCombineShape<kHeadDimV, kWideCtas>::kThreads)
    combine_key_splits_kernel(CUTE_GRID_CONSTANT SplitCombineParams const params, int row_blocks) {
  using Shape = SplitCombineShape<kHeadDimV, kWideCtas>;
  constexpr int kWarps = Shape::kWarps;
  constexpr int kRows = Shape::kRows;
  constexpr int kColumns = Shape::kColumnsPerLane;
  constexpr int kPieces = Shape::kPiecesPerRound;
  __shared__ float row_lse[kRows];
  __shared__ float sums[kWarps][kRows][kHeadDimV];

  // Every CTA waits for the forward kernel, also those past their sequence's rows: a CTA that left
  // before it could let this kernel complete while the forward still runs.
  wait_for_previous_kernel();
  const Problem& p = params.problem;
  // A sequence's output rows fit in int (fwd_split_plan.hpp splits only then).
  const int batch = blockIdx.x / row_blocks;
  const int first = static_cast<int>(blockIdx.x % row_blocks) * kRows;
  const Sequence seq = p.queries.sequence(batch);
  const int rows_in_sequence = seq.length * p.heads;
  if (first >= rows_in_sequence) return;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int splits = params.key_splits;
  const long long piece_rows = params.split_output_rows;
  auto row_index = [&](int r) {  // among one piece's rows (fwd_workspace.cuh)
    const int i = first + r;
    return split_output_row(p, batch, seq.offset, i / p.heads, i % p.heads);
  };

  // 1. Row `warp`'s merged LSE (-inf where no piece saw a key); wide CTAs' warps past kRows have
  // no row. An attention sink is one more piece, without O: its share only shrinks the others' weights.
  if (warp < kRows && first + warp < rows_in_sequence) {
    const long long row = row_index(warp);
    LogSumExp merged;
    for (int s = lane; s < splits; s += 32) merged.add(__ldcg(params.split_lse + s * piece_rows + row));
    merged = warp_merge(merged);
    if (params.sinks != nullptr) merged.add(params.sinks[(first + warp) % p.heads]);
    if (lane == 0) row_lse[warp] = merged.value();
  }
  __syncthreads();

  // 2. This warp's pieces, weighted. A piece that saw no key (LSE -inf, weight 0) left no O: its
  // slot is read (it lies inside the workspace) but never used; rows past the sequence read row
  // 0's slots, and pieces past the last the last one's, also unused. All of a round's loads (every
  // piece's and row's LSE and O) are issued before any is used (issued a row at a time, each row's
  // weight had waited for its LSE before the next row's loads went out: a latency per piece and row).
  float acc[kRows][kColumns];
  long long row_at[kRows];
  bool live[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    live[r] = first + r < rows_in_sequence && row_lse[r] != -INFINITY;
    row_at[r] = row_index(first + r < rows_in_sequence ? r : 0);
    CUTE_UNROLL
    for (int c = 0; c < kColumns; ++c) acc[r][c] = 0.f;
  }
  for (int round = warp * kPieces; round < splits; round += kWarps * kPieces) {
    float piece_lse[kPieces][kRows];
    float v[kPieces][kRows][kColumns];
    CUTE_UNROLL
    for (int u = 0; u < kPieces; ++u) {
      const long long s = min(round + u, splits - 1);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const long long at = s * piece_rows + row_at[r];
        piece_lse[u][r] = __ldcg(params.split_lse + at);
        const float* o = params.split_o + at * kHeadDimV + lane;
        CUTE_UNROLL
        for (int c = 0; c < kColumns; ++c) v[u][r][c] = __ldcg(o + 32 * c);
      }
    }
    CUTE_UNROLL
    for (int u = 0; u < kPieces; ++u) {
      if (round + u >= splits) break;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        if (!live[r]) continue;
        const float weight = piece_weight(piece_lse[u][r], row_lse[r]);
        CUTE_UNROLL
        for (int c = 0; c < kColumns; ++c) {
          // Not `weight > 0`: a faulted KV cache piece (LSE NaN) must make the row NaN.
          if (weight != 0.f) acc[r][c] = fmaf(weight, v[u][r][c], acc[r][c]);
        }
      }
    }
  }
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < kColumns; ++c) sums[warp][r][lane + 32 * c] = acc[r][c];
  }
  __syncthreads();

  // 3. Row `warp`: the warps' sums in warp order, then O and LSE.
  if (warp >= kRows || first + warp >= rows_in_sequence) return;
  const int i = first + warp;
  const long long token = seq.offset + i / p.heads;
  const int head = i % p.heads;
  Element* out = params.o.template at<Element>(batch, token, head);
  CUTE_UNROLL
  for (int c = 0; c < kColumns; ++c) {
    const int column = lane + 32 * c;
    float v = 0.f;
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) v += sums[w][warp][column];
    if (column < p.head_dim_v) out[column] = static_cast<Element>(v);
  }
  if (lane == 0 && params.lse.data != nullptr) *params.lse.template at<float>(batch, token, head) = row_lse[warp];
}

}  // namespace hopattn
