// How the forward lays out its tiles for one problem: whether the query heads of a GQA group share
// a tile's rows (packed heads), and into how many pieces each tile's keys are split. Both exist for
// decode, a few query rows against a long KV cache, where one tile per (query block, head) leaves
// most SMs idle and reads every K/V block once per query head:
// - packed heads: tile rows are (query row, head) pairs, `pack` heads per query row, so a KV head's
//   tiles read its K/V once for the whole group;
// - key splits: each tile's visible key blocks are cut into `splits` pieces on different CTAs,
//   each leaving its normalised O and LSE in the workspace; a combine kernel merges them
//   (fwd_split_combine.cuh).
// Host code only (and tested on the CPU): the launch decides, the kernel follows.
#pragma once

#include "hopattn/hopattn.hpp"

namespace hopattn {

struct ForwardSplitPlan {
  int pack = 1;    // query heads per tile row group (1: none)
  int splits = 1;  // key pieces per tile (1: none)

  bool packed() const { return pack > 1; }
  bool split() const { return splits > 1; }
};

// What the choice depends on.
struct ForwardSplitInputs {
  int batch = 0;
  int heads = 0;
  int heads_kv = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  int block_m = 0;
  int block_n = 0;
  int ctas = 0;        // persistent CTAs (one per SM)
  int num_splits = 0;  // the caller's ForwardArgs::num_splits
  PackGqa pack_gqa = PackGqa::kAuto;
  bool workspace = false;  // splits need one
};

// The model behind the automatic choice, in eighths of one key block's work on one CTA: a piece
// costs its key blocks plus kPieceStartBlocks (the tile's start: Q load, first S GEMM, epilogue),
// the split as a whole kCombineBlocks more (the partials' round trip and the combine kernel) and
// an eighth of a block per piece (the combine reads every piece's partial of each output row:
// MQA decode at batch 1, 32 query heads, 32k keys, H100: 0.41 TB/s at 128 pieces, 0.50-0.51 at
// 32-64, 0.40 at 16; fitted to that sweep, a piece more costs the combine 0.12 of a key block),
// and the pieces run in waves of `ctas`. Splits go up to kMaxSplits.
struct ForwardSplitModel {
  static constexpr int kPieceStartBlocks = 2;
  static constexpr int kCombineBlocks = 2;
  static constexpr int kUnitsPerBlock = 8;  // the combine's cost per piece is one unit
  static constexpr int kMaxSplits = 128;
  static constexpr long long kMaxPieces = 1LL << 30;
  static constexpr long long kMaxIntRows = (1LL << 31) - 1;  // rows the device counts in int
  static constexpr int kCombineRowsPerCta = 4;               // the combine kernel's (fwd_split_combine.cuh)

  static long long cost(long long tiles, int key_blocks, int splits, int ctas) {
    const long long pieces = tiles * splits;
    const long long waves = (pieces + ctas - 1) / ctas;
    const long long per_piece = ((key_blocks + splits - 1) / splits + kPieceStartBlocks) * kUnitsPerBlock;
    return waves * per_piece + (splits > 1 ? kCombineBlocks * kUnitsPerBlock + splits : 0);
  }
};

// Query-row blocks of block_m rows per (batch, tile head) with `pack` rows per query: what the
// launch schedules and the plan weighs.
inline int forward_m_blocks(int max_seqlen_q, int pack, int block_m) {
  return static_cast<int>((static_cast<long long>(max_seqlen_q) * pack + block_m - 1) / block_m);
}

// Tiles (query blocks x tile heads x batch) of a plan with `pack` rows per query.
inline long long forward_tiles(const ForwardSplitInputs& in, int pack) {
  return static_cast<long long>(forward_m_blocks(in.max_seqlen_q, pack, in.block_m)) * (in.heads / pack) * in.batch;
}

inline ForwardSplitPlan choose_forward_split(const ForwardSplitInputs& in) {
  ForwardSplitPlan plan;
  const int group = in.heads_kv > 0 ? in.heads / in.heads_kv : 1;
  // Packed rows are counted in int on the device.
  const bool packed_rows_fit =
      static_cast<long long>(in.max_seqlen_q) * group + in.block_m <= ForwardSplitModel::kMaxIntRows;
  if (group > 1 && in.pack_gqa != PackGqa::kOff && packed_rows_fit) {
    // Auto: pack where the group's rows need fewer tiles together than apart.
    const bool fewer_tiles = forward_tiles(in, group) < forward_tiles(in, 1);
    if (in.pack_gqa == PackGqa::kOn || fewer_tiles) plan.pack = group;
  }
  const int key_blocks = static_cast<int>((static_cast<long long>(in.max_seqlen_k) + in.block_n - 1) / in.block_n);
  // The combine kernel counts a sequence's output rows (queries x heads) in int, and its grid
  // (blocks of 4 such rows per sequence) must stay within the launch limit.
  const long long rows = static_cast<long long>(in.max_seqlen_q) * in.heads;
  const int per_cta = ForwardSplitModel::kCombineRowsPerCta;
  const bool rows_fit = rows <= ForwardSplitModel::kMaxIntRows &&
                        (rows + per_cta - 1) / per_cta * in.batch <= ForwardSplitModel::kMaxIntRows;
  if (!in.workspace || in.num_splits == 1 || key_blocks < 2 || in.ctas <= 0 || !rows_fit) return plan;
  const int most = key_blocks < ForwardSplitModel::kMaxSplits ? key_blocks : ForwardSplitModel::kMaxSplits;
  const long long tiles = forward_tiles(in, plan.pack);
  if (in.num_splits > 1) {
    // The kernel counts pieces in int: at most kMaxPieces of them.
    const long long fit = tiles > 0 ? ForwardSplitModel::kMaxPieces / tiles : most;
    long long n = in.num_splits < most ? in.num_splits : most;
    n = n < fit ? n : fit;
    plan.splits = n > 1 ? static_cast<int>(n) : 1;
    return plan;
  }
  if (tiles >= in.ctas) return plan;  // a full wave already (the split tail takes the last round's slack)
  long long best = ForwardSplitModel::cost(tiles, key_blocks, 1, in.ctas);
  for (int s = 2; s <= most; ++s) {
    const long long c = ForwardSplitModel::cost(tiles, key_blocks, s, in.ctas);
    if (c < best) {
      best = c;
      plan.splits = s;
    }
  }
  return plan;
}

}  // namespace hopattn
