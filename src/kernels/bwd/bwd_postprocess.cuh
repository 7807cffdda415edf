// The backward's last kernel, one CTA per (query block, head, batch): dQ = softmax_scale * the
// block's fp32 accumulator, in the input dtype, for the real rows and head dim only. The
// accumulator holds each row block in the register order of the main kernel's dQ WGMMA (see
// backward_mma), so this kernel partitions the same tiling to find each value's row and column.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/bwd/bwd_params.cuh"
#include "kernels/bwd/bwd_sink_gradient.cuh"
#include "kernels/common/grid_dependency.cuh"

namespace hopattn {

// Waits until the main kernel's partial sums for (batch, head) are all in. Deterministic mode
// waits for the main kernel to complete. Otherwise every CTA (key block and head slice) of the
// (sequence, KV head) counts itself once its sums are in, and this kernel, started during the main
// kernel's last wave, converts the heads finished by then on the SMs that wave leaves idle.
template <class Traits>
CUTE_DEVICE void wait_for_dq_sums(const Problem& problem, const BackwardWorkspace& ws, int batch, int head,
                                  int head_slices, bool deterministic) {
  const int key_blocks = (problem.keys.sequence(batch).length + Traits::kBlockN - 1) / Traits::kBlockN;
  if (deterministic || key_blocks == 0) {
    wait_for_previous_kernel();
    return;
  }
  if (threadIdx.x == 0) {
    const int group = problem.heads / problem.heads_kv;
    const int32_t* finished =
        ws.finished_key_blocks(head / group, group, ws.sequence_row(problem.queries, batch));
    while (load_acquire(finished) < key_blocks * head_slices) __nanosleep(256);
  }
  __syncthreads();
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kMmaThreads) backward_postprocess_kernel(
    const Problem problem, const RowTensor dq, const BackwardWorkspace ws, const int head_slices,
    const bool deterministic, float* dsinks) {
  using namespace cute;
  using Element = typename Traits::Element;
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  // The call must not complete before the main kernel has (dK and dV): the grid's last CTA waits,
  // and then, with attention sinks, adds up their gradient (bwd_sink_gradient.cuh).
  const bool last_cta = m_block == gridDim.x - 1 && head == gridDim.y - 1 && batch == gridDim.z - 1;
  auto finish = [&] {
    if (!last_cta) return;
    wait_for_previous_kernel();
    if (dsinks != nullptr) sum_sink_partials<Traits::kMmaThreads>(problem, ws, dsinks);
  };
  const Sequence seq = problem.queries.sequence(batch);
  if (m_block * Traits::kBlockM >= seq.length) {
    finish();
    return;
  }
  const long long first = ws.row_index(head, ws.sequence_row(problem.queries, batch) + m_block * Traits::kBlockM);
  const float* accum = ws.dq_accum + first * ws.head_dim;
  wait_for_dq_sums<Traits>(problem, ws, batch, head, head_slices, deterministic);

  typename Traits::TiledMmaDQ mma_dq;
  cute::Tensor coords = mma_dq.get_thread_slice(threadIdx.x)
                            .partition_C(make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::HeadDim>{}));
  const long long batch_index = problem.varlen() ? 0 : batch;
  const float scale = problem.softmax_scale;
  // All loads first (the stores cannot alias them, but the compiler does not know that).
  constexpr int kGroups = decltype(size(coords))::value / 4;
  float4 values[kGroups];
  CUTE_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    values[g] = *reinterpret_cast<const float4*>(accum + Traits::dq_staging_offset(4 * g, threadIdx.x));
  }
  // The accumulator's register order scatters a row over four threads, two columns each; shared
  // memory turns the block into rows so that the stores to dQ are whole 16-byte chunks. A row of
  // the tile is padded by 16 bytes, which puts the 8 rows of one store instruction in different
  // banks.
  constexpr int kRowElements = Traits::kHeadDim + 8;
  __shared__ alignas(16) Element tile[Traits::kBlockM * kRowElements];
  CUTE_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    const float v[4] = {values[g].x, values[g].y, values[g].z, values[g].w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {  // (j, j + 1) are neighbouring columns of one row
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(v[j] * scale);
      pair[1] = Element(v[j + 1] * scale);
      const auto coord = coords(4 * g + j);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(tile + get<0>(coord) * kRowElements + get<1>(coord)) = pair;
    }
  }
  __syncthreads();
  constexpr int kChunksPerRow = Traits::kHeadDim / 8;  // 16 bytes each
  const int rows = min(Traits::kBlockM, seq.length - m_block * Traits::kBlockM);
  const int chunks = problem.head_dim / 8;  // head dims are multiples of 8
  for (int c = threadIdx.x; c < Traits::kBlockM * kChunksPerRow; c += Traits::kMmaThreads) {
    const int r = c / kChunksPerRow, chunk = c % kChunksPerRow;
    if (r >= rows || chunk >= chunks) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + r * kRowElements + chunk * 8);
    *reinterpret_cast<uint4*>(dq.at<Element>(batch_index, seq.offset + m_block * Traits::kBlockM + r, head) +
                              chunk * 8) = v;
  }
  finish();
}

// With head slices, the backward's last kernel, one CTA per (workspace key row block, KV head,
// batch), launched after the main kernel has completed: dK and dV from their fp32 sums (dK already
// scaled), in the input dtype, for the real rows and head dim only; eight columns per thread and
// step (two 16-byte loads, one 16-byte store).
inline constexpr int kKeyPostprocessThreads = 256;

template <class Element>
__global__ void __launch_bounds__(kKeyPostprocessThreads) backward_key_postprocess_kernel(
    const Problem problem, const RowTensor dk, const RowTensor dv, const BackwardWorkspace ws) {
  constexpr int kRows = BackwardWorkspace::kRowBlock;
  const int k_block = blockIdx.x, head_kv = blockIdx.y, batch = blockIdx.z;
  const Sequence seq = problem.keys.sequence(batch);
  const int rows = min(kRows, seq.length - k_block * kRows);
  if (rows <= 0) return;
  const long long first = ws.key_row_index(head_kv, ws.sequence_row(problem.keys, batch) + k_block * kRows);
  const long long batch_index = problem.varlen() ? 0 : batch;
  // One pass per gradient: `columns` real ones of rows `row_length` long in the sums.
  auto convert = [&](const float* sums, int row_length, int columns, const RowTensor& to) {
    const int chunks = columns / 8;  // head dims are multiples of 8
    for (int c = threadIdx.x; c < rows * chunks; c += kKeyPostprocessThreads) {
      const int r = c / chunks, chunk = c % chunks;
      const float* from = sums + (first + r) * row_length + chunk * 8;
      const long long token = seq.offset + static_cast<long long>(k_block) * kRows + r;
      const float4 lo = *reinterpret_cast<const float4*>(from);
      const float4 hi = *reinterpret_cast<const float4*>(from + 4);
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      cutlass::Array<Element, 8> out;
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) out[e] = Element(v[e]);
      *reinterpret_cast<cutlass::Array<Element, 8>*>(to.at<Element>(batch_index, token, head_kv) + chunk * 8) = out;
    }
  };
  convert(ws.dk_accum, ws.head_dim, problem.head_dim, dk);
  convert(ws.dv_accum, ws.head_dim_v, problem.head_dim_v, dv);
}

}  // namespace hopattn
