// Static persistent tile scheduler: a grid of at most one CTA per SM, each CTA taking one tile of
// every round of gridDim.x tiles of one linear order, in a zig-zag: CTA c takes position c of
// even rounds and position gridDim.x - 1 - c of odd ones. Tiles come longest first, so each CTA
// pairs a longer tile with a shorter one and the CTAs finish together (plain round-robin would
// give CTA 0 the longest tile of every round).
//
// The order serves two goals. Longest first: within a section, tiles go from the last m_block to
// the first, and under a causal mask (bottom-right aligned) the last query blocks see the most
// keys, so the short tiles form the tail. L2 reuse: (batch, head) pairs are grouped into sections
// whose K and V fit in about half of L2, and a section's tiles run together, so each K/V tile is
// read from HBM about once however many query blocks share it.
#pragma once

#include "kernels/common/host_device.hpp"

namespace hopattn {

struct WorkTile {
  int m_block = 0;
  int head = 0;
  int batch = 0;
};

struct TileScheduler {
  int num_m_blocks = 0;  // blocks of the longest query sequence
  int heads = 0;
  int batch = 0;
  int section_pairs = 1;  // (batch, head) pairs per L2 section

  HOPATTN_HOST_DEVICE int total_tiles() const { return num_m_blocks * heads * batch; }

  // The linear tile that CTA `cta` of `ctas` takes in round `round`; >= total_tiles() once the CTA
  // is done (rounds only grow).
  HOPATTN_HOST_DEVICE static int linear_tile(int round, int cta, int ctas) {
    return round * ctas + (round % 2 == 0 ? cta : ctas - 1 - cta);
  }

  HOPATTN_HOST_DEVICE WorkTile tile(int linear) const {
    const int tiles_per_section = section_pairs * num_m_blocks;
    const int section = linear / tiles_per_section;
    const int in_section = linear - section * tiles_per_section;
    const int first_pair = section * section_pairs;
    const int pairs_left = heads * batch - first_pair;
    const int pairs = pairs_left < section_pairs ? pairs_left : section_pairs;
    const int pair = first_pair + in_section % pairs;
    WorkTile w;
    w.m_block = num_m_blocks - 1 - in_section / pairs;
    w.head = pair % heads;
    w.batch = pair / heads;
    return w;
  }

  // kv_bytes_per_head: K and V bytes one KV head's sequence occupies (0: a single section, one
  // longest-first order over all tiles); group: query heads per KV head; min_section_tiles: a
  // section holds at least this many tiles (0: no minimum).
  static TileScheduler make(int num_m_blocks, int heads, int batch, long long kv_bytes_per_head, int group,
                            long long l2_bytes, long long min_section_tiles) {
    TileScheduler s;
    s.num_m_blocks = num_m_blocks;
    s.heads = heads;
    s.batch = batch;
    const long long all_pairs = static_cast<long long>(heads) * batch;
    long long kv_heads = kv_bytes_per_head > 0 ? (l2_bytes / 2) / kv_bytes_per_head : all_pairs;
    if (kv_heads < 1) kv_heads = 1;
    long long pairs = kv_heads * group;
    if (num_m_blocks > 0 && pairs * num_m_blocks < min_section_tiles) {
      pairs = (min_section_tiles + num_m_blocks - 1) / num_m_blocks;
    }
    s.section_pairs = static_cast<int>(pairs < all_pairs ? pairs : (all_pairs > 0 ? all_pairs : 1));
    return s;
  }
};

}  // namespace hopattn
