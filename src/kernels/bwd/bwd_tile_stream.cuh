// How persistent backward CTAs learn their next tile. They take tiles from a counter in the
// workspace, in the grid's order (bwd_grid_order.hpp): an SM that finishes early takes more, so
// tiles of unequal work (masks, varlen) spread as when the hardware hands out a CTA per tile. A
// fixed round-robin does not: with the key block fastest in the grid's order, 4 key blocks and
// 132 SMs, every SM drew the same key block on every round, one SM all of a causal problem's
// longest ones (the seventh session's persistent backward lost 18% at d128 causal that way).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace hopattn {

// The producer warp takes each next tile from the counter while its current one runs and
// publishes it here for the other roles, which read it when they finish their current tile. Two
// slots: the one the producer refills held the tile two back, which every reader read before
// starting the tile one back.
struct BackwardTileRing {
  int index[2];
  cutlass::arch::ClusterBarrier full[2];   // the producer's arrival: index[slot] is in
  cutlass::arch::ClusterBarrier empty[2];  // every reading warp's arrival: index[slot] was read

  // Tile j >= 1 of a CTA (its first is blockIdx.x) lives in slot j % 2, that slot's (j - 1) / 2-th use.
  CUTE_DEVICE static int slot(int j) { return j & 1; }
  CUTE_DEVICE static uint32_t phase(int j) { return ((j - 1) >> 1) & 1; }

  CUTE_DEVICE void init(int reading_warps) {
    for (int s = 0; s < 2; ++s) {
      full[s].init(1);
      empty[s].init(reading_warps);
    }
  }

  // The producer warp, whole: takes tile j from `counter` (zeroed before this kernel read it) and
  // publishes it.
  CUTE_DEVICE int publish(int j, int32_t* counter) {
    int taken = 0;
    if (threadIdx.x % cutlass::NumThreadsPerWarp == 0) taken = atomicAdd(counter, 1);
    const int next = static_cast<int>(gridDim.x) + __shfl_sync(0xffffffff, taken, 0);
    if (j >= 3) empty[slot(j)].wait(phase(j - 2));
    if (cute::elect_one_sync()) {
      index[slot(j)] = next;
      // mbarrier.arrive has release semantics; CUTLASS's barrier asm has no memory clobber, so keep
      // the compiler from sinking the store past it.
      asm volatile("" ::: "memory");
      full[slot(j)].arrive();
    }
    return next;
  }

  // A reading warp, whole: tile j as published.
  CUTE_DEVICE int read(int j) {
    full[slot(j)].wait(phase(j));
    asm volatile("" ::: "memory");  // the read stays after the wait (acquire)
    const int next = index[slot(j)];
    __syncwarp();  // every lane's read before the arrival
    if (cute::elect_one_sync()) empty[slot(j)].arrive();
    return next;
  }
};

}  // namespace hopattn
