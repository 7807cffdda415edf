// Where one (m_block, head, batch) tile of the forward lives, and which key blocks it visits.
// The producer and the publisher warp derive it the same way from the same ScheduledTile, which
// the publisher decides; the consumers read what the publisher wrote (see forward_tile_publisher).
#pragma once

#include "kernels/common/block_range.hpp"
#include "kernels/fwd/fwd_params.cuh"

namespace hopattn {

struct ForwardTile {
  int first_row;    // query row of the tile's row 0: m_block * kBlockM - query_block_pad (may be < 0)
  int head;
  int head_kv;
  int batch_coord;  // batch index of the TMA tensors (0 in varlen mode, where offsets locate sequences)
  int batch;
  int q_offset;     // first token of the sequence along the packed axis (0 in fixed-length mode)
  int k_offset;
  int seqlen_q;
  int seqlen_k;
  BlockRange n_blocks;  // key blocks to visit, all of them from n_blocks.end - 1 down
  BlockRange unmasked;  // the ones among them that need no mask

  CUTE_DEVICE bool has_rows() const { return first_row < seqlen_q; }

  // What the publisher warp hands the consumers after the last tile (no tile has a negative head).
  CUTE_DEVICE static ForwardTile end_marker() {
    ForwardTile t{};
    t.head = -1;
    return t;
  }
  CUTE_DEVICE bool is_end_marker() const { return head < 0; }
};

// The rings of published tiles in shared memory: the publisher writes a slot before it knows that
// the consumers released the previous tile, and a slot is read until its tile's epilogue. The
// tile's ScheduledTile (its TailPiece is read by the epilogue) sits in a ring of its own, which the
// producer reads too: inside the tile, which the consumers keep in registers, the piece cost the
// 176-key kernel 60 spilled registers.
constexpr int kPublishedTileSlots = 3;
CUTE_DEVICE int next_published_tile_slot(int slot) { return slot == kPublishedTileSlots - 1 ? 0 : slot + 1; }

template <class Traits>
CUTE_DEVICE ForwardTile make_forward_tile(const ForwardParams<Traits>& params, const ScheduledTile& s) {
  const Problem& p = params.problem;
  const WorkTile w = params.scheduler.tile(s.linear);
  const Sequence q = p.queries.sequence(w.batch);
  const Sequence k = p.keys.sequence(w.batch);
  ForwardTile t;
  const int pad = query_block_pad(p.mask, Traits::kBlockM, q.length);
  t.first_row = w.m_block * Traits::kBlockM - pad;
  t.head = w.head;
  t.head_kv = w.head / (p.heads / p.heads_kv);
  t.batch = w.batch;
  t.batch_coord = p.varlen() ? 0 : w.batch;
  t.q_offset = static_cast<int>(q.offset);
  t.k_offset = static_cast<int>(k.offset);
  t.seqlen_q = q.length;
  t.seqlen_k = k.length;
  t.n_blocks = n_block_range(p.mask, w.m_block, Traits::kBlockM, Traits::kBlockN, q.length, k.length, pad);
  t.unmasked = n_block_range_unmasked(p.mask, w.m_block, Traits::kBlockM, Traits::kBlockN, q.length, k.length, pad);
  if (params.scheduler.split(s.linear)) {
    const BlockRange piece{t.n_blocks.begin + s.key_begin, t.n_blocks.begin + s.key_end};
    t.n_blocks = intersect(t.n_blocks, piece);
    t.unmasked = intersect(t.unmasked, piece);
  }
  return t;
}

}  // namespace hopattn
