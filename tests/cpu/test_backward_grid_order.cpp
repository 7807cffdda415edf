// The backward grid's order (bwd_grid_order.hpp): every (key block, unit) pair gets exactly one
// CTA, and in deterministic mode every CTA that a CTA waits for comes earlier in the grid, so the
// waits end however few CTAs the GPU holds at once: key block n + 1 of its unit (dQ order) and
// the previous slice of its key block (dK/dV order; the previous unit).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/bwd/bwd_grid_order.hpp"

namespace hopattn {
namespace {

// position[n][unit] = grid index of the pair's CTA, -1 if none; fails on a pair visited twice.
std::vector<std::vector<long long>> positions(int key_blocks, int units, bool deterministic, int section_units) {
  std::vector<std::vector<long long>> position(key_blocks, std::vector<long long>(units, -1));
  for (long long i = 0; i < static_cast<long long>(key_blocks) * units; ++i) {
    const BackwardGridCoord c = backward_grid_coord(i, key_blocks, units, deterministic, section_units);
    EXPECT_GE(c.n_block, 0);
    EXPECT_LT(c.n_block, key_blocks);
    EXPECT_GE(c.unit, 0);
    EXPECT_LT(c.unit, units);
    if (c.n_block < 0 || c.n_block >= key_blocks || c.unit < 0 || c.unit >= units) continue;
    EXPECT_EQ(position[c.n_block][c.unit], -1) << "pair visited twice at index " << i;
    position[c.n_block][c.unit] = i;
  }
  return position;
}

TEST(BackwardGridOrder, EveryPairOnceAndDeterministicWaitsPointBackwards) {
  for (int key_blocks : {1, 2, 7, 16, 64}) {
    for (int units : {1, 3, 8, 17}) {
      for (int section_units : {1, 2, 5, 8, 17, 100}) {
        const int sections = section_units < units ? section_units : units;
        SCOPED_TRACE(testing::Message() << key_blocks << " key blocks, " << units << " units, " << sections
                                        << " per section");
        for (bool deterministic : {false, true}) {
          const auto position = positions(key_blocks, units, deterministic, sections);
          for (const auto& row : position) {
            for (long long p : row) EXPECT_GE(p, 0) << "pair without a CTA";
          }
          if (!deterministic) continue;
          for (int n = 0; n < key_blocks; ++n) {
            for (int u = 0; u < units; ++u) {
              if (n + 1 < key_blocks) EXPECT_LT(position[n + 1][u], position[n][u]);
              if (u > 0) EXPECT_LT(position[n][u - 1], position[n][u]);
            }
          }
        }
      }
    }
  }
}

TEST(BackwardGridOrder, DeterministicWavesHoldTheTopKeyBlocksOfASection) {
  // 4 units per section, 16 key blocks: the first 8 CTAs are key blocks 15 and 14 of units 0-3.
  for (int i = 0; i < 8; ++i) {
    const BackwardGridCoord c = backward_grid_coord(i, 16, 8, true, 4);
    EXPECT_EQ(c.n_block, 15 - i / 4);
    EXPECT_EQ(c.unit, i % 4);
  }
  const BackwardGridCoord next_section = backward_grid_coord(64, 16, 8, true, 4);
  EXPECT_EQ(next_section.n_block, 15);
  EXPECT_EQ(next_section.unit, 4);
}

TEST(BackwardGridOrder, SectionUnitsFitL2) {
  EXPECT_EQ(backward_section_units(3 << 20, 50 << 20, 128), 16);
  EXPECT_EQ(backward_section_units(24 << 20, 50 << 20, 128), 2);
  EXPECT_EQ(backward_section_units(80 << 20, 50 << 20, 128), 1) << "at least one unit";
  EXPECT_EQ(backward_section_units(1 << 20, 50 << 20, 8), 8) << "at most every unit";
  EXPECT_EQ(backward_section_units(1 << 20, 0, 8), 1) << "unknown L2 size";
}

}  // namespace
}  // namespace hopattn
