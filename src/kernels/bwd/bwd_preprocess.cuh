// The backward's first kernel, one CTA per (query block, head, batch): D = rowsum(dO * O) and the
// LSE in log2 units into the workspace (padding rows get D = 0 and LSE = +inf, which makes their
// P exactly 0 in the main kernel), and the block's dQ accumulator and semaphore cleared, so every
// call starts from zero whatever the workspace held.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/bwd/bwd_params.cuh"

namespace hopattn {

inline constexpr int kPreprocessThreads = 256;

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessThreads) backward_preprocess_kernel(
    const Problem problem, const RowTensor o, const RowTensor dout, const RowTensor lse,
    const BackwardWorkspace ws) {
  constexpr int kRows = BackwardWorkspace::kRowBlock;
  constexpr int kWarps = kPreprocessThreads / 32;
  constexpr int kVector = 8;  // 16-byte loads of 16-bit elements
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const Sequence seq = problem.queries.sequence(batch);
  if (m_block * kRows >= seq.length) return;  // past this sequence: no query block to prepare
  const long long first = ws.row_index(head, ws.sequence_row(problem.queries, batch) + m_block * kRows);

  float4* dq = reinterpret_cast<float4*>(ws.dq_accum + first * ws.head_dim);
  for (int i = threadIdx.x; i < kRows * kHeadDim / 4; i += kPreprocessThreads) dq[i] = make_float4(0, 0, 0, 0);
  if (threadIdx.x == 0) ws.semaphores[first / kRows] = 0;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long batch_index = problem.varlen() ? 0 : batch;
  for (int r = warp; r < kRows; r += kWarps) {
    const int row = m_block * kRows + r;
    float d = 0.f, lse_log2 = INFINITY;
    if (row < seq.length) {
      const long long token = seq.offset + row;
      if (lane * kVector < problem.head_dim) {
        const uint4 a = *reinterpret_cast<const uint4*>(o.at<const Element>(batch_index, token, head) + lane * kVector);
        const uint4 b =
            *reinterpret_cast<const uint4*>(dout.at<const Element>(batch_index, token, head) + lane * kVector);
        const Element* x = reinterpret_cast<const Element*>(&a);
        const Element* y = reinterpret_cast<const Element*>(&b);
#pragma unroll
        for (int e = 0; e < kVector; ++e) d += static_cast<float>(x[e]) * static_cast<float>(y[e]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) d += __shfl_xor_sync(0xffffffff, d, offset);
      const float l = *lse.at<const float>(batch_index, token, head);
      // A row that sees no key has LSE = -inf and no gradient: +inf makes its P zero.
      lse_log2 = l == -INFINITY ? INFINITY : l * 1.44269504088896340736f;
    }
    if (lane == 0) {
      ws.dpsum[first + r] = d;
      ws.lse_log2[first + r] = lse_log2;
    }
  }
}

}  // namespace hopattn
