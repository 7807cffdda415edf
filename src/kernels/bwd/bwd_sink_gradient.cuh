// The attention sinks' gradient (BackwardArgs::dsinks). Head h's sink is a logit without a value,
// so it reaches the loss only through each row's normalisation:
//   d loss / d sink_h = -sum over the rows of head h of exp(sink_h - LSE) * D,  D = rowsum(dO * O),
// with D as the preprocess left it in the workspace (bwd_preprocess.cuh) and LSE as the caller gave
// it. One CTA per head; the rows of the batch, sequence after sequence, go in chunks of 32 (a lane
// each) to the warps in turn, and the warps' sums add in warp order: a fixed order, so the result
// is bitwise the same on every run, deterministic mode or not, and every warp is busy whether the
// batch is one long sequence or many short ones. (A warp per sequence left one warp of sixteen
// working at batch 1: with a 128-key window at 16k tokens, where the main kernel is short, the
// backward with sinks ran at 0.80-0.82 of the one without on the H100.)
// Precision: the terms come from the natural LSE with expf, not from the workspace's LSE * log2(e)
// with exp2 (its fp32 rounding, |LSE| log2(e) 2^-24, made each term 10x less exact than the rows'
// own D), and they add up in double: on the H100 the fp32 version was 3x the error of the same sum
// done naively in fp32, over a few thousand rows. Runs after the backward's other kernels: a few
// microseconds against the milliseconds of the main kernel.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include <cute/config.hpp>

#include "kernels/bwd/bwd_workspace.hpp"
#include "kernels/common/problem.hpp"

namespace hopattn {

inline constexpr int kSinkGradientThreads = 512;

// A template like the kernels it follows, so that each instantiation unit has its own.
template <class Traits>
__global__ void __launch_bounds__(kSinkGradientThreads)
    backward_sink_gradient_kernel(const Problem problem, const RowTensor lse, const float* sinks, float* dsinks,
                                  const BackwardWorkspace ws) {
  constexpr int kWarps = kSinkGradientThreads / 32;
  const int head = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float sink = sinks[head];
  double sum = 0.0;
  int chunks_before = 0;  // chunks of the sequences before b, dealt out already
  for (int b = 0; b < problem.batch; ++b) {
    // The preprocess wrote max_seqlen_q rows of a sequence at most (a longer one breaks the
    // contract; its rows past that are not read).
    const Sequence seq = problem.queries.sequence(b);
    const int length = min(seq.length, problem.max_seqlen_q);
    const int chunks = (length + 31) / 32;
    const long long first = ws.row_index(head, ws.sequence_row(problem.queries, b));
    const long long batch_index = problem.varlen() ? 0 : b;
    // This warp's chunks of sequence b: chunk j goes to warp (chunks_before + j) % kWarps.
    for (int j = (warp - chunks_before % kWarps + kWarps) % kWarps; j < chunks; j += kWarps) {
      const int i = j * 32 + lane;
      if (i >= length) continue;
      // A row with LSE -inf (no key and a sink of -inf) has O = 0 and D = 0: nothing to add.
      const float row_lse = *lse.at<const float>(batch_index, seq.offset + i, head);
      if (row_lse != -INFINITY) sum -= static_cast<double>(expf(sink - row_lse)) * ws.dpsum[first + i];
    }
    chunks_before += chunks;
  }
  __shared__ double warp_sums[kWarps];
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp != 0) return;
  sum = lane < kWarps ? warp_sums[lane] : 0.0;
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (lane == 0) dsinks[head] = static_cast<float>(sum);
}

}  // namespace hopattn
