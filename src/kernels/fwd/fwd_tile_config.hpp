// Tile shapes of the forward kernel per head dim: chosen from measurements on the H200 (see
// docs/perf-log.md), starting from FlashAttention-3's published choices.
#pragma once

namespace hopattn {

template <int kHeadDim>
struct ForwardTileConfig;

// kBlockM: query rows per CTA (64 per consumer warpgroup); kBlockN: keys per pipeline stage.
template <>
struct ForwardTileConfig<64> {
  static constexpr int kBlockM = 192, kBlockN = 128, kStages = 3;
};
template <>
struct ForwardTileConfig<96> {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 3;
};
template <>
struct ForwardTileConfig<128> {
  // Measured on the H200: a third K/V stage gained 3-5% over two; 128 x 176 tiles lost 0-35%
  // (spills, and fewer tiles at short seqlens).
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 3;
};
template <>
struct ForwardTileConfig<192> {
  static constexpr int kBlockM = 128, kBlockN = 96, kStages = 2;
};
template <>
struct ForwardTileConfig<256> {
  static constexpr int kBlockM = 128, kBlockN = 80, kStages = 2;
};

}  // namespace hopattn
