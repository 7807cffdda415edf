// uncovered_rows (the rows a varlen backward zeroes) against brute force: for consistent prefix
// sums with and without seqused, the gaps hold exactly the rows no sequence's real tokens cover;
// for inconsistent sums they stay within the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/common/uncovered_rows.hpp"

namespace hopattn {
namespace {

// Rows of [0, total) covered by some sequence's real tokens.
std::vector<bool> covered(const SequenceLayout& side, int batch) {
  std::vector<bool> rows(static_cast<size_t>(side.total_tokens), false);
  for (int b = 0; b < batch; ++b) {
    const Sequence s = side.sequence(b);
    for (long long r = s.offset; r < s.offset + s.length; ++r) rows[static_cast<size_t>(r)] = true;
  }
  return rows;
}

// How many gaps hold each row.
std::vector<int> in_gaps(const SequenceLayout& side, int batch) {
  std::vector<int> rows(static_cast<size_t>(side.total_tokens), 0);
  for (int g = 0; g <= batch; ++g) {
    const RowSpan span = uncovered_rows(side, batch, g);
    EXPECT_LE(span.begin, span.end);
    EXPECT_GE(span.begin, 0);
    EXPECT_LE(span.end, side.total_tokens);
    for (long long r = span.begin; r < span.end; ++r) ++rows[static_cast<size_t>(r)];
  }
  return rows;
}

TEST(UncoveredRows, PackedBatchHasNone) {
  const std::vector<int32_t> cu = {0, 5, 5, 12};
  SequenceLayout side;
  side.cu_seqlens = cu.data();
  side.total_tokens = 12;
  for (int g = 0; g <= 3; ++g) {
    const RowSpan span = uncovered_rows(side, 3, g);
    EXPECT_EQ(span.begin, span.end) << g;
  }
}

TEST(UncoveredRows, EdgesAndSequsedGaps) {
  const std::vector<int32_t> cu = {2, 7, 10};
  const std::vector<int32_t> used = {3, 10};
  SequenceLayout side;
  side.cu_seqlens = cu.data();
  side.seqused = used.data();
  side.total_tokens = 14;
  const RowSpan expected[] = {{0, 2}, {5, 7}, {10, 14}};
  for (int g = 0; g <= 2; ++g) {
    const RowSpan span = uncovered_rows(side, 2, g);
    EXPECT_EQ(span.begin, expected[g].begin) << g;
    EXPECT_EQ(span.end, expected[g].end) << g;
  }
}

TEST(UncoveredRows, MatchBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int batch = std::uniform_int_distribution<int>(0, 6)(rng);
    const bool consistent = trial % 4 != 0;
    std::vector<int32_t> cu(static_cast<size_t>(batch) + 1), used(static_cast<size_t>(batch));
    int32_t at = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int b = 0; b <= batch; ++b) {
      cu[static_cast<size_t>(b)] = consistent ? at : std::uniform_int_distribution<int>(-3, 30)(rng);
      at += std::uniform_int_distribution<int>(0, 6)(rng);
    }
    for (int32_t& u : used) u = std::uniform_int_distribution<int>(-1, 7)(rng);
    SequenceLayout side;
    side.cu_seqlens = cu.data();
    side.seqused = trial % 2 ? used.data() : nullptr;
    const int last = std::max<int>(cu.back(), 0);
    side.total_tokens = std::uniform_int_distribution<int>(consistent ? last : 0, last + 4)(rng);
    const std::vector<bool> real = covered(side, batch);
    const std::vector<int> gaps = in_gaps(side, batch);  // checks every gap's bounds
    if (!consistent) continue;
    for (size_t r = 0; r < real.size(); ++r) {
      EXPECT_EQ(gaps[r], real[r] ? 0 : 1) << "trial " << trial << " row " << r;
    }
  }
}

}  // namespace
}  // namespace hopattn
