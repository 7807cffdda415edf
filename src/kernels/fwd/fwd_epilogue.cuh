// Writes a finished forward tile straight from the accumulator registers (store_accumulator_rows),
// bounded by the sequence's last row and the real head dim. With no staging buffer, Q's shared
// memory is free for the next tile as soon as the last S GEMM is done. LSE goes straight from the
// registers that hold each row's statistics.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/accumulator_store.cuh"
#include "kernels/fwd/fwd_tile_info.cuh"

namespace hopattn {

// Whether a tile row is a real query (rows before query 0, see query_block_pad, and past the
// sequence are not): one unsigned compare for both bounds.
CUTE_DEVICE bool is_query(const ForwardTile& t, int row) {
  return static_cast<unsigned>(row) < static_cast<unsigned>(t.seqlen_q);
}

template <class Traits>
CUTE_DEVICE typename Traits::Element* output_row(const ForwardParams<Traits>& params, const ForwardTile& t, int row) {
  return params.o.template at<typename Traits::Element>(t.batch, static_cast<long long>(t.q_offset) + row, t.head);
}

template <class Traits>
CUTE_DEVICE void store_lse(const ForwardParams<Traits>& params, const ForwardTile& t, int row, float value) {
  const RowTensor& lse = params.lse;
  if (lse.data == nullptr || !is_query(t, row)) return;
  *lse.at<float>(t.batch, static_cast<long long>(t.q_offset) + row, t.head) = value;
}

// A tile whose rows see no key at all: O = 0, LSE = -inf, nothing loaded. Written by `threads`
// threads, `thread` being this one's index among them.
template <class Traits>
CUTE_DEVICE void store_empty_tile(const ForwardParams<Traits>& params, const ForwardTile& t, int thread, int threads) {
  constexpr int kElementsPerChunk = 16 / sizeof(typename Traits::Element);
  constexpr int kChunksPerRow = Traits::kHeadDim / kElementsPerChunk;
  const int chunks = params.problem.head_dim / kElementsPerChunk;
  for (int i = thread; i < Traits::kBlockM * kChunksPerRow; i += threads) {
    const int row = t.first_row + i / kChunksPerRow;
    const int chunk = i % kChunksPerRow;
    if (is_query(t, row) && chunk < chunks) {
      *reinterpret_cast<uint4*>(output_row(params, t, row) + chunk * kElementsPerChunk) = make_uint4(0, 0, 0, 0);
    }
  }
  for (int r = thread; r < Traits::kBlockM; r += threads) store_lse(params, t, t.first_row + r, -INFINITY);
}

template <class Traits, class AccO, class RowCoords, int kRows>
CUTE_DEVICE void store_tile(const ForwardParams<Traits>& params, const ForwardTile& t, AccO const& tOrO,
                            RowCoords const& tScS, const float (&lse)[kRows], int thread) {
  const int q = thread % 4;
  auto row_pointer = [&](int tile_row) -> typename Traits::Element* {
    const int row = t.first_row + tile_row;
    return is_query(t, row) ? output_row(params, t, row) : nullptr;
  };
  store_accumulator_rows<typename Traits::Element>(tOrO, tScS, 0, params.problem.head_dim, row_pointer, q);
  if (q == 0) {  // the four threads of a quad share their rows' statistics
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) store_lse(params, t, t.first_row + cute::get<0>(tScS(r, 0)), lse[r]);
  }
}

}  // namespace hopattn
