// The persistent scheduler must hand every tile to exactly one CTA (a tile missed leaves outputs
// unwritten, a tile taken twice is a race), for any grid, shape and section size.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/common/tile_scheduler.hpp"

namespace hopattn {
namespace {

// Runs every CTA's loop as the kernels do and counts how often each (m_block, head, batch) comes.
std::vector<int> visits(const TileScheduler& s, int ctas) {
  std::vector<int> count(static_cast<size_t>(s.total_tiles()), 0);
  for (int cta = 0; cta < ctas; ++cta) {
    for (int round = 0;; ++round) {
      const int linear = TileScheduler::linear_tile(round, cta, ctas);
      if (linear >= s.total_tiles()) break;
      const WorkTile w = s.tile(linear);
      EXPECT_TRUE(w.m_block >= 0 && w.m_block < s.num_m_blocks && w.head >= 0 && w.head < s.heads && w.batch >= 0 &&
                  w.batch < s.batch);
      ++count[(static_cast<size_t>(w.batch) * s.heads + w.head) * s.num_m_blocks + w.m_block];
    }
  }
  return count;
}

TEST(TileScheduler, EveryTileExactlyOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int m_blocks = 1 + static_cast<int>(rng() % 40), heads = 1 + static_cast<int>(rng() % 12);
    const int batch = 1 + static_cast<int>(rng() % 6), ctas = 1 + static_cast<int>(rng() % 140);
    const long long kv_heads = static_cast<long long>(rng() % 20);  // 0: one section
    const long long min_tiles = (rng() % 2 == 0) ? 0 : static_cast<long long>(rng() % 600);
    const TileScheduler s =
        TileScheduler::make(m_blocks, heads, batch, 1 + static_cast<int>(rng() % 4), kv_heads, min_tiles);
    ASSERT_GE(s.section_pairs, 1);
    ASSERT_LE(s.section_pairs, heads * batch);
    for (int c : visits(s, ctas)) ASSERT_EQ(c, 1) << "trial " << trial;
  }
}

TEST(TileScheduler, LongestFirstWithinASection) {
  // One section: the m_blocks come from the last to the first, each over all (batch, head) pairs.
  const TileScheduler s = TileScheduler::make(/*num_m_blocks=*/5, /*heads=*/3, /*batch=*/2, /*group=*/1,
                                              /*kv_heads_per_section=*/0, /*min_section_tiles=*/0);
  ASSERT_EQ(s.section_pairs, 6);
  for (int linear = 0; linear < s.total_tiles(); ++linear) EXPECT_EQ(s.tile(linear).m_block, 4 - linear / 6);
}

TEST(TileScheduler, SectionsHoldTheQueryHeadsOfTheirKvHeads) {
  EXPECT_EQ(TileScheduler::kv_heads_within(/*bytes=*/25LL << 20, /*kv_bytes_per_head=*/8LL << 20), 3);
  EXPECT_EQ(TileScheduler::kv_heads_within(1LL << 20, 8LL << 20), 1);  // at least one
  const TileScheduler s = TileScheduler::make(8, 16, 1, /*group=*/1, /*kv_heads_per_section=*/3, 0);
  EXPECT_EQ(s.section_pairs, 3);
  const TileScheduler gqa = TileScheduler::make(8, 16, 1, /*group=*/4, 3, 0);
  EXPECT_EQ(gqa.section_pairs, 12);  // query heads of a group share their K/V
  const TileScheduler padded = TileScheduler::make(8, 16, 1, 1, 3, /*min_section_tiles=*/40);
  EXPECT_EQ(padded.section_pairs, 5);  // at least 40 tiles of 8 m_blocks
}

TEST(TileScheduler, OneKvHeadPerSectionRunsTheMBlocksOfAHeadTogether) {
  const TileScheduler s = TileScheduler::make(/*num_m_blocks=*/4, /*heads=*/6, /*batch=*/2, /*group=*/2, 1, 0);
  for (int linear = 0; linear < s.total_tiles(); ++linear) {
    const WorkTile w = s.tile(linear);
    EXPECT_EQ(w.batch * 6 + w.head, linear / 8 * 2 + linear % 2);  // the two query heads of a KV head
    EXPECT_EQ(w.m_block, 3 - linear % 8 / 2);
  }
}

TEST(TileScheduler, ZigZagAlternatesDirection) {
  EXPECT_EQ(TileScheduler::linear_tile(0, 0, 10), 0);
  EXPECT_EQ(TileScheduler::linear_tile(1, 0, 10), 19);
  EXPECT_EQ(TileScheduler::linear_tile(2, 0, 10), 20);
  EXPECT_EQ(TileScheduler::linear_tile(1, 9, 10), 10);
}

}  // namespace
}  // namespace hopattn
