// The order in which the backward's one-dimensional grid visits (key block, unit) pairs, where a
// unit is one (head slice, KV head, batch) and owns a row of key blocks.
#pragma once

#include "kernels/common/host_device.hpp"

namespace hopattn {

struct BackwardGridCoord {
  int n_block;
  int unit;  // slice + head_slices * (head_kv + heads_kv * batch)
};

// Default mode: key block fastest, ascending, so that a unit's CTAs run together and share its Q
// and dO in L2 (measured on the H200 under a causal mask: better than longest-first at every
// seqlen, +29% at 2k and +3% at 16k; docs/perf-log.md).
//
// Deterministic mode: the dQ writer of key block n adds after key block n + 1 of its unit
// (backward_dq_writer), and slice s of a key block adds dK/dV after slice s - 1, so every CTA a
// CTA waits for must be launched before it, whatever the GPU holds at once: key blocks descend.
// Within that rule, without a mask a wave should not hold all key blocks of few units: those
// start together at the same query block, and the one that adds last there waits for the turns of
// all the others (one semaphore round trip each) before its first handoff. So the units come in
// L2 sections of `section_units`, key block slower than unit inside a section: a wave holds the
// top key blocks of every unit of the section, and the lower ones start a wave later, when the
// higher ones are ahead of them. Measured on the H200 (deterministic / default, 2k/8k/16k):
// d64 0.79 / 0.88 / 0.98 -> 0.96 / 0.99 / 0.99, d128 0.78 / 0.83 / 0.86 -> 0.84 / 0.87 / 0.92.
// Under a causal mask a key block's first query block is two blocks (d128) after the next
// lower one's, which keeps the chain apart already; there sections put each section's longest
// CTAs (key block 0) together at its end and lost 5-20% at 2k/8k, so a masked problem takes
// section_units = 1: key block fastest, as in the default order, descending.
HOPATTN_HOST_DEVICE BackwardGridCoord backward_grid_coord(long long index, int key_blocks, int units,
                                                                 bool deterministic, int section_units) {
  if (!deterministic) {
    return {static_cast<int>(index % key_blocks), static_cast<int>(index / key_blocks)};
  }
  const long long section_ctas = static_cast<long long>(section_units) * key_blocks;
  const int section = static_cast<int>(index / section_ctas);
  const int within = static_cast<int>(index - section * section_ctas);
  const int first_unit = section * section_units;
  const int width = units - first_unit < section_units ? units - first_unit : section_units;
  return {key_blocks - 1 - within / width, first_unit + within % width};
}

// Units per L2 section in deterministic mode: as many as keep their Q, dO, dQ accumulator, K and
// V (bytes_per_unit) within L2, at least one.
inline int backward_section_units(long long bytes_per_unit, long long l2_bytes, int units) {
  long long fit = bytes_per_unit > 0 ? l2_bytes / bytes_per_unit : units;
  if (fit < 1) fit = 1;
  return static_cast<int>(fit < units ? fit : units);
}

}  // namespace hopattn
