// Writes a finished forward tile straight from the accumulator registers, without shared memory:
// the four threads of a quad hold, for each of their rows, the 16 bytes of every group of 8
// columns (4 bytes each); a 4 x 4 transpose among them through shuffles gives each thread whole
// 16-byte chunks, stored with one vector store each, bounded by the sequence's last row and the
// real head dim. With no staging buffer, Q's shared memory is free for the next tile as soon as
// the last S GEMM is done. LSE goes straight from the registers that hold each row's statistics.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "kernels/common/mma_layouts.cuh"
#include "kernels/fwd/fwd_tile_info.cuh"

namespace hopattn {

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
  constexpr int kElementsPerChunk = 16 / sizeof(typename Traits::Element);
  constexpr int kChunksPerRow = Traits::kHeadDim / kElementsPerChunk;
  const int warpgroup = thread / cutlass::NumThreadsPerWarpGroup;
  const int thread_in_wg = thread % cutlass::NumThreadsPerWarpGroup;
  const int first_row = t.m_block * Traits::kBlockM + warpgroup * 64;
  const int chunks = params.problem.head_dim / kElementsPerChunk;
  CUTE_UNROLL
  for (int i = thread_in_wg; i < 64 * kChunksPerRow; i += cutlass::NumThreadsPerWarpGroup) {
    const int row = first_row + i / kChunksPerRow;
    const int chunk = i % kChunksPerRow;
    if (row < t.seqlen_q && chunk < chunks) {
      *reinterpret_cast<uint4*>(output_row(params, t, row) + chunk * kElementsPerChunk) = make_uint4(0, 0, 0, 0);
    }
  }
  if (thread_in_wg < 64) store_lse(params, t, first_row + thread_in_wg, -INFINITY);
}

// Lane q of a quad holds a[k] = word q of 16-byte chunk k (k = 0..3); afterwards it holds the
// four words of chunk q, in order. Two exchanges (with lane q ^ 2, then q ^ 1) move the words, a
// final xor-permutation puts them in place.
CUTE_DEVICE uint4 quad_transpose(const uint32_t (&a)[4], int q) {
  const bool hi = q & 2, odd = q & 1;
  // Keep the chunks {2 hi, 2 hi + 1}; swap the other two with lane q ^ 2.
  const uint32_t keep0 = hi ? a[2] : a[0], keep1 = hi ? a[3] : a[1];
  const uint32_t got0 = __shfl_xor_sync(0xffffffff, hi ? a[0] : a[2], 2);
  const uint32_t got1 = __shfl_xor_sync(0xffffffff, hi ? a[1] : a[3], 2);
  // Now keep chunk q (words of lanes q and q ^ 2); swap the other with lane q ^ 1.
  const uint32_t own = odd ? keep1 : keep0, own_far = odd ? got1 : got0;
  const uint32_t near = __shfl_xor_sync(0xffffffff, odd ? keep0 : keep1, 1);
  const uint32_t near_far = __shfl_xor_sync(0xffffffff, odd ? got0 : got1, 1);
  // Word m came from lane m: w[x] is the word of lane q ^ x.
  const uint32_t w[4] = {own, near, own_far, near_far};
  const uint32_t p0 = odd ? w[1] : w[0], p1 = odd ? w[0] : w[1];
  const uint32_t p2 = odd ? w[3] : w[2], p3 = odd ? w[2] : w[3];
  return hi ? make_uint4(p2, p3, p0, p1) : make_uint4(p0, p1, p2, p3);
}

template <class Traits, class AccO, class RowCoords, int kRows>
CUTE_DEVICE void store_tile(const ForwardParams<Traits>& params, const ForwardTile& t, AccO const& tOrO,
                            RowCoords const& tScS, const float (&lse)[kRows], int thread) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kElementsPerChunk = 16 / sizeof(Element);
  constexpr int kChunksPerRow = Traits::kHeadDim / kElementsPerChunk;
  static_assert(sizeof(Element) == 2 && kChunksPerRow % 4 == 0, "a quad transposes 4 chunks of 8 columns at a time");
  cute::Tensor o = as_row_col(tOrO);  // (rows, (2, V, 1)): column pair, group of 8 columns
  static_assert(decltype(size<0>(o))::value == kRows && decltype(size<1>(o))::value == 2 * kChunksPerRow, "");
  const cutlass::NumericArrayConverter<Element, float, 2> to_pair;
  const int q = thread % 4;
  const int chunks = params.problem.head_dim / kElementsPerChunk;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = t.m_block * Traits::kBlockM + get<0>(tScS(r, 0));
    Element* out = output_row(params, t, row);
    CUTE_UNROLL
    for (int base = 0; base < kChunksPerRow; base += 4) {
      uint32_t words[4];
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        cutlass::Array<float, 2> pair;
        pair[0] = o(r, 2 * (base + k));
        pair[1] = o(r, 2 * (base + k) + 1);
        const cutlass::Array<Element, 2> packed = to_pair(pair);
        words[k] = reinterpret_cast<const uint32_t&>(packed);
      }
      const uint4 chunk = quad_transpose(words, q);
      if (row < t.seqlen_q && base + q < chunks) {
        *reinterpret_cast<uint4*>(out + (base + q) * kElementsPerChunk) = chunk;
      }
    }
  }
  if (q == 0) {  // the four threads of a quad share their rows' statistics
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) store_lse(params, t, t.m_block * Traits::kBlockM + get<0>(tScS(r, 0)), lse[r]);
  }
}

}  // namespace hopattn
