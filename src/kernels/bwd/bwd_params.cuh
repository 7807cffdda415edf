// What the backward kernels receive: TMA descriptors for Q, dO, K and V, the dK and dV pointers,
// the workspace and the problem. Built on the host by make_backward_params (bwd_launch.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/problem.hpp"
#include "kernels/bwd/bwd_grid_order.hpp"
#include "kernels/bwd/bwd_tile_stream.cuh"
#include "kernels/bwd/bwd_workspace.hpp"
#include "kernels/common/block_range.hpp"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/tma_tensors.cuh"

namespace hopattn {

CUTE_DEVICE int load_acquire(const int32_t* address) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}

template <class Traits>
struct BackwardParams {
  using Element = typename Traits::Element;
  using GmemTokens = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                TmaTokensShape{}, TmaTokensStride{}));
  // Q and dO: (tokens, head dim, heads, batch) in blocks of kBlockM rows; K and V in blocks of
  // kBlockN. Q and K have head_dim columns, dO and V head_dim_v.
  template <class SmemLayout, class Rows, class Columns>
  using TmaRows = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTokens{}, SmemLayout{},
                                               cute::Shape<Rows, Columns>{}, cute::_1{}));
  using TmaQ = TmaRows<decltype(cute::take<0, 2>(typename Traits::SmemLayoutQ{})), typename Traits::BlockM,
                       typename Traits::HeadDim>;
  using TmaDO = TmaRows<decltype(cute::take<0, 2>(typename Traits::SmemLayoutDO{})), typename Traits::BlockM,
                        typename Traits::HeadDimV>;
  using TmaK = TmaRows<typename Traits::SmemLayoutK, typename Traits::BlockN, typename Traits::HeadDim>;
  using TmaV = TmaRows<typename Traits::SmemLayoutV, typename Traits::BlockN, typename Traits::HeadDimV>;

  TmaQ tma_q;
  TmaDO tma_dout;
  TmaK tma_k;
  TmaV tma_v;
  TmaTokensShape shape_q;
  TmaTokensShape shape_dout;
  TmaTokensShape shape_k;
  TmaTokensShape shape_v;

  Problem problem;
  RowTensor dk, dv;
  BackwardWorkspace workspace;
  float scale_log2;  // softmax_scale * log2(e)
  // Softcap (ScoreVariant::kSoftcap, softcap.cuh): the tanh's argument is the raw score times
  // softcap_in (softmax_scale / softcap), P's exp2 factor softcap_log2 (softcap * log2(e)).
  float softcap_in;
  float softcap_log2;
  float softcap_log2_inverse;  // 1 / softcap_log2, to recover tanh from P for dS
  int head_slices;   // CTAs per (key block, KV head): see bwd_head_slices.hpp
  int section_units;  // deterministic grid order: units per L2 section (bwd_grid_order.hpp)
  bool deterministic;
  // Persistent CTAs take their tiles from it (bwd_tile_stream.cuh); null: a CTA per tile.
  int32_t* tile_counter;
};

// The key block a backward CTA owns and the query blocks it visits for every query head of its
// slice of the KV head's group.
struct BackwardTile {
  int n_block;
  int head_kv;
  int slice;       // of the group's query heads: heads [first_head, end_head) of the group
  int first_head;
  int end_head;
  int batch;
  int batch_coord;  // batch index of the TMA tensors (0 in varlen mode)
  int q_offset;     // first token of the sequence along the packed axis (0 in fixed-length mode)
  int k_offset;
  int seqlen_q;
  int seqlen_k;
  long long padded_row;      // the sequence's first row in the workspace
  long long padded_key_row;  // the same for its keys (dK/dV accumulators; 0 without GQA)
  BlockRange m_blocks;   // query blocks with at least one visible (query, key) pair
  BlockRange unmasked;   // the ones among them where every pair is visible
  bool partial_keys;     // the block reaches past seqlen_k: every query block needs the mask

  CUTE_DEVICE bool masked(int m_block) const {
    return partial_keys || m_block < unmasked.begin || m_block >= unmasked.end;
  }
};

// The grid is one-dimensional over (key block, head slice, KV head, batch), in the order of
// backward_grid_coord (bwd_grid_order.hpp).
HOPATTN_HOST_DEVICE int backward_key_blocks(const Problem& p, int block_n) {
  return (p.max_seqlen_k + block_n - 1) / block_n;
}

// Tile `index` of the grid's order.
template <class Traits>
CUTE_DEVICE BackwardTile make_backward_tile(const BackwardParams<Traits>& params, long long index) {
  const Problem& p = params.problem;
  const int key_blocks = backward_key_blocks(p, Traits::kBlockN);
  BackwardTile t;
  const int units = params.head_slices * p.heads_kv * p.batch;
  const BackwardGridCoord c =
      backward_grid_coord(index, key_blocks, units, params.deterministic, params.section_units);
  t.n_block = c.n_block;
  t.slice = c.unit % params.head_slices;
  const int pair = c.unit / params.head_slices;
  t.head_kv = pair % p.heads_kv;
  t.batch = pair / p.heads_kv;
  const int heads_per_slice = p.heads / p.heads_kv / params.head_slices;
  t.first_head = t.slice * heads_per_slice;
  t.end_head = t.first_head + heads_per_slice;
  const Sequence q = p.queries.sequence(t.batch);
  const Sequence k = p.keys.sequence(t.batch);
  t.batch_coord = p.varlen() ? 0 : t.batch;
  t.q_offset = static_cast<int>(q.offset);
  t.k_offset = static_cast<int>(k.offset);
  t.seqlen_q = q.length;
  t.seqlen_k = k.length;
  t.padded_row = params.workspace.sequence_row(p.queries, t.batch);
  t.padded_key_row = params.workspace.padded_key_rows > 0 ? params.workspace.sequence_row(p.keys, t.batch) : 0;
  t.m_blocks = m_block_range(p.mask, t.n_block, Traits::kBlockM, Traits::kBlockN, q.length, k.length);
  t.unmasked = m_block_range_unmasked(p.mask, t.n_block, Traits::kBlockM, Traits::kBlockN, q.length, k.length);
  t.partial_keys = (t.n_block + 1) * Traits::kBlockN > k.length;
  return t;
}

// A persistent CTA (Traits::kPersistent) calls f(tile) for its tiles: its own (blockIdx.x), then
// the next ones from params.tile_counter (bwd_tile_stream.cuh), which the producer warp
// (kPublisher) takes and the other roles read from `ring`; without a counter, as the launcher gives
// such a kernel a CTA per tile, its own alone. Tiles past their sequence's keys (varlen) are
// skipped.
template <class Traits, bool kPublisher, class F>
CUTE_DEVICE void for_each_backward_tile(const BackwardParams<Traits>& params, BackwardTileRing& ring, F&& f) {
  const Problem& p = params.problem;
  const long long tiles =
      static_cast<long long>(backward_key_blocks(p, Traits::kBlockN)) * params.head_slices * p.heads_kv * p.batch;
  int index = blockIdx.x;
  for (int j = 1;; ++j) {
    const BackwardTile t = make_backward_tile(params, index);
    if (t.n_block * Traits::kBlockN < t.seqlen_k) f(t);
    if (params.tile_counter == nullptr) return;
    if constexpr (kPublisher) {
      // Here, not before f: the producer returns from a tile with its last loads issued, a few
      // blocks before the other roles finish it, so the counter's round trip is hidden there.
      wait_for_previous_kernel();  // the preprocess zeroes the counter
      index = ring.publish(j, params.tile_counter);
    } else {
      index = ring.read(j);
    }
    if (index >= tiles) return;
  }
}

}  // namespace hopattn
