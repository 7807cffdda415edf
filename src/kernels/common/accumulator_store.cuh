// Stores a WGMMA accumulator fragment to global memory straight from the registers, without
// shared memory: the four threads of a quad hold, for each of their rows, the 4 bytes (two 16-bit
// values) of every group of 8 columns; a 4 x 4 transpose among them through shuffles gives each
// thread whole 16-byte chunks, stored with one vector store each. The forward writes O this way and
// the backward dK and dV: 16-byte stores instead of 4-byte ones, and no staging buffer to wait for.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "kernels/common/mma_layouts.cuh"

namespace hopattn {

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

// Writes `acc` (one WGMMA atom wide) converted to Element. rows: a (rows, columns) view whose
// get<0> gives the tile row of each of the thread's rows; first_column: the output column of the
// fragment's column 0; columns: how many output columns exist (a multiple of 8); row_pointer(row):
// element 0 of that output row, or nullptr where the row must not be written. `quad_lane` is the
// thread's index within its quad.
template <class Element, class Acc, class RowCoords, class RowPointer>
CUTE_DEVICE void store_accumulator_rows(Acc const& acc, RowCoords const& rows, int first_column, int columns,
                                        RowPointer&& row_pointer, int quad_lane) {
  using namespace cute;
  constexpr int kElementsPerChunk = 16 / sizeof(Element);
  cute::Tensor values = as_row_col(acc);  // (rows, (2, V, 1)): column pair, group of 8 columns
  constexpr int kRows = decltype(size<0>(values))::value;
  constexpr int kChunks = decltype(size<1>(values))::value / 2;
  static_assert(sizeof(Element) == 2 && kChunks % 4 == 0, "a quad transposes 4 chunks of 8 columns at a time");
  static_assert(decltype(size<2>(acc))::value == 1, "one WGMMA atom along the columns: its groups of 8 are consecutive");
  const cutlass::NumericArrayConverter<Element, float, 2> to_pair;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    Element* out = row_pointer(static_cast<int>(get<0>(rows(r, 0))));
    CUTE_UNROLL
    for (int base = 0; base < kChunks; base += 4) {
      uint32_t words[4];
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        cutlass::Array<float, 2> pair;
        pair[0] = values(r, 2 * (base + k));
        pair[1] = values(r, 2 * (base + k) + 1);
        const cutlass::Array<Element, 2> packed = to_pair(pair);
        words[k] = reinterpret_cast<const uint32_t&>(packed);
      }
      const uint4 chunk = quad_transpose(words, quad_lane);
      const int column = first_column + (base + quad_lane) * kElementsPerChunk;
      if (out != nullptr && column < columns) *reinterpret_cast<uint4*>(out + column) = chunk;
    }
  }
}

}  // namespace hopattn
