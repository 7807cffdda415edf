// How many CTAs share one key block of a KV head: the backward splits a GQA group's query heads
// into slices, one CTA per (key block, KV head, slice), and sums their dK and dV in fp32.
#pragma once

#include "kernels/common/problem.hpp"

namespace hopattn {

// A CTA visits every query block of every query head of its slice, so with large groups and few
// key blocks there are few, long CTAs. Slices make the grid wider; each costs an fp32 reduction of
// the block's dK and dV (2 * keys * head_dim * 4 bytes). Every slice has as many heads (a divisor
// of the group); without GQA there is one slice.
// - Under a mask (or with varlen) the CTAs' work differs (a causal key block near the diagonal
//   sees few query blocks), and many CTAs balance it: the smallest divisor whose grid reaches
//   kTargetWaves waves. Measured on the H200 (d128, causal, 2k/8k): MQA 32/1 0.62 -> 1.08 of
//   cuDNN, 32/4 0.93 -> 1.08, 64/8 1.01 -> 1.08. And at most kMaxMaskedHeadsPerCta heads a CTA
//   where the group is even: by waves alone 64/8 took two slices of four heads at 2k-16k; two
//   heads a CTA measured (H100, d128, causal, of cuDNN, two rounds) 2k 1.04 -> 1.10, 4k 1.07 ->
//   1.11, 8k 1.08 -> 1.10, 16k 1.09 -> 1.15, deterministic 2k 0.87 -> 1.04. One head a CTA lost
//   at 2k (64/8 1.03, 32/4 1.02: each slice's dK/dV sums and K/V loads weigh more), and 32/1 with
//   4 to 16 heads a CTA lost 8-45% (forced slice counts, docs/perf-log.md).
// - Without one every CTA has the same work: slices pay only where they shorten the grid's waves,
//   ceil(ctas * slices / sms) / slices, by a tenth (non-causal 32/1, 32/4, 64/8 at 2k/8k lost
//   1-7% with eight waves' worth of slices, their grids already being full).
// - In deterministic mode under a mask, a KV head's key blocks are launched highest first (the
//   dQ order, bwd_grid_order.hpp), so its longest CTA (key block 0, every query block) comes last,
//   and the grid's last CTAs are the longest ones: slices also bound a CTA's query blocks (heads of
//   its slice times query blocks of a head) to kMaxDeterministicCtaBlocks. Measured (d128, causal,
//   8k/16k, one head a CTA against the rule above): 64/8 0.78 / 0.72 -> 0.85 / 0.87 of the default
//   mode's speed, 32/4 0.83 / 0.81 -> 0.83 / 0.88, 32/1 0.84 / 0.82 -> 0.84 / 0.89; at 2k, where
//   the CTAs are short already, one head a CTA lost (the slices add dK and dV one after another).
inline constexpr int kTargetWaves = 8;
inline constexpr int kMaxDeterministicCtaBlocks = 128;
inline constexpr int kMaxMaskedHeadsPerCta = 2;

struct BackwardGridShape {
  int key_blocks;       // per (KV head, sequence)
  int query_blocks;     // per query head and sequence, at most
  int multiprocessors;  // 0 if unknown
  bool deterministic;
};

inline int backward_head_slices(const Problem& p, const BackwardGridShape& grid) {
  const int group = p.heads_kv > 0 ? p.heads / p.heads_kv : 1;
  const int sms = grid.multiprocessors;
  if (group <= 1 || sms <= 0) return 1;
  const long long ctas = static_cast<long long>(grid.key_blocks) * p.heads_kv * p.batch;
  if (!p.mask.unbounded() || p.varlen()) {
    const long long target = static_cast<long long>(kTargetWaves) * sms;
    for (int slices = 1; slices < group; ++slices) {
      if (group % slices != 0 || ctas * slices < target) continue;
      const int heads_per_cta = group / slices;
      if (heads_per_cta > kMaxMaskedHeadsPerCta && group % kMaxMaskedHeadsPerCta == 0) continue;
      const long long cta_blocks = static_cast<long long>(heads_per_cta) * grid.query_blocks;
      if (!grid.deterministic || cta_blocks <= kMaxDeterministicCtaBlocks) return slices;
    }
    return group;
  }
  auto waves = [&](int slices) { return static_cast<double>((ctas * slices + sms - 1) / sms) / slices; };
  int best = 1;
  for (int slices = 2; slices <= group; ++slices) {
    if (group % slices == 0 && waves(slices) <= 0.9 * waves(best)) best = slices;
  }
  return best;
}

}  // namespace hopattn
