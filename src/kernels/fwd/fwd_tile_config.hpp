// Tile shapes of the forward kernel per head dim: chosen from measurements on the H200 (see
// docs/perf-log.md), starting from FlashAttention-3's published choices.
#pragma once

namespace hopattn {

template <int kHeadDim>
struct ForwardTileConfig;

// kBlockM: query rows per CTA (64 per consumer warpgroup); kBlockN: keys per pipeline stage.
// kOStagedInQ: the O tile is staged through Q's shared memory because a separate buffer does not
// fit next to two K/V stages; the next tile's Q then waits for the epilogue.
template <>
struct ForwardTileConfig<64> {
  static constexpr int kBlockM = 192, kBlockN = 128, kStages = 3;
  static constexpr bool kOStagedInQ = false;
};
template <>
struct ForwardTileConfig<96> {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 3;
  static constexpr bool kOStagedInQ = false;
};
template <>
struct ForwardTileConfig<128> {
  // Measured on the H200: a third K/V stage (O then staged in Q) gains 3-5% over two stages with
  // a separate O buffer; 128 x 176 tiles lost 0-35% (spills, and fewer tiles at short seqlens).
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 3;
  static constexpr bool kOStagedInQ = true;
};
template <>
struct ForwardTileConfig<192> {
  static constexpr int kBlockM = 128, kBlockN = 96, kStages = 2;
  static constexpr bool kOStagedInQ = true;
};
template <>
struct ForwardTileConfig<256> {
  static constexpr int kBlockM = 128, kBlockN = 80, kStages = 2;
  static constexpr bool kOStagedInQ = true;
};

}  // namespace hopattn
