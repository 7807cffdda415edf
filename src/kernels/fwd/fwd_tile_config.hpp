// Tile shapes and pipeline orders of the forward kernel per head dim: chosen from measurements on
// the H200 (see docs/perf-log.md), starting from FlashAttention-3's published choices. Above d64
// they were measured while V still took one TMA box per swizzle atom (before 54383db), when the
// producer could not keep the ring ahead; they are due for a second round.
#pragma once

#include <type_traits>

namespace hopattn {

// kBlockM: query rows per CTA (64 per consumer warpgroup); kBlockN: keys per pipeline stage;
// kStages: depth of the K and V rings.
// kKeysAhead: the producer loads K of block n - 1 before V of block n (the order the consumers use
// them) instead of K and V of a block together. With two stages the consumers' next S GEMM then
// does not wait behind a V load; with three it made the producer wait for a free K stage while
// the V needed next was not yet requested (3% at d128 16k).
// kRescaleUnderQK: O's rescale by the new row maxima runs under the next S GEMM, before P V reads
// O, instead of right after the P V wait. Hidden, but it delays the warpgroup's P V issue while it
// holds the ping-pong turn (3% at d128 16k); it paid at d256 only while d256 still took turns.
// ping_pong: the consumer warpgroups take turns issuing their GEMMs (named barriers), so that one
// warpgroup's softmax runs under the other's GEMMs. Where a block's GEMMs are long against its
// softmax (d > 128), the turns only hold back GEMMs the tensor cores could already queue.
struct ForwardTileShape {
  int block_m, block_n, stages;
  bool keys_ahead, rescale_under_qk, ping_pong;

  constexpr bool operator==(const ForwardTileShape& o) const {
    return block_m == o.block_m && block_n == o.block_n && stages == o.stages && keys_ahead == o.keys_ahead &&
           rescale_under_qk == o.rescale_under_qk && ping_pong == o.ping_pong;
  }
};

// Keyed by the head dims of Q/K and of V; a pair without a tile of its own takes that of its Q/K
// head dim.
template <int kHeadDim, int kHeadDimV = kHeadDim>
struct ForwardTileConfig : ForwardTileConfig<kHeadDim> {};

template <>
struct ForwardTileConfig<64> {
  static constexpr ForwardTileShape kShape{192, 128, 3, false, false, true};
};
template <>
struct ForwardTileConfig<96> {
  static constexpr ForwardTileShape kShape{128, 128, 3, false, false, true};
};
template <>
struct ForwardTileConfig<128> {
  // A third K/V stage gained 3-5% over two; FA4's choice (two stages, K ahead) measured 1% below.
  static constexpr ForwardTileShape kShape{128, 128, 3, false, false, true};
};
template <>
struct ForwardTileConfig<192> {
  static constexpr ForwardTileShape kShape{128, 96, 2, true, true, false};
};
template <>
struct ForwardTileConfig<192, 128> {
  // FlashAttention-3's choice for this pair: V's smaller blocks leave room for 128 keys a stage.
  static constexpr ForwardTileShape kShape{128, 128, 2, true, true, false};
};
template <>
struct ForwardTileConfig<256> {
  // Without ping-pong, O's rescale right after the P V wait measured 1% faster than under the S GEMM.
  static constexpr ForwardTileShape kShape{128, 80, 2, true, false, false};
};

// Tiles for problems without a causal or local mask, where every key block is full: by default
// the same as above. Where they differ, launch_forward_kernel uses them only where their last key
// block wastes little (wider_key_blocks_pay).
template <int kHeadDim>
struct ForwardUnmaskedTileConfig : ForwardTileConfig<kHeadDim> {};
template <>
struct ForwardUnmaskedTileConfig<128> {
  // FA3's non-causal choice: fewer, wider key blocks per tile spread each block's fixed costs
  // (barrier waits, row max/sum bookkeeping) over more tensor core work. Under a causal mask
  // 176 keys lost 7-20% at 1k-2k (a diagonal block masks more of its work). O's rescale after
  // the P V wait, as in the 128-key tile, measured 1% faster at 8k-16k than under the S GEMM.
  static constexpr ForwardTileShape kShape{128, 176, 2, true, false, true};
};

// Tiles whose rows pack the query heads of a GQA group (decode, fwd_split_plan.hpp): by default
// the any-mask tile's shape. At d64 the 192-row tile's three warpgroups (160 registers each)
// spilled in the packed kernel's loop (its mask divides each row by the pack); two warpgroups
// with 240 registers do not, and a decode tile's rows are mostly padding anyway.
template <int kHeadDim>
struct ForwardPackedTileConfig : ForwardTileConfig<kHeadDim> {};
template <>
struct ForwardPackedTileConfig<64> {
  static constexpr ForwardTileShape kShape{128, 128, 3, false, false, true};
};
template <>
struct ForwardPackedTileConfig<256> {
  static constexpr ForwardTileShape kShape{128, 64, 2, true, false, false};
};

// Packed tiles of at most 64 rows (decode with a query row or a few per head of a small group:
// 32/1 and 32/8 at one query row pack 32 and 4 rows): one consumer warpgroup, the packed tile's
// keys and stages otherwise. In the 128-row tile the second warpgroup computed padding only; a
// clock trace of MQA decode (H100) had a key block take 1.7 us of GEMMs and softmax, with its
// K/V waits 0.16 us of a 5.2 us main loop.
template <int kHeadDim>
struct ForwardPackedNarrowTileConfig {
  static constexpr ForwardTileShape kWide = ForwardPackedTileConfig<kHeadDim>::kShape;
  static constexpr ForwardTileShape kShape{64, kWide.block_n, kWide.stages, kWide.keys_ahead, kWide.rescale_under_qk,
                                           false};
};

// The narrow tile for paged caches of 64-key pages where its own blocks are larger (128 keys up
// to d128): 64-key blocks, so that each is one page and one TMA copy, and twice the stages (the
// same bytes in flight), for the whole-key-blocks form (WholeKeyBlocksTileConfig). With 128-key
// blocks such a cache takes the page-box paths, whose larger kernel ran 32/8 decode (32k keys,
// batch 1, H100) at 0.90-0.91 of the contiguous step.
inline constexpr int kNarrowPageKeys = 64;
template <int kHeadDim>
struct ForwardPackedNarrowPageTileConfig : ForwardPackedNarrowTileConfig<kHeadDim> {
  static constexpr ForwardTileShape kNarrow = ForwardPackedNarrowTileConfig<kHeadDim>::kShape;
  static constexpr ForwardTileShape kShape{64, kNarrowPageKeys, kNarrow.stages * kNarrow.block_n / kNarrowPageKeys,
                                           kNarrow.keys_ahead, kNarrow.rescale_under_qk, false};
};
// Where decode takes it: head dims whose narrow tile's blocks are whole multiples of 64 keys above
// 64 (d64, d96 and d128 are 128), and of those d128 only, the one whose kernel has run on a GPU
// (H100, bf16); the d64/d96 forms build without spills.
template <int kHeadDim>
inline constexpr bool kHasNarrowPageTile =
    kHeadDim == 128 && ForwardPackedNarrowTileConfig<kHeadDim>::kShape.block_n > kNarrowPageKeys &&
    ForwardPackedNarrowTileConfig<kHeadDim>::kShape.block_n % kNarrowPageKeys == 0;

// The softcap variant's any-mask tile (ScoreVariant::kSoftcap): by default the same. At d64 the
// 192-row tile's three warpgroups (160 registers each) spilled 28 values in the main loop around
// the tanh; two warpgroups with 240 registers do not.
template <int kHeadDim>
struct ForwardSoftcapTileConfig : ForwardTileConfig<kHeadDim> {};
template <>
struct ForwardSoftcapTileConfig<64> {
  static constexpr ForwardTileShape kShape{128, 128, 3, false, false, true};
};

// FP8 (e4m3) inputs: every tile's keys a multiple of 32 (one FP8 WGMMA K step). At d256 the
// bf16 tile's 80 keys are not; FP8's half-size K/V stages fit 128 keys (FlashAttention-3's
// choice), 5-7% faster than 96 at 4k-16k on the H100. At d128, 192 or 224 keys a block (two
// stages, K ahead) measured 2-3% faster at 8k-16k but 2-3% slower at 4k: not taken.
template <int kHeadDim>
struct ForwardFp8TileConfig : ForwardTileConfig<kHeadDim> {};
template <>
struct ForwardFp8TileConfig<256> {
  static constexpr ForwardTileShape kShape{128, 128, 2, true, false, false};
};
// At d192, 128 keys too (the bf16 tile's 96 are whole K steps, but the V transposition and paged
// FP8 caches take blocks of 128: kFp8KeyBlock): the (192, 128) bf16 pair's shape.
template <>
struct ForwardFp8TileConfig<192> {
  static constexpr ForwardTileShape kShape = ForwardTileConfig<192, 128>::kShape;
};

// FP8 tiles whose rows pack the query heads of a GQA group (decode over an FP8 cache, which reads
// each KV head once so): the FP8 tile, with two warpgroups at d64 as the bf16 packed tile has.
template <int kHeadDim>
struct ForwardFp8PackedTileConfig : ForwardFp8TileConfig<kHeadDim> {};
template <>
struct ForwardFp8PackedTileConfig<64> {
  static constexpr ForwardTileShape kShape = ForwardPackedTileConfig<64>::kShape;
};

// Forms of a tile: its config derives from the base tile and from a form's tag, which the kernel
// traits test with std::is_base_of (ForwardKernelTraits::kKeyGroupMajor, kLoadsSmallPages).
//
// Key-group-major K and V^T stages (fwd_page_rows_tma.hpp): for paged caches whose pages hold
// whole boxes of keys but not whole key blocks, where a box then takes one TMA copy instead of
// one per 64 head-dim columns. The base tile's shape otherwise.
struct KeyGroupMajorForm {};
template <class Base>
struct KeyGroupMajorTileConfig : Base, KeyGroupMajorForm {};

// Whole key blocks only (contiguous keys, or pages that hold whole blocks): the base tile without
// the paths for smaller pages (page boxes, the row gather and its helper warps). For decode's
// narrow tile, whose CTAs run a key block or a few per step: ncu (H100, MQA 32/1 8k, batch 1) had
// 23% of its stalls waiting for instructions, its code fetched cold on every SM each step. This
// form's kernel is 6300 SASS instructions against 9800 (bf16 d128); decode steps measured 2-10%
// faster at batch 1 and 3-8% at MQA batch 16 (H100, bench/results/ab/2026-12-07-h100-decode-whole-key-blocks.md).
struct WholeKeyBlocksForm {};
template <class Base>
struct WholeKeyBlocksTileConfig : Base, WholeKeyBlocksForm {};

}  // namespace hopattn
