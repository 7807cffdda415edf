// Persistent tile scheduler: a grid of at most one CTA per SM working through one linear order of
// tiles. Statically, each CTA takes one tile of every round of gridDim.x tiles, in a zig-zag: CTA
// c takes position c of even rounds and position gridDim.x - 1 - c of odd ones. Tiles come
// longest first, so each CTA pairs a longer tile with a shorter one and the CTAs finish together
// (plain round-robin would give CTA 0 the longest tile of every round). Dynamically (the forward
// with a workspace, where tile lengths vary), a CTA takes the next tile of the order from a
// counter once it is ready for one (forward_tile_publisher), which balances any mix of lengths.
//
// The order serves two goals. Longest first: within a section, tiles go from the last m_block to
// the first, each m_block over the section's (batch, head) pairs, and under a causal mask
// (bottom-right aligned) the last query blocks see the most keys, so the short tiles form the
// tail. L2 reuse: a section's tiles run together, so each K/V tile is read from HBM about once
// however many query blocks share it. The launch sizes the sections (make_forward_params).
//
// Split tail (stream-K): where every tile has the same key blocks (no mask, fixed lengths) and the
// tiles do not fill the last round, that round would leave most SMs idle (2048 tiles on 132 SMs:
// 15 full rounds and 68 tiles, 3% of the run). Instead its tiles' key blocks are dealt to every
// CTA in equal runs of consecutive blocks, so each tile is split along its keys into a few pieces
// on consecutive CTAs. The last CTA of a tile (its owner) merges the others' partial O and LSE,
// which they leave in a workspace slot of their own, into its result (see fwd_tail_merge.cuh). A
// CTA's run covers at most two tiles: it owns the first, and writes at most one partial, which it
// does first, so that no owner waits for a CTA that is itself waiting.
//
// Key splits (split-KV, for decode: fewer tiles than SMs): each tile of the order becomes
// key_splits consecutive pieces (piece = linear % key_splits), which cover its key blocks between
// them and leave their partials for a combine kernel (fwd_split_plan.hpp). A split problem has no
// split tail.
#pragma once

#include "kernels/common/fast_divisor.hpp"
#include "kernels/common/host_device.hpp"

namespace hopattn {

struct WorkTile {
  int m_block = 0;
  int head = 0;  // the tile's head: a KV head where the tile packs a GQA group's query heads
  int batch = 0;
  int split = 0;  // the piece of the tile's keys, < key_splits
};

// A piece of a split tile: what its CTA does with the result.
struct TailPiece {
  int partial_slot = -1;  // >= 0: leave O and LSE in this workspace slot for the owner (not stored)
  int merge_first = 0;    // the owner merges the slots [merge_first, merge_first + merge_count)
  int merge_count = 0;

  HOPATTN_HOST_DEVICE bool writes_partial() const { return partial_slot >= 0; }
};

// What a CTA does in one round: tile `linear` (>= total_tiles(): the CTA is done) and, for a piece
// of a split tile (TileScheduler::split), the key blocks [key_begin, key_end) of it counted from
// its first one, and its role.
struct ScheduledTile {
  int linear = 0;
  int key_begin = 0;
  int key_end = 0;
  TailPiece piece;
};

// The split tail: tiles from first_tile on (the last, partial round) are dealt out as runs of
// units_per_cta key blocks; key_blocks is every tile's count. units_per_cta == 0: no split.
struct TailSplit {
  int first_tile = 0;
  int key_blocks = 0;
  int units_per_cta = 0;

  HOPATTN_HOST_DEVICE bool enabled() const { return units_per_cta > 0; }

  // Runs are at least a quarter of a tile: each piece pays the tile's fixed costs again, and its
  // owner reads every other piece's partial.
  static constexpr int kMaxRunsPerTile = 4;
  // What the split costs, in key blocks that it must save: a second tile start on most CTAs, the
  // partials' round trip through L2 and the owners' waits came to about 7 blocks at d128 on the
  // H200 (2k keys: 16 blocks -> runs of 9, level; 4k: 32 -> 17, +1.5%; docs/perf-log.md).
  static constexpr int kMinSavedKeyBlocks = 12;

  // The split for `tiles` tiles of `key_blocks` blocks each on `ctas` CTAs, or none where it would
  // not shorten the last round by a quarter of a tile and kMinSavedKeyBlocks.
  static TailSplit choose(long long tiles, int key_blocks, int ctas) {
    TailSplit t;
    const long long tail_tiles = ctas > 0 ? tiles % ctas : 0;
    if (tail_tiles == 0 || key_blocks < 2) return t;
    const long long units = tail_tiles * key_blocks;
    if (units > (1LL << 30)) return t;  // the device side counts units in int
    long long run = (units + ctas - 1) / ctas;
    const long long shortest = (key_blocks + kMaxRunsPerTile - 1) / kMaxRunsPerTile;
    if (run < shortest) run = shortest;
    if (4 * run > 3LL * key_blocks || key_blocks - run < kMinSavedKeyBlocks) return t;
    t.first_tile = static_cast<int>(tiles - tail_tiles);
    t.key_blocks = key_blocks;
    t.units_per_cta = static_cast<int>(run);
    return t;
  }
};

// Made by make(), its key splits set by split_keys(). tile() divides by precomputed divisors
// (fast_divisor.hpp); the counts it divides by are kept only there, so they cannot drift apart.
struct TileScheduler {
  int num_m_blocks = 0;  // blocks of the longest query sequence
  int batch = 0;
  // L2 sections of (batch, head) pairs, in order: wide_sections of wide_pairs() pairs, then the
  // others of narrow_pairs() (see make()).
  int wide_sections = 1;
  TailSplit tail;
  // By the heads, the group (of the heads, how many share a KV head; 1 where a tile packs a GQA
  // group), the key splits, the pairs of each kind of section and the tiles of each.
  FastDivisor by_heads, by_group, by_key_splits, by_wide_pairs, by_narrow_pairs, by_wide_tiles, by_narrow_tiles;

  HOPATTN_HOST_DEVICE int heads() const { return by_heads.divisor(); }
  HOPATTN_HOST_DEVICE int group() const { return by_group.divisor(); }
  HOPATTN_HOST_DEVICE int key_splits() const { return by_key_splits.divisor(); }
  HOPATTN_HOST_DEVICE int wide_pairs() const { return by_wide_pairs.divisor(); }
  HOPATTN_HOST_DEVICE int narrow_pairs() const { return by_narrow_pairs.divisor(); }

  void split_keys(int splits) { by_key_splits = FastDivisor(splits); }

  HOPATTN_HOST_DEVICE int total_tiles() const { return num_m_blocks * heads() * batch * key_splits(); }

  // The linear tile that CTA `cta` of `ctas` takes in round `round` without a split tail;
  // >= total_tiles() once the CTA is done (rounds only grow).
  HOPATTN_HOST_DEVICE static int linear_tile(int round, int cta, int ctas) {
    return round * ctas + (round % 2 == 0 ? cta : ctas - 1 - cta);
  }

  // Whether tile `linear` is split along its keys (it is in the split tail).
  HOPATTN_HOST_DEVICE bool split(int linear) const { return tail.enabled() && linear >= tail.first_tile; }

  // What CTA `cta` of `ctas` does in round `round`, split tail included.
  HOPATTN_HOST_DEVICE ScheduledTile scheduled(int round, int cta, int ctas) const {
    ScheduledTile s;
    const int full_rounds = tail.first_tile / ctas;
    if (!tail.enabled() || round < full_rounds) {
      s.linear = linear_tile(round, cta, ctas);
      return s;
    }
    const int nb = tail.key_blocks;
    const int units = (total_tiles() - tail.first_tile) * nb;
    const int run_begin = cta * tail.units_per_cta;
    const int run_end = run_begin + tail.units_per_cta < units ? run_begin + tail.units_per_cta : units;
    // The run's last tile first: there the CTA writes a partial (unless it owns the tile), and only
    // then its first tile, which it owns and where it waits for the others' partials. The other
    // order chains the CTAs: each owner would wait for a CTA that first waits for its own writers.
    const int last_tile = (run_end - 1) / nb;
    const int tile = last_tile - (round - full_rounds);
    if (run_begin >= units || tile < run_begin / nb) {
      s.linear = total_tiles();
      return s;
    }
    s.linear = tail.first_tile + tile;
    s.key_begin = (run_begin > tile * nb ? run_begin : tile * nb) - tile * nb;
    s.key_end = (run_end < (tile + 1) * nb ? run_end : (tile + 1) * nb) - tile * nb;
    const int first_cta = tile * nb / tail.units_per_cta;
    const int owner = ((tile + 1) * nb - 1) / tail.units_per_cta;
    if (cta == owner) {
      s.piece.merge_first = first_cta;
      s.piece.merge_count = owner - first_cta;
    } else {
      s.piece.partial_slot = cta;
    }
    return s;
  }

  HOPATTN_HOST_DEVICE WorkTile tile(int linear) const {
    WorkTile w;
    const int unsplit = by_key_splits.divide(linear);
    w.split = linear - unsplit * key_splits();
    linear = unsplit;
    const int in_wide = wide_sections * by_wide_tiles.divisor();
    // A section's tiles go over its pairs for each m_block in turn, from the last m_block down:
    // `step` m_blocks below the last, and first_pair, the section's first (batch, head) pair,
    // ends as the tile's own.
    int first_pair = 0, in_section = 0, step = 0;
    if (linear < in_wide) {
      const int section = by_wide_tiles.divide(linear);
      first_pair = section * by_wide_pairs.divisor();
      in_section = linear - section * by_wide_tiles.divisor();
      step = by_wide_pairs.divide(in_section);
      first_pair += in_section - step * by_wide_pairs.divisor();
    } else {  // linear < total_tiles(): narrow_pairs > 0
      const int section = by_narrow_tiles.divide(linear - in_wide);
      first_pair = wide_sections * by_wide_pairs.divisor() + section * by_narrow_pairs.divisor();
      in_section = linear - in_wide - section * by_narrow_tiles.divisor();
      step = by_narrow_pairs.divide(in_section);
      first_pair += in_section - step * by_narrow_pairs.divisor();
    }
    w.m_block = num_m_blocks - 1 - step;
    w.batch = by_heads.divide(first_pair);
    w.head = first_pair - w.batch * heads();
    return w;
  }

  // group: query heads per KV head; kv_heads_per_section: KV heads whose query heads form one
  // section (<= 0: every pair in one section, a single longest-first order); min_section_tiles: a
  // section holds at least this many tiles (0: no minimum). The sections hold that many pairs and
  // the last one the rest, or, with `equal_sections`, as many sections as that needs share the
  // KV heads evenly (a dynamic schedule's CTAs run out of work together only if the last section is
  // as long as the others; the static zig-zag wants sections of whole rounds instead).
  static TileScheduler make(int num_m_blocks, int heads, int batch, int group, long long kv_heads_per_section,
                            long long min_section_tiles, bool equal_sections = false) {
    const long long all_pairs = static_cast<long long>(heads) * batch;
    long long pairs = kv_heads_per_section > 0 ? kv_heads_per_section * group : all_pairs;
    if (num_m_blocks > 0 && pairs * num_m_blocks < min_section_tiles) {
      pairs = (min_section_tiles + num_m_blocks - 1) / num_m_blocks;
    }
    pairs = pairs < all_pairs ? pairs : (all_pairs > 0 ? all_pairs : 1);
    long long wide_pairs = pairs, wide_sections = all_pairs / pairs, narrow_pairs = all_pairs % pairs;
    if (equal_sections && all_pairs > 0) {
      const long long kv_heads = all_pairs / group;
      const long long kv_heads_per = (pairs + group - 1) / group;
      const long long sections = (kv_heads + kv_heads_per - 1) / kv_heads_per;
      wide_pairs = (kv_heads / sections + 1) * group;
      wide_sections = kv_heads % sections;
      narrow_pairs = kv_heads / sections * group;
    }
    TileScheduler s;
    s.num_m_blocks = num_m_blocks;
    s.batch = batch;
    s.wide_sections = static_cast<int>(wide_sections);
    s.by_heads = FastDivisor(heads);
    s.by_group = FastDivisor(group);
    s.by_wide_pairs = FastDivisor(static_cast<int>(wide_pairs));
    s.by_narrow_pairs = FastDivisor(static_cast<int>(narrow_pairs));
    s.by_wide_tiles = FastDivisor(static_cast<int>(wide_pairs) * num_m_blocks);
    s.by_narrow_tiles = FastDivisor(static_cast<int>(narrow_pairs) * num_m_blocks);
    return s;
  }

  // How many KV heads' K and V fit in `bytes` (at least one).
  static long long kv_heads_within(long long bytes, long long kv_bytes_per_head) {
    const long long n = kv_bytes_per_head > 0 ? bytes / kv_bytes_per_head : 1;
    return n > 1 ? n : 1;
  }
};

}  // namespace hopattn
