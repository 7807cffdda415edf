// The attention sinks' gradient (BackwardArgs::dsinks). Head h's sink is a logit without a value,
// so it reaches the loss only through each row's normalisation:
//   d loss / d sink_h = -sum over the rows of head h of exp(sink_h - LSE) * D,  D = rowsum(dO * O).
// Two steps, no kernel of their own: the preprocess, which has each row's D and LSE in registers,
// sums its block's terms (sink_gradient_term, store_sink_partial) into the workspace's sink
// partials, one per block of BackwardWorkspace::kRowBlock rows; the dQ postprocess's last CTA, once
// the main kernel (and so the preprocess) has completed, adds each head's partials
// (sum_sink_partials). Every sum has a fixed order (a block's rows, then the blocks sequence after
// sequence), so the result is bitwise the same on every run, deterministic mode or not.
// Why not a kernel after the others: it ran after the postprocess, its launch and its walk over
// every row on the critical path; at batch 1, 16k tokens and a 128-key window (a short main kernel)
// the backward with sinks ran at 0.94 of the one without on the H100 with the rows dealt to all
// warps of one CTA per head, 0.80-0.82 with a warp per sequence.
// Precision: the terms come from the natural LSE with expf, not from the workspace's LSE * log2(e)
// with exp2 (its fp32 rounding, |LSE| log2(e) 2^-24, made each term 10x less exact than the rows'
// own D), and they add up in double: on the H100 the fp32 version was 3x the error of the same sum
// done naively in fp32, over a few thousand rows.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include <cute/config.hpp>

#include "kernels/bwd/bwd_workspace.hpp"
#include "kernels/common/problem.hpp"

namespace hopattn {

// One row's term, -exp(sink - LSE) * D; a row with LSE -inf (no key and a sink of -inf, or a
// padding row) has O = 0 and D = 0: nothing.
CUTE_DEVICE double sink_gradient_term(float sink, float lse, float d) {
  return lse == -INFINITY ? 0.0 : -static_cast<double>(expf(sink - lse)) * d;
}

// The block's sum of its threads' terms into `partial`: a butterfly within each warp, then the
// warps' sums in warp order. Every thread of the block calls it.
template <int kThreads>
CUTE_DEVICE void store_sink_partial(double term, double* partial) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps <= 32, "the warps' sums fit one warp");
  __shared__ double warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) term += __shfl_xor_sync(0xffffffff, term, offset);
  if (lane == 0) warp_sums[warp] = term;
  __syncthreads();
  if (warp != 0) return;
  term = lane < kWarps ? warp_sums[lane] : 0.0;
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) term += __shfl_xor_sync(0xffffffff, term, offset);
  if (lane == 0) *partial = term;
}

// dsinks[h] = the sum of head h's partials, for every head: a warp per head in turn, the head's
// blocks (sequence after sequence) dealt to the lanes in turn. The preprocess wrote the blocks of
// max_seqlen_q rows of a sequence at most (a longer one breaks the contract; its rows past that
// count nowhere). Called by every thread of one CTA of kThreads threads, after the preprocess has
// completed.
template <int kThreads>
CUTE_DEVICE void sum_sink_partials(const Problem& problem, const BackwardWorkspace& ws, float* dsinks) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kRows = BackwardWorkspace::kRowBlock;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int head = warp; head < problem.heads; head += kWarps) {
    double sum = 0.0;
    int blocks_before = 0;  // blocks of the sequences before b, dealt out already
    for (int b = 0; b < problem.batch; ++b) {
      const int length = min(problem.queries.sequence(b).length, problem.max_seqlen_q);
      const int blocks = (length + kRows - 1) / kRows;
      const double* first = ws.sink_partial(ws.row_index(head, ws.sequence_row(problem.queries, b)));
      // Block j of sequence b goes to lane (blocks_before + j) % 32.
      for (int j = (lane - blocks_before % 32 + 32) % 32; j < blocks; j += 32) sum += first[j];
      blocks_before += blocks;
    }
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
    if (lane == 0) dsinks[head] = static_cast<float>(sum);
  }
}

}  // namespace hopattn
