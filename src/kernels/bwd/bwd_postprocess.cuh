// The backward's last kernel, one CTA per (query block, head, batch): dQ = softmax_scale * the
// block's fp32 accumulator, in the input dtype, for the real rows and head dim only. The
// accumulator holds each row block in the register order of the main kernel's dQ WGMMA (see
// backward_mma), so this kernel partitions the same tiling to find each value's row and column.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/bwd/bwd_params.cuh"

namespace hopattn {

template <class Traits>
__global__ void __launch_bounds__(Traits::kMmaThreads) backward_postprocess_kernel(
    const Problem problem, const RowTensor dq, const BackwardWorkspace ws) {
  using namespace cute;
  using Element = typename Traits::Element;
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const Sequence seq = problem.queries.sequence(batch);
  if (m_block * Traits::kBlockM >= seq.length) return;
  const long long first = ws.row_index(head, ws.sequence_row(problem.queries, batch) + m_block * Traits::kBlockM);
  const float* accum = ws.dq_accum + first * ws.head_dim;

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
  CUTE_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    const float v[4] = {values[g].x, values[g].y, values[g].z, values[g].w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {  // (j, j + 1) are neighbouring columns of one row
      const int row = m_block * Traits::kBlockM + get<0>(coords(4 * g + j));
      const int col = get<1>(coords(4 * g + j));
      if (row >= seq.length || col >= problem.head_dim) continue;
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(v[j] * scale);
      pair[1] = Element(v[j + 1] * scale);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(dq.at<Element>(batch_index, seq.offset + row, head) + col) = pair;
    }
  }
}

}  // namespace hopattn
