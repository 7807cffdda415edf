// Tile shapes of the backward kernel per head dim; every kernel has two MMA warpgroups.
#pragma once

namespace hopattn {

// kBlockM: query rows per pipeline stage (64 or 128; the workspace pads sequences to 128); kBlockN:
// keys per CTA (resident K and V); kStages: depth of the Q/dO ring.
// Up to d128 each MMA warpgroup owns 64 of 128 keys. Above, 64 keys per warpgroup would leave no
// registers (dK and dV alone: 2 x 96-128 per thread), so the CTA takes 64 keys, the warpgroups
// split the queries of S^T and dP^T and each accumulates half of the head dim of dK and dV; shared
// memory then allows fewer stages.
template <int kHeadDim>
struct BackwardTileConfig {
  static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2;
};
// At d64 a block's GEMMs are half as long as at d128 while its fixed costs (pipeline waits, the
// barrier where dS^T is published, the dQ handoff) stay: 128 queries per block halve their share.
template <>
struct BackwardTileConfig<64> {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2;
};
template <>
struct BackwardTileConfig<192> {
  static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2;
};
template <>
struct BackwardTileConfig<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kStages = 1;
};

// The softcap variant's tiles (ScoreVariant::kSoftcap): by default the same. At d64 the 128-query
// blocks spilled 26-29 values in the main loop with the tanh and the d tanh recovered from P;
// 64-query blocks, as at d128, do not.
template <int kHeadDim>
struct BackwardSoftcapTileConfig : BackwardTileConfig<kHeadDim> {};
template <>
struct BackwardSoftcapTileConfig<64> {
  static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2;
};

}  // namespace hopattn
