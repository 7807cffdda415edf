// Static persistent tile scheduler: a grid of at most one CTA per SM, each CTA taking one tile of
// every round of gridDim.x tiles of one linear order, in a zig-zag: CTA c takes position c of
// even rounds and position gridDim.x - 1 - c of odd ones. Tiles come longest first, so each CTA
// pairs a longer tile with a shorter one and the CTAs finish together (plain round-robin would
// give CTA 0 the longest tile of every round).
//
// The order serves two goals. Longest first: within a section, tiles go from the last m_block to
// the first, each m_block over the section's (batch, head) pairs, and under a causal mask
// (bottom-right aligned) the last query blocks see the most keys, so the short tiles form the
// tail. L2 reuse: a section's tiles run together, so each K/V tile is read from HBM about once
// however many query blocks share it. The launch sizes the sections (make_forward_params).
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

  // group: query heads per KV head; kv_heads_per_section: KV heads whose query heads form one
  // section (<= 0: every pair in one section, a single longest-first order); min_section_tiles: a
  // section holds at least this many tiles (0: no minimum).
  static TileScheduler make(int num_m_blocks, int heads, int batch, int group, long long kv_heads_per_section,
                            long long min_section_tiles) {
    TileScheduler s;
    s.num_m_blocks = num_m_blocks;
    s.heads = heads;
    s.batch = batch;
    const long long all_pairs = static_cast<long long>(heads) * batch;
    long long pairs = kv_heads_per_section > 0 ? kv_heads_per_section * group : all_pairs;
    if (num_m_blocks > 0 && pairs * num_m_blocks < min_section_tiles) {
      pairs = (min_section_tiles + num_m_blocks - 1) / num_m_blocks;
    }
    s.section_pairs = static_cast<int>(pairs < all_pairs ? pairs : (all_pairs > 0 ? all_pairs : 1));
    return s;
  }

  // How many KV heads' K and V fit in `bytes` (at least one).
  static long long kv_heads_within(long long bytes, long long kv_bytes_per_head) {
    const long long n = kv_bytes_per_head > 0 ? bytes / kv_bytes_per_head : 1;
    return n > 1 ? n : 1;
  }
};

}  // namespace hopattn
