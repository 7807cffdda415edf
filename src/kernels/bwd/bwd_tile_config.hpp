// Tile shapes of the backward kernel per head dim. Every kernel takes query blocks of
// BackwardWorkspace::kRowBlock (64) rows, the unit the workspace is padded to.
#pragma once

namespace hopattn {

// kBlockN: keys per CTA (resident K and V; 64 per MMA warpgroup); kStages: depth of the Q/dO ring.
template <int kHeadDim>
struct BackwardTileConfig {
  static_assert(kHeadDim <= 128, "head dims above 128 need a different register split (not built yet)");
  static constexpr int kBlockN = 128, kStages = 2;
};

}  // namespace hopattn
