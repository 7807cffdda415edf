// Named hardware barrier ids used by the warp-specialized kernels. CUTLASS reserves the first
// ids for itself; NamedBarrier adds that offset, so these count from 0 and at most 8 exist.
#pragma once

#include <cutlass/arch/barrier.h>

namespace hopattn {

enum class FwdBarrier : uint32_t {
  kWarpScheduler0 = 0,      // + consumer warpgroup: its turn to issue tensor-core work (ping-pong)
  kPackedQueryLoaded0 = 3,  // + consumer warpgroup: its rows of a packed tile's Q are in sQ
};

// The backward's barriers. Around each MMA warpgroup's dQ staging buffer, between it and the dQ
// writer warp: full, its partial sums are in shared memory; empty, the writer has read them out.
// Among the MMA warpgroups: every one has written its dS^T (and P^T) entries of the block.
// Deterministic mode, between the turn watcher warp and a dQ writer warp: the writer's turn at its
// next query block has come.
enum class BwdBarrier : uint32_t {
  kDqFull0 = 0,   // + MMA warpgroup
  kDqEmpty0 = 2,  // + MMA warpgroup
  kScoresPublished = 4,
  kTurn0 = 5,  // + writer warp
};

inline constexpr int kMaxConsumerWarpgroups = 3;
inline constexpr int kMaxBwdMmaWarpgroups = 2;
inline constexpr uint32_t kKernelNamedBarriers = 8;  // what CUTLASS leaves to kernels

static_assert(static_cast<uint32_t>(FwdBarrier::kWarpScheduler0) + kMaxConsumerWarpgroups <=
                      static_cast<uint32_t>(FwdBarrier::kPackedQueryLoaded0) &&
                  static_cast<uint32_t>(FwdBarrier::kPackedQueryLoaded0) + kMaxConsumerWarpgroups <=
                      kKernelNamedBarriers,
              "the forward's per-warpgroup barrier ranges overlap or run past the named barriers kernels have");
static_assert(static_cast<uint32_t>(BwdBarrier::kDqFull0) + kMaxBwdMmaWarpgroups <=
                      static_cast<uint32_t>(BwdBarrier::kDqEmpty0) &&
                  static_cast<uint32_t>(BwdBarrier::kDqEmpty0) + kMaxBwdMmaWarpgroups <=
                      static_cast<uint32_t>(BwdBarrier::kScoresPublished) &&
                  static_cast<uint32_t>(BwdBarrier::kScoresPublished) < static_cast<uint32_t>(BwdBarrier::kTurn0) &&
                  static_cast<uint32_t>(BwdBarrier::kTurn0) + kMaxBwdMmaWarpgroups <= kKernelNamedBarriers,
              "the backward's per-warpgroup barrier ranges overlap or run past the named barriers kernels have");

CUTLASS_DEVICE uint32_t barrier_id(FwdBarrier base, int offset = 0) {
  return static_cast<uint32_t>(base) + static_cast<uint32_t>(offset);
}
CUTLASS_DEVICE uint32_t barrier_id(BwdBarrier base, int offset = 0) {
  return static_cast<uint32_t>(base) + static_cast<uint32_t>(offset);
}

}  // namespace hopattn
