// Writes a finished forward tile: O through a swizzled shared-memory staging buffer (stmatrix in,
// 16-byte rows out, so global stores are coalesced and stop exactly at the sequence's last row and
// the real head dim), LSE straight from the registers that hold each row's statistics.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/named_barriers.hpp"
#include "kernels/common/warpgroup_mma.cuh"
#include "kernels/fwd/fwd_tile_info.cuh"

namespace hopattn {

// Calls f(row, chunk) for every 16-byte chunk of the warpgroup's real rows within the real head
// dim; row counts from the warpgroup's first row.
template <class Traits, class F>
CUTE_DEVICE void for_each_output_chunk(const ForwardTile& t, int head_dim, int warpgroup, int thread_in_wg, F&& f) {
  constexpr int kChunksPerRow = Traits::kHeadDim * sizeof(typename Traits::Element) / 16;
  constexpr int kElementsPerChunk = 16 / sizeof(typename Traits::Element);
  const int rows = t.seqlen_q - t.m_block * Traits::kBlockM - warpgroup * 64;
  const int chunks = head_dim / kElementsPerChunk;
  CUTE_UNROLL
  for (int i = thread_in_wg; i < 64 * kChunksPerRow; i += cutlass::NumThreadsPerWarpGroup) {
    const int row = i / kChunksPerRow;
    const int chunk = i % kChunksPerRow;
    if (row < rows && chunk < chunks) f(row, chunk * kElementsPerChunk);
  }
}

template <class Traits>
CUTE_DEVICE typename Traits::Element* output_row(const ForwardParams<Traits>& params, const ForwardTile& t, int row) {
  return params.o.template at<typename Traits::Element>(t.batch, static_cast<long long>(t.q_offset) + row, t.head);
}

template <class Traits>
CUTE_DEVICE void store_lse(const ForwardParams<Traits>& params, const ForwardTile& t, int row, float value) {
  const RowTensor& lse = params.lse;
  if (lse.data == nullptr || row >= t.seqlen_q) return;
  *lse.at<float>(t.batch, static_cast<long long>(t.q_offset) + row, t.head) = value;
}

// A tile whose rows see no key at all: O = 0, LSE = -inf, nothing loaded.
template <class Traits>
CUTE_DEVICE void store_empty_tile(const ForwardParams<Traits>& params, const ForwardTile& t, int thread) {
  const int warpgroup = thread / cutlass::NumThreadsPerWarpGroup;
  const int thread_in_wg = thread % cutlass::NumThreadsPerWarpGroup;
  const int first_row = t.m_block * Traits::kBlockM + warpgroup * 64;
  for_each_output_chunk<Traits>(t, params.problem.head_dim, warpgroup, thread_in_wg, [&](int row, int col) {
    *reinterpret_cast<uint4*>(output_row(params, t, first_row + row) + col) = make_uint4(0, 0, 0, 0);
  });
  if (thread_in_wg < 64) store_lse(params, t, first_row + thread_in_wg, -INFINITY);
}

template <class Traits, class AccO, class RowCoords, int kRows, class TiledMmaPV>
CUTE_DEVICE void store_tile(const ForwardParams<Traits>& params, typename Traits::SharedStorage& smem,
                            const ForwardTile& t, AccO const& tOrO, RowCoords const& tScS, const float (&lse)[kRows],
                            TiledMmaPV const& mma_pv, int thread) {
  using namespace cute;
  using Element = typename Traits::Element;
  const int warpgroup = thread / cutlass::NumThreadsPerWarpGroup;
  const int thread_in_wg = thread % cutlass::NumThreadsPerWarpGroup;
  Element* staging = Traits::kOStagedInQ ? smem.q.data() : smem.o.data();
  cute::Tensor sO = make_tensor(make_smem_ptr(staging), typename Traits::SmemLayoutO{});  // (M, D)

  cute::Tensor rO = make_tensor_like<Element>(tOrO);
  convert_fragment(tOrO, rO);
  auto smem_copy = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
  auto thr_copy = smem_copy.get_thread_slice(thread);
  // Each warpgroup stages and stores only its own 64 rows, so it syncs only with itself: once so
  // that its previous tile's reads are over, once so that the rows are complete.
  const uint32_t epilogue_barrier = barrier_id(FwdBarrier::kEpilogue0, warpgroup);
  cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, epilogue_barrier);
  copy(smem_copy, thr_copy.retile_S(rO), thr_copy.partition_D(sO));
  cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, epilogue_barrier);

  const int first_row = t.m_block * Traits::kBlockM + warpgroup * 64;
  for_each_output_chunk<Traits>(t, params.problem.head_dim, warpgroup, thread_in_wg, [&](int row, int col) {
    const uint4 value = *reinterpret_cast<uint4 const*>(&sO(warpgroup * 64 + row, col));
    *reinterpret_cast<uint4*>(output_row(params, t, first_row + row) + col) = value;
  });

  if (thread % 4 == 0) {  // the four threads of a quad share their rows' statistics
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) store_lse(params, t, t.m_block * Traits::kBlockM + get<0>(tScS(r, 0)), lse[r]);
  }
}

}  // namespace hopattn
