// Tile shapes of the backward kernel per head dim. Every kernel takes query blocks of
// BackwardWorkspace::kRowBlock (64) rows, the unit the workspace is padded to, and has two MMA
// warpgroups.
#pragma once

namespace hopattn {

// kBlockN: keys per CTA (resident K and V); kStages: depth of the Q/dO ring; kDqBuffers: dQ
// staging buffers between the MMA warpgroups and the writer warp.
// Up to d128 each MMA warpgroup owns 64 of 128 keys. Above, 64 keys per warpgroup would leave no
// registers (dK and dV alone: 2 x 96-128 per thread), so the CTA takes 64 keys, the warpgroups
// split the queries of S^T and dP^T and each accumulates half of the head dim of dK and dV; shared
// memory then allows fewer stages and one dQ buffer.
template <int kHeadDim>
struct BackwardTileConfig {
  static constexpr int kBlockN = 128, kStages = 2, kDqBuffers = 2;
};
template <>
struct BackwardTileConfig<192> {
  static constexpr int kBlockN = 64, kStages = 2, kDqBuffers = 1;
};
template <>
struct BackwardTileConfig<256> {
  static constexpr int kBlockN = 64, kStages = 1, kDqBuffers = 1;
};

}  // namespace hopattn
