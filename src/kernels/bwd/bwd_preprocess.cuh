// The backward's first kernel, one CTA per (workspace row block, head, batch): D = rowsum(dO * O)
// and the LSE in log2 units into the workspace (padding rows get D = 0 and LSE = +inf, which makes
// their P exactly 0 in the main kernel), and the block's dQ accumulator and semaphores cleared, so
// every call starts from zero whatever the workspace held. With attention sinks (`sinks` not null)
// also the block's share of the sink's gradient (bwd_sink_gradient.cuh), from the D and LSE it
// holds in registers.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include <cute/config.hpp>

#include "kernels/bwd/bwd_params.cuh"
#include "kernels/bwd/bwd_sink_gradient.cuh"
#include "kernels/common/constants.hpp"
#include "kernels/common/grid_dependency.cuh"

namespace hopattn {

inline constexpr int kPreprocessThreads = 256;

// kHeadDim: the kernel's Q/K head dim (dQ's accumulator rows); kHeadDimV: its V head dim (O, dO).
template <class Element, int kHeadDim, int kHeadDimV>
__global__ void __launch_bounds__(kPreprocessThreads) backward_preprocess_kernel(
    const Problem problem, const RowTensor o, const RowTensor dout, const RowTensor lse, const float* sinks,
    const BackwardWorkspace ws) {
  constexpr int kRows = BackwardWorkspace::kRowBlock;
  constexpr int kVector = 8;  // 16-byte loads of 16-bit elements
  // A row is read by a power-of-two group of neighbouring lanes, 16 bytes each (at d96 four of the
  // sixteen idle), so that a warp covers whole rows and the row sum is a butterfly within the group.
  constexpr int kLanesPerRow = kHeadDimV / kVector <= 8 ? 8 : kHeadDimV / kVector <= 16 ? 16 : 32;
  static_assert(kHeadDimV / kVector <= kLanesPerRow, "a row must fit its lanes");
  constexpr int kRowsPerPass = kPreprocessThreads / kLanesPerRow;
  constexpr int kPasses = kRows / kRowsPerPass;
  allow_next_kernel_to_start();  // the main kernel waits for this one before reading the workspace
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  if (m_block == 0 && head == 0 && batch == 0 && threadIdx.x == 0) *ws.tile_counter = 0;  // before any return
  const Sequence seq = problem.queries.sequence(batch);
  if (m_block * kRows >= seq.length) return;  // past this sequence: no query block to prepare
  const long long first = ws.row_index(head, ws.sequence_row(problem.queries, batch) + m_block * kRows);
  const long long batch_index = problem.varlen() ? 0 : batch;
  const int lane_in_row = threadIdx.x % kLanesPerRow;
  const bool loads = lane_in_row * kVector < problem.head_dim_v;

  // Every load of the block first (many in flight), then the arithmetic, then the stores.
  uint4 a[kPasses], b[kPasses];
  float l[kPasses];
  CUTE_UNROLL
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = m_block * kRows + pass * kRowsPerPass + threadIdx.x / kLanesPerRow;
    a[pass] = b[pass] = make_uint4(0, 0, 0, 0);
    l[pass] = -INFINITY;
    if (row < seq.length) {
      const long long token = seq.offset + row;
      if (loads) {
        a[pass] = *reinterpret_cast<const uint4*>(o.at<const Element>(batch_index, token, head) + lane_in_row * kVector);
        b[pass] =
            *reinterpret_cast<const uint4*>(dout.at<const Element>(batch_index, token, head) + lane_in_row * kVector);
      }
      l[pass] = *lse.at<const float>(batch_index, token, head);
    }
  }

  float4* dq = reinterpret_cast<float4*>(ws.dq_accum + first * ws.head_dim);
  for (int i = threadIdx.x; i < kRows * kHeadDim / 4; i += kPreprocessThreads) dq[i] = make_float4(0, 0, 0, 0);
  if (threadIdx.x < kRows / BackwardWorkspace::kSemaphoreRows) {
    ws.semaphore(first)[threadIdx.x] = 0;
  }

  const float sink = sinks != nullptr ? sinks[head] : -INFINITY;
  double sink_term = 0.0;  // this thread's rows' terms of the sink's gradient
  CUTE_UNROLL
  for (int pass = 0; pass < kPasses; ++pass) {
    const Element* x = reinterpret_cast<const Element*>(&a[pass]);
    const Element* y = reinterpret_cast<const Element*>(&b[pass]);
    float d = 0.f;
    CUTE_UNROLL
    for (int e = 0; e < kVector; ++e) d += static_cast<float>(x[e]) * static_cast<float>(y[e]);
    CUTE_UNROLL
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) d += __shfl_xor_sync(0xffffffff, d, offset);
    if (lane_in_row == 0) {
      const int r = pass * kRowsPerPass + threadIdx.x / kLanesPerRow;
      // Padding rows and rows that see no key (LSE = -inf) get +inf: their P is zero.
      ws.dpsum[first + r] = d;
      ws.lse_log2[first + r] = l[pass] == -INFINITY ? INFINITY : l[pass] * kLog2e;
      if (sinks != nullptr) sink_term += sink_gradient_term(sink, l[pass], d);
    }
  }
  if (sinks != nullptr) store_sink_partial<kPreprocessThreads>(sink_term, ws.sink_partial(first));
}

}  // namespace hopattn
