// Views of Hopper (WGMMA) accumulator fragments that the attention math needs.
#pragma once

#include <cute/tensor.hpp>

namespace hopattn {

// A WGMMA accumulator fragment is ((2, 2, V), MMA_M, MMA_N): a column pair, the row 8 below, and
// V groups of 8 columns. Softmax works on rows, so view it as (rows, columns) =
// ((2, MMA_M), (2, V, MMA_N)): each thread owns 2 * MMA_M rows.
template <class AccLayout>
CUTE_HOST_DEVICE constexpr auto accumulator_row_col_layout(AccLayout acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3, "expected a ((2, 2, V), M, N) WGMMA accumulator layout");
  auto values = get<0>(acc);
  return make_layout(make_layout(get<1>(values), get<1>(acc)),
                     make_layout(get<0>(values), get<2>(values), get<2>(acc)));
}

template <class Tensor>
CUTE_DEVICE auto as_row_col(Tensor&& acc) {
  return cute::make_tensor(acc.data(), accumulator_row_col_layout(acc.layout()));
}

// Multiplies every row of an accumulator fragment by its factor (one per row the thread owns).
template <class Tensor, int kRows>
CUTE_DEVICE void scale_rows(Tensor& acc, const float (&factor)[kRows]) {
  cute::Tensor rows = as_row_col(acc);
  static_assert(decltype(cute::size<0>(rows))::value == kRows, "one factor per row");
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(rows); ++c) rows(r, c) *= factor[r];
  }
}

// For 16-bit inputs, the accumulator of S = Q K^T (M x N) holds, per 16 columns, exactly the
// values that the register A operand of a WGMMA with K = 16 expects. So P can feed O += P V from
// registers: regroup ((2, 2, V), M, N) as ((2, 2, 2), M, (V / 2, N)).
template <class AccLayout>
CUTE_HOST_DEVICE constexpr auto accumulator_as_a_operand_layout(AccLayout acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3, "expected a ((2, 2, V), M, N) WGMMA accumulator layout");
  static_assert(decltype(size<0, 2>(acc))::value % 2 == 0, "the N tile of S must be a multiple of 16");
  auto values = get<0>(acc);
  auto k_groups = logical_divide(get<2>(values), Layout<_2>{});  // (2, V / 2)
  return make_layout(make_layout(get<0>(values), get<1>(values), get<0>(k_groups)), get<1>(acc),
                     make_layout(get<1>(k_groups), get<2>(acc)));
}

}  // namespace hopattn
