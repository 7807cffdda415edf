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
      EXPECT_TRUE(w.m_block >= 0 && w.m_block < s.num_m_blocks && w.head >= 0 && w.head < s.heads() && w.batch >= 0 &&
                  w.batch < s.batch);
      ++count[(static_cast<size_t>(w.batch) * s.heads() + w.head) * s.num_m_blocks + w.m_block];
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
    ASSERT_GE(s.wide_pairs(), 1);
    ASSERT_LE(s.wide_pairs(), heads * batch);
    for (int c : visits(s, ctas)) ASSERT_EQ(c, 1) << "trial " << trial;
  }
}

TEST(TileScheduler, LongestFirstWithinASection) {
  // One section: the m_blocks come from the last to the first, each over all (batch, head) pairs.
  const TileScheduler s = TileScheduler::make(/*num_m_blocks=*/5, /*heads=*/3, /*batch=*/2, /*group=*/1,
                                              /*kv_heads_per_section=*/0, /*min_section_tiles=*/0);
  ASSERT_EQ(s.wide_pairs(), 6);
  for (int linear = 0; linear < s.total_tiles(); ++linear) EXPECT_EQ(s.tile(linear).m_block, 4 - linear / 6);
}

TEST(TileScheduler, SectionsHoldTheQueryHeadsOfTheirKvHeads) {
  EXPECT_EQ(TileScheduler::kv_heads_within(/*bytes=*/25LL << 20, /*kv_bytes_per_head=*/8LL << 20), 3);
  EXPECT_EQ(TileScheduler::kv_heads_within(1LL << 20, 8LL << 20), 1);  // at least one
  const TileScheduler s = TileScheduler::make(8, 16, 1, /*group=*/1, /*kv_heads_per_section=*/3, 0);
  EXPECT_EQ(s.wide_pairs(), 3);
  EXPECT_EQ(s.wide_sections, 5);
  EXPECT_EQ(s.narrow_pairs(), 1);  // the rest
  const TileScheduler gqa = TileScheduler::make(8, 16, 1, /*group=*/4, 3, 0);
  EXPECT_EQ(gqa.wide_pairs(), 12);  // query heads of a group share their K/V
  const TileScheduler padded = TileScheduler::make(8, 16, 1, 1, 3, /*min_section_tiles=*/40);
  EXPECT_EQ(padded.wide_pairs(), 5);  // at least 40 tiles of 8 m_blocks
}

// Equal sections: as many as the size limit needs, sharing the KV heads evenly (the first ones
// one KV head more), each holding whole KV heads.
TEST(TileScheduler, EqualSectionsShareTheKvHeadsEvenly) {
  const TileScheduler s = TileScheduler::make(32, 16, 4, /*group=*/1, /*kv_heads_per_section=*/12,
                                              /*min_section_tiles=*/528, /*equal_sections=*/true);
  EXPECT_EQ(s.wide_sections, 0);  // 64 pairs, at most 17 a section: 4 sections of 16
  EXPECT_EQ(s.narrow_pairs(), 16);
  const TileScheduler uneven = TileScheduler::make(8, 10, 1, 1, 4, 0, true);
  EXPECT_EQ(uneven.wide_sections, 1);  // 10 pairs, at most 4 a section: 4, 3, 3
  EXPECT_EQ(uneven.wide_pairs(), 4);
  EXPECT_EQ(uneven.narrow_pairs(), 3);
  const TileScheduler gqa = TileScheduler::make(8, 12, 1, /*group=*/2, 2, 0, true);
  EXPECT_EQ(gqa.wide_sections, 0);  // 6 KV heads, at most 2 a section: 3 sections of 2 KV heads
  EXPECT_EQ(gqa.narrow_pairs(), 4);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int group = 1 + static_cast<int>(rng() % 4);
    const TileScheduler r = TileScheduler::make(1 + static_cast<int>(rng() % 40), group * (1 + static_cast<int>(rng() % 6)),
                                                1 + static_cast<int>(rng() % 6), group,
                                                static_cast<long long>(rng() % 8), static_cast<long long>(rng() % 600), true);
    EXPECT_EQ(r.wide_pairs() % group, 0);
    EXPECT_EQ(r.narrow_pairs() % group, 0);
    if (r.narrow_pairs() > 0) EXPECT_EQ(r.wide_pairs(), r.narrow_pairs() + group);
    for (int c : visits(r, 1 + static_cast<int>(rng() % 140))) ASSERT_EQ(c, 1) << "trial " << trial;
  }
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

// The split tail: with scheduled() as the kernels run it, every key block of every tile is
// visited exactly once; each piece of a split tile but the last goes to a slot of its own CTA, the
// last one (on a later CTA) merges exactly the others; a CTA writes at most one partial, and before
// it waits for any.
TEST(TileScheduler, SplitTailCoversEveryKeyBlockOnce) {
  std::mt19937 rng(11);
  int splits = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int ctas = 1 + static_cast<int>(rng() % 140);
    const int key_blocks = 1 + static_cast<int>(rng() % 80);
    TileScheduler s = TileScheduler::make(1 + static_cast<int>(rng() % 20), 1 + static_cast<int>(rng() % 8),
                                          1 + static_cast<int>(rng() % 4), 1, 1, 0);
    s.tail = TailSplit::choose(s.total_tiles(), key_blocks, ctas);
    if (!s.tail.enabled()) continue;
    ++splits;
    ASSERT_LE(4 * s.tail.units_per_cta, 3 * key_blocks);
    std::vector<int> seen(static_cast<size_t>(s.total_tiles()) * key_blocks, 0);
    std::vector<int> partials_per_cta(ctas, 0);
    std::vector<std::vector<int>> writers(s.total_tiles()), merged(s.total_tiles());
    for (int cta = 0; cta < ctas; ++cta) {
      bool owned = false;
      for (int round = 0;; ++round) {
        const ScheduledTile t = s.scheduled(round, cta, ctas);
        if (t.linear >= s.total_tiles()) break;
        const bool piece = s.split(t.linear);
        const int begin = piece ? t.key_begin : 0, end = piece ? t.key_end : key_blocks;
        ASSERT_TRUE(begin >= 0 && begin < end && end <= key_blocks) << begin << " " << end;
        for (int n = begin; n < end; ++n) ++seen[static_cast<size_t>(t.linear) * key_blocks + n];
        if (!piece) {
          EXPECT_FALSE(t.piece.writes_partial());
          EXPECT_EQ(t.piece.merge_count, 0);
        } else if (t.piece.writes_partial()) {
          EXPECT_EQ(t.piece.partial_slot, cta);
          EXPECT_FALSE(owned) << "a CTA writes its partial before it waits as an owner";
          ++partials_per_cta[cta];
          writers[t.linear].push_back(cta);
        } else {
          owned = true;
          for (int i = 0; i < t.piece.merge_count; ++i) merged[t.linear].push_back(t.piece.merge_first + i);
          for (int slot : merged[t.linear]) EXPECT_LT(slot, cta) << "an owner waits only on earlier CTAs";
        }
      }
    }
    for (int count : seen) ASSERT_EQ(count, 1);
    for (int count : partials_per_cta) EXPECT_LE(count, 1);
    for (int tile = s.tail.first_tile; tile < s.total_tiles(); ++tile) EXPECT_EQ(writers[tile], merged[tile]);
  }
  EXPECT_GT(splits, 50);
}

// The sweep's d128 shape at 4k keys: 2048 tiles of 32 key blocks on 132 SMs leave 68 tiles for
// the last round, dealt as runs of 17 key blocks (15 + 17/32 rounds instead of 16). At 2k keys
// (16 blocks, runs of 9) the split would save too little to pay.
TEST(TileScheduler, SplitTailOfTheStandardProblem) {
  const TailSplit t = TailSplit::choose(2048, 32, 132);
  EXPECT_EQ(t.first_tile, 1980);
  EXPECT_EQ(t.units_per_cta, 17);
  EXPECT_FALSE(TailSplit::choose(2048, 16, 132).enabled());
  EXPECT_FALSE(TailSplit::choose(2112, 32, 132).enabled());            // whole rounds
  EXPECT_FALSE(TailSplit::choose(15 * 132 + 120, 32, 132).enabled());  // a nearly full last round
  EXPECT_EQ(TailSplit::choose(4, 64, 132).units_per_cta, 16);          // at most about four pieces a tile
}

}  // namespace
}  // namespace hopattn
