// The tile-range functions against brute force over the mask, for many random sizes, windows and
// block shapes: exactly the blocks with a visible element are visited, and exactly the fully
// visible ones skip masking.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernels/common/block_range.hpp"
#include "kernels/common/mask.hpp"
#include "reference/mask_definition.hpp"

namespace hopattn {
namespace {

TEST(Mask, CausalIsBottomRightAligned) {
  const BandMask causal = BandMask::from_args(true, -1, -1);
  // seqlen_q = 2, seqlen_k = 5: query 0 sees keys 0..3, query 1 sees all.
  for (int j = 0; j < 5; ++j) EXPECT_EQ(is_visible(causal, 0, j, 2, 5), j <= 3) << j;
  for (int j = 0; j < 5; ++j) EXPECT_TRUE(is_visible(causal, 1, j, 2, 5)) << j;
  // seqlen_q = 5, seqlen_k = 2: queries 0..2 see nothing, query 3 sees key 0.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(is_visible(causal, i, 0, 5, 2)) << i;
  EXPECT_TRUE(is_visible(causal, 3, 0, 5, 2));
  EXPECT_FALSE(is_visible(causal, 3, 1, 5, 2));
}

TEST(Mask, WindowBoundsAreInclusive) {
  const BandMask window = BandMask::from_args(false, 2, 1);
  // seqlen_q = seqlen_k = 10: query 5 sees keys 3..6.
  for (int j = 0; j < 10; ++j) EXPECT_EQ(is_visible(window, 5, j, 10, 10), j >= 3 && j <= 6) << j;
  EXPECT_FALSE(is_visible(window, 5, 10, 10, 10));  // out of range
}

// The references' closed-form intervals (what the GPU oracle loops over) hold exactly the indices
// the definition makes visible.
TEST(Mask, ReferenceIntervalsMatchTheDefinition) {
  const int bounds[] = {-1, 0, 1, 3, 7};
  for (int left : bounds)
    for (int right : bounds)
      for (int seqlen_q : {1, 2, 5, 9})
        for (int seqlen_k : {1, 3, 5, 11}) {
          const BandMask mask{left, right};
          for (int i = -1; i <= seqlen_q; ++i) {
            const IndexInterval keys = visible_keys(mask, i, seqlen_q, seqlen_k);
            for (int j = -1; j <= seqlen_k; ++j)
              ASSERT_EQ(!keys.empty() && j >= keys.first && j <= keys.last, is_visible(mask, i, j, seqlen_q, seqlen_k))
                  << "keys of query " << i << ": j=" << j << " mask(" << left << "," << right << ") sq=" << seqlen_q
                  << " sk=" << seqlen_k;
          }
          for (int j = -1; j <= seqlen_k; ++j) {
            const IndexInterval queries = visible_queries(mask, j, seqlen_q, seqlen_k);
            for (int i = -1; i <= seqlen_q; ++i)
              ASSERT_EQ(!queries.empty() && i >= queries.first && i <= queries.last,
                        is_visible(mask, i, j, seqlen_q, seqlen_k))
                  << "queries of key " << j << ": i=" << i << " mask(" << left << "," << right << ") sq=" << seqlen_q
                  << " sk=" << seqlen_k;
          }
        }
}

// What both mainloops mask with: from the queries (forward) and from the keys (backward), a
// position pair passes exactly when the definition makes it visible; padding rows see nothing.
TEST(Mask, BandViewMatchesTheDefinition) {
  const int bounds[] = {-1, 0, 1, 3, 7};
  for (int left : bounds)
    for (int right : bounds)
      for (int seqlen_q : {1, 2, 5, 9})
        for (int seqlen_k : {0, 1, 3, 5, 11}) {
          const BandMask mask{left, right};
          const BandView from_queries = BandView::from_queries(mask, seqlen_q, seqlen_k);
          const BandView from_keys = BandView::from_keys(mask, seqlen_q, seqlen_k);
          const auto sees = [](const BandView& view, long long outer, long long inner) {
            return view.real_outer(outer) && inner >= view.lo(outer) && inner <= view.hi(outer);
          };
          for (int i = -2; i <= seqlen_q + 1; ++i)
            for (int j = -2; j <= seqlen_k + 1; ++j) {
              const bool visible = is_visible(mask, i, j, seqlen_q, seqlen_k);
              ASSERT_EQ(sees(from_queries, i, j), visible)
                  << "from queries: i=" << i << " j=" << j << " mask(" << left << "," << right << ") sq=" << seqlen_q
                  << " sk=" << seqlen_k;
              ASSERT_EQ(sees(from_keys, j, i), visible)
                  << "from keys: i=" << i << " j=" << j << " mask(" << left << "," << right << ") sq=" << seqlen_q
                  << " sk=" << seqlen_k;
            }
        }
}

// Dropping the bounds that hide nothing changes no pair of any sequence within the maxima.
TEST(Mask, WithoutVacuousBoundsSeesTheSamePairs) {
  const int bounds[] = {-1, 0, 1, 3, 5, 8, 1 << 30};
  for (int left : bounds)
    for (int right : bounds)
      for (int max_q : {0, 1, 2, 6})
        for (int max_k : {0, 1, 4, 9}) {
          const BandMask mask{left, right};
          const BandMask reduced = mask.without_vacuous_bounds(max_q, max_k);
          for (int seqlen_q = 0; seqlen_q <= max_q; ++seqlen_q)
            for (int seqlen_k = 0; seqlen_k <= max_k; ++seqlen_k)
              for (int i = 0; i < seqlen_q; ++i)
                for (int j = 0; j < seqlen_k; ++j)
                  ASSERT_EQ(is_visible(reduced, i, j, seqlen_q, seqlen_k), is_visible(mask, i, j, seqlen_q, seqlen_k))
                      << "mask(" << left << "," << right << ") max " << max_q << "x" << max_k << " seq " << seqlen_q
                      << "x" << seqlen_k << " i=" << i << " j=" << j;
        }
  EXPECT_TRUE(BandMask::from_args(true, -1, -1).without_vacuous_bounds(1, 8192).unbounded());  // decode
  EXPECT_FALSE(BandMask::from_args(true, -1, -1).without_vacuous_bounds(2, 8192).unbounded());
}

struct RangeCase {
  BandMask mask;
  int seqlen_q, seqlen_k, block_m, block_n;
  int pad = 0;  // the forward's query blocks start this many rows before query 0
};

// Forward query block m covers rows [m * block_m - pad, (m + 1) * block_m - pad).
int first_row_fwd(const RangeCase& c, int m) { return m * c.block_m - c.pad; }

bool any_visible(const RangeCase& c, int m, int n, int pad) {
  for (int i = m * c.block_m - pad; i < (m + 1) * c.block_m - pad; ++i)
    for (int j = n * c.block_n; j < (n + 1) * c.block_n; ++j)
      if (is_visible(c.mask, i, j, c.seqlen_q, c.seqlen_k)) return true;
  return false;
}

// Forward: every key position of the tile is real and visible to every real query row.
bool fully_visible_fwd(const RangeCase& c, int m, int n) {
  for (int i = std::max(first_row_fwd(c, m), 0); i < std::min(first_row_fwd(c, m) + c.block_m, c.seqlen_q); ++i)
    for (int j = n * c.block_n; j < (n + 1) * c.block_n; ++j)
      if (!is_visible(c.mask, i, j, c.seqlen_q, c.seqlen_k)) return false;
  return true;
}

// Backward: every query position of the tile is real and sees every real key of the key block.
bool fully_visible_bwd(const RangeCase& c, int m, int n) {
  for (int j = n * c.block_n; j < std::min((n + 1) * c.block_n, c.seqlen_k); ++j)
    for (int i = m * c.block_m; i < (m + 1) * c.block_m; ++i)
      if (!is_visible(c.mask, i, j, c.seqlen_q, c.seqlen_k)) return false;
  return true;
}

void check_case(const RangeCase& c) {
  const int m_blocks_fwd = (c.seqlen_q + c.pad + c.block_m - 1) / c.block_m;
  const int m_blocks = (c.seqlen_q + c.block_m - 1) / c.block_m;
  const int n_blocks = (c.seqlen_k + c.block_n - 1) / c.block_n;
  const auto describe = [&] {
    return ::testing::Message() << "mask(" << c.mask.left << "," << c.mask.right << ") sq=" << c.seqlen_q
                                << " sk=" << c.seqlen_k << " bm=" << c.block_m << " bn=" << c.block_n
                                << " pad=" << c.pad;
  };
  for (int m = 0; m < m_blocks_fwd; ++m) {
    const BlockRange range = n_block_range(c.mask, m, c.block_m, c.block_n, c.seqlen_q, c.seqlen_k, c.pad);
    const BlockRange unmasked =
        n_block_range_unmasked(c.mask, m, c.block_m, c.block_n, c.seqlen_q, c.seqlen_k, c.pad);
    if (!range.empty()) {
      ASSERT_GE(unmasked.begin, range.begin) << describe();
      ASSERT_LE(unmasked.end, range.end) << describe();
    }
    for (int n = 0; n < n_blocks; ++n) {
      const bool in_range = n >= range.begin && n < range.end;
      ASSERT_EQ(in_range, any_visible(c, m, n, c.pad)) << describe() << " m=" << m << " n=" << n;
      const bool in_unmasked = n >= unmasked.begin && n < unmasked.end;
      ASSERT_EQ(in_unmasked, in_range && fully_visible_fwd(c, m, n)) << describe() << " m=" << m << " n=" << n;
    }
  }
  for (int n = 0; n < n_blocks; ++n) {
    const BlockRange range = m_block_range(c.mask, n, c.block_m, c.block_n, c.seqlen_q, c.seqlen_k);
    const BlockRange unmasked = m_block_range_unmasked(c.mask, n, c.block_m, c.block_n, c.seqlen_q, c.seqlen_k);
    if (!range.empty()) {
      ASSERT_GE(unmasked.begin, range.begin) << describe();
      ASSERT_LE(unmasked.end, range.end) << describe();
    }
    for (int m = 0; m < m_blocks; ++m) {
      const bool in_range = m >= range.begin && m < range.end;
      ASSERT_EQ(in_range, any_visible(c, m, n, 0)) << describe() << " n=" << n << " m=" << m;
      const bool in_unmasked = m >= unmasked.begin && m < unmasked.end;
      ASSERT_EQ(in_unmasked, in_range && fully_visible_bwd(c, m, n)) << describe() << " n=" << n << " m=" << m;
    }
  }
}

TEST(BlockRange, MatchesBruteForceOnRandomProblems) {
  std::mt19937 rng(20261202);
  const int blocks[] = {1, 3, 8, 16, 64, 80, 96, 128, 176, 192};
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 3000; ++trial) {
    RangeCase c;
    c.seqlen_q = pick(0, 3) == 0 ? pick(0, 4) : pick(1, 400);
    c.seqlen_k = pick(0, 3) == 0 ? pick(0, 4) : pick(1, 400);
    c.block_m = blocks[pick(0, 9)];
    c.block_n = blocks[pick(0, 9)];
    switch (pick(0, 4)) {
      case 0:
        c.mask = BandMask{};
        break;  // none
      case 1:
        c.mask = BandMask::from_args(true, -1, -1);
        break;  // causal
      case 2:
        c.mask = BandMask{pick(0, 300), pick(0, 300)};
        break;  // two-sided window
      case 3:
        c.mask = BandMask::from_args(true, pick(0, 300), -1);
        break;  // causal local
      default:
        c.mask = BandMask{pick(0, 1) ? -1 : pick(0, 50), pick(0, 1) ? -1 : pick(0, 50)};
        break;
    }
    switch (pick(0, 2)) {
      case 0:
        c.pad = 0;
        break;
      case 1:
        c.pad = query_block_pad(c.mask, c.block_m, c.seqlen_q);
        break;
      default:
        c.pad = pick(0, c.block_m - 1);
        break;
    }
    check_case(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(BlockRange, PartialQueryBlockGoesFirstUnderACausalMask) {
  const BandMask causal = BandMask::from_args(true, -1, -1);
  EXPECT_EQ(query_block_pad(causal, 192, 2048), 64);  // 2048 = 11 * 192 - 64
  EXPECT_EQ(query_block_pad(causal, 128, 2048), 0);
  EXPECT_EQ(query_block_pad(causal, 192, 0), 0);
  EXPECT_EQ(query_block_pad(BandMask::from_args(true, 100, -1), 192, 100), 92);
  EXPECT_EQ(query_block_pad(BandMask{}, 192, 2048), 0);      // no mask: every block sees every key
  EXPECT_EQ(query_block_pad(BandMask{100, -1}, 192, 2048), 0);  // left window only: first rows see the most
  // The first block then holds queries 0..127 and sees key block 0 only; the last sees all 16.
  EXPECT_EQ(n_block_range(causal, 0, 192, 128, 2048, 2048, 64).end, 1);
  EXPECT_EQ(n_block_range(causal, 10, 192, 128, 2048, 2048, 64).end, 16);
}

TEST(BlockRange, EmptyWhenNothingIsVisible) {
  const BandMask causal = BandMask::from_args(true, -1, -1);
  // seqlen_q = 300 > seqlen_k = 10: the first 290 queries see no key.
  EXPECT_TRUE(n_block_range(causal, 0, 128, 64, 300, 10).empty());
  EXPECT_FALSE(n_block_range(causal, 2, 128, 64, 300, 10).empty());
  EXPECT_TRUE(n_block_range(causal, 0, 128, 64, 0, 10).empty());
  EXPECT_TRUE(m_block_range(causal, 0, 128, 64, 10, 0).empty());
}

}  // namespace
}  // namespace hopattn
