// The element mask of a score tile, shared by the forward (S, rows are queries) and the backward
// (S^T, rows are keys, through BandView::from_keys). Only boundary blocks call it: the tile
// ranges (block_range.hpp) say which.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/fast_divisor.hpp"
#include "kernels/common/mask.hpp"

namespace hopattn {

// Writes `hidden` into every entry of `scores` that the band hides. `scores` and `coords` are the
// (rows, cols) view of one thread's accumulator fragment and of its identity tensor (tile
// coordinates); the tile's row 0 is row first_row and its column 0 inner position first_inner.
// `pack` consecutive rows share one outer position (the forward's packed GQA heads): row r is
// outer position r / pack. Padding rows (r < 0 or past the outer length) see nothing.
template <class Scores, class Coords>
CUTE_DEVICE void hide_invisible(Scores&& scores, const Coords& coords, const BandView& view, int first_row,
                                int first_inner, float hidden, const FastDivisor& pack = FastDivisor()) {
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(scores); ++r) {
    const int row = first_row + cute::get<0>(coords(r, 0));
    const long long outer = pack.divisor() == 1 ? row : (row < 0 ? -1 : pack.divide(row));
    const int lo = static_cast<int>(view.lo(outer));
    const int hi = view.real_outer(outer) ? static_cast<int>(view.hi(outer)) : -1;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores); ++c) {
      const int inner = first_inner + cute::get<1>(coords(r, c));
      if (inner < lo || inner > hi) scores(r, c) = hidden;
    }
  }
}

}  // namespace hopattn
