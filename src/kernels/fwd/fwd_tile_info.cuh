// The forward kernel's side of its tiles (fwd_tile.hpp): the producer and the publisher warp
// derive each tile the same way from the same ScheduledTile, which the publisher decides; the
// consumers read what the publisher wrote (see forward_tile_publisher).
#pragma once

#include "kernels/fwd/fwd_params.cuh"
#include "kernels/fwd/fwd_tile.hpp"

namespace hopattn {

// The rings of published tiles in shared memory: the publisher writes a slot before it knows that
// the consumers released the previous tile, and a slot is read until its tile's epilogue. The
// tile's ScheduledTile (its TailPiece is read by the epilogue) sits in a ring of its own, which the
// producer reads too: inside the tile, which the consumers keep in registers, the piece cost the
// 176-key kernel 60 spilled registers.
constexpr int kPublishedTileSlots = 3;
CUTE_DEVICE int next_published_tile_slot(int slot) { return slot == kPublishedTileSlots - 1 ? 0 : slot + 1; }

// The piece of its tile's keys that a scheduled tile is (key splits; 0 without them).
template <class Traits>
CUTE_DEVICE int key_split_of(const ForwardParams<Traits>& params, const ScheduledTile& s) {
  return params.scheduler.by_key_splits.remainder(s.linear);
}

template <class Traits>
CUTE_DEVICE ForwardTile make_forward_tile(const ForwardParams<Traits>& params, const ScheduledTile& s) {
  return forward_tile(params.problem, params.scheduler, params.pack, Traits::kBlockM, Traits::kBlockN, s);
}

}  // namespace hopattn
