// The forward's three roles over the tiles of one persistent CTA:
// - the producer warp streams Q once per tile and K, V^T per key block into a kStages-deep ring
//   with TMA, each stage guarded by full/empty mbarriers (PipelineTmaAsync);
// - the publisher warp, next to it, decides each tile (static or dynamic schedule), hands it to
//   the producer, and publishes its coordinates and key-block ranges in shared memory with the
//   tile's Q (q_full completes once both Q and the coordinates are in), then an end marker. That
//   takes a few hundred instructions (divisions, 64-bit block-range arithmetic): done by the
//   consumers themselves, it stalled both warpgroups at every switch between tiles, and the
//   producer, with 24 registers, cannot hold the whole tile;
// - each consumer warpgroup computes S = Q K^T (WGMMA, both operands in shared memory), the
//   online softmax in registers and O += P V (WGMMA with P from registers) for its 64 rows.
// Two overlaps hide the softmax: within a warpgroup the next block's Q K^T is issued before this
// block's softmax runs, and up to d128 named barriers make the warpgroups take turns issuing
// tensor core work (ping-pong), so one warpgroup's softmax runs under the other's GEMMs.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/common/mask_fragment.cuh"
#include "kernels/common/mma_layouts.cuh"
#include "kernels/common/named_barriers.hpp"
#include "kernels/common/score_variant.hpp"
#include "kernels/common/softcap.cuh"
#include "kernels/common/warpgroup_mma.cuh"
#include "kernels/fwd/fwd_epilogue.cuh"
#include "kernels/fwd/fwd_fp8.cuh"
#include "kernels/fwd/fwd_softmax.cuh"
#include "kernels/fwd/fwd_tail_merge.cuh"
#include "kernels/fwd/fwd_tile_info.cuh"

namespace hopattn {

template <class Traits>
struct ForwardSmemTensors {
  using SharedStorage = typename Traits::SharedStorage;
  CUTE_DEVICE static auto q(SharedStorage& s) {
    return cute::make_tensor(cute::make_smem_ptr(s.q.data()), typename Traits::SmemLayoutQ{});  // (M, D)
  }
  CUTE_DEVICE static auto k(SharedStorage& s) {
    return cute::make_tensor(cute::make_smem_ptr(s.k.data()), typename Traits::SmemLayoutK{});  // (N, D, PIPE)
  }
  CUTE_DEVICE static auto vt(SharedStorage& s) {
    return cute::make_tensor(cute::make_smem_ptr(s.v.data()), typename Traits::SmemLayoutVt{});  // (D, N, PIPE)
  }
  // FP8: V as loaded, before the transposition into vt.
  CUTE_DEVICE static auto v_rows(SharedStorage& s) {
    return cute::make_tensor(cute::make_smem_ptr(s.v_rows.data()), typename Traits::SmemLayoutVRows{});  // (D, N, RING)
  }
  // Where V's TMA writes (SmemLayoutVLoaded): the v_rows ring with FP8, else the consumers' stages.
  CUTE_DEVICE static auto v_loaded(SharedStorage& s) {
    if constexpr (Traits::kFp8) {
      return v_rows(s);
    } else {
      return vt(s);
    }
  }
};

// The consumers are done with sQ and with the published tile once each of them has issued its
// tile's last S GEMM: one arrival per warp on q_released. The producer (before it loads the next
// Q) and the publisher (before it hands over the next tile) both wait for it; neither can fall two
// phases behind, since the next release needs a tile that both of them must first provide.
template <class Traits>
CUTE_DEVICE void release_query(typename Traits::SharedStorage& smem) {
  // Every lane's reads of the tile's slot come before the warp's arrival, which lets the publisher
  // reuse the slot (forward_tile_publisher): elect.sync alone does not order other lanes' accesses.
  __syncwarp();
  if (cute::elect_one_sync()) smem.q_released.arrive();
}

// Waits until the consumers released the tile before the CTA's tile `round` (phase round - 1).
template <class Traits>
CUTE_DEVICE void wait_query_released_before(typename Traits::SharedStorage& smem, int round) {
  if (round > 0) smem.q_released.wait((round - 1) & 1);
}

// What the CTA does in `round`. The static schedule is worked out from the round; the dynamic one
// (tile lengths vary and the caller gave a workspace) takes the CTA's own tile first and then the
// next one of the shared order from the counter, which the kernel ahead of this one zeroed: an SM
// that finishes early takes more tiles, so no static pairing of long and short tiles is needed.
// Called by the whole publisher warp.
template <class Traits>
CUTE_DEVICE ScheduledTile next_scheduled_tile(const ForwardParams<Traits>& params, int round) {
  if (params.tile_counter == nullptr) return params.scheduler.scheduled(round, blockIdx.x, gridDim.x);
  ScheduledTile s;
  if (round == 0) {
    s.linear = blockIdx.x;
    return s;
  }
  int taken = 0;
  if (threadIdx.x % cutlass::NumThreadsPerWarp == 0) {
    wait_for_previous_kernel();  // the counter is zeroed
    taken = atomicAdd(params.tile_counter, 1);
  }
  s.linear = static_cast<int>(gridDim.x) + __shfl_sync(0xffffffff, taken, 0);
  return s;
}

// The publisher decides each tile (next_scheduled_tile) and hands it to the producer at once
// through `scheduled`, then to the consumers, with its coordinates, once they released the
// previous tile. Both rings have kPublishedTileSlots slots: the producer reads a slot before it
// lets the tile's Q in, the consumers until the tile's epilogue.
template <class Traits>
CUTE_DEVICE void forward_tile_publisher(const ForwardParams<Traits>& params, typename Traits::SharedStorage& smem) {
  const int total_tiles = params.scheduler.total_tiles();
  // Helpers that read the slots: the gather helpers (kGatherWarps) or the V loader (kVLoaderRank).
  const bool helpers = Traits::kLoadsSmallPages &&
                       (params.problem.key_cache.gather || loads_v_beside_producer(params.problem.key_cache));
  const bool leader = cute::elect_one_sync();
  int slot = 0;
  for (int round = 0;; ++round) {
    const ScheduledTile scheduled = next_scheduled_tile(params, round);
    const bool done = scheduled.linear >= total_tiles;
    // The slot last held the tile three back, whose epilogue every consumer finished before
    // releasing the tile two back, i.e. before this warp last waited below; with gathered blocks
    // the helper warps must also have read it (forward_producer).
    if (helpers && round >= kPublishedTileSlots) {
      smem.slot_read[slot].wait((round / kPublishedTileSlots - 1) & 1);
    }
    if (leader) {
      smem.scheduled[slot] = scheduled;
      // Cleared here, before any gathering warp can read the slot and raise it (forward_producer).
      smem.page_faults[slot] = 0;
      // mbarrier.arrive has release semantics; CUTLASS's barrier asm has no memory clobber, so
      // keep the compiler from sinking the stores past it (here and below).
      asm volatile("" ::: "memory");
      smem.scheduled_full[slot].arrive();
      const ForwardTile tile = done ? ForwardTile::end_marker() : make_forward_tile(params, scheduled);
      smem.tiles[slot] = tile;
      if (params.sinks != nullptr && !done) smem.sink_logits[slot] = params.sinks[tile.head];
    }
    slot = next_published_tile_slot(slot);
    wait_query_released_before<Traits>(smem, round);
    if (leader) {
      asm volatile("" ::: "memory");
      smem.q_full.arrive();  // releases the tile to the consumers
    }
    if (done) break;
  }
}

// Gathered key blocks are copied by warps 0, 2 and 3 of the producer warpgroup (warp 1 publishes
// the tiles), each taking every third pass of 16 rows (gather_key_block): one warp's copies
// limited the gathered rate (page-1 decode, 32/8 d128 on the H100: 0.69-0.78 TB/s with one warp,
// 1.17-1.64 with three).
// The arrivals that complete a stage: each gathering lane's, when its copies are done
// (cp.async.mbarrier.arrive.noinc), and each gathering warp's leader's once its lanes stored their
// fault flags.
inline constexpr int kGatherWarps = 3;
// 16-key page boxes (loads_v_beside_producer): the helper of this rank (warp 2) loads V, so that
// the producer's per-block work is K's alone. At page 16 (d128, 8 boxes a block and tensor) the
// producer issued about 230 instructions a block for both, against the consumers' 1.85 us of
// GEMMs a block.
inline constexpr int kVLoaderRank = 1;
inline constexpr int kGatherFullArrivals = kGatherWarps * (cutlass::NumThreadsPerWarp + 1);

// Key block n of a paged KV cache whose pages hold neither whole key blocks nor whole boxes of
// kPageBoxRows keys (or whose keys start inside a page), row by row with
// cp.async into one stage of sK (sVt), zero-filling rows past the sequence, columns past the head
// dim and rows whose page lies outside the cache (which also sets `fault`). The block's keys are
// consecutive positions of the cache row, so their pages are consecutive entries of the table's
// row: each lane first loads every 32nd of those entries (straight-line predicated loads, all in
// flight at once: one table latency per block), then two lanes copy each row, its page taken from
// the lane that holds its entry, so that a warp's 16-byte copies cover 16 whole rows. Measured
// before this form: a lane per row with the next row's lookup under this row's copies (0.72-1.43
// TB/s at page sizes 1-64 on the H100), and the rows' own lookups, one branch each, which ptxas
// serialised into one latency per 32 rows (0.68-0.91 TB/s on the H200). This form: 0.89-0.96 TB/s
// at page sizes 1-64 where K+V reach 256 MiB, 0.29-0.32 of the contiguous cache (H100, decode
// 32/8 d128, bench/compare.py decode --quick): the copies, not the lookups, limit it, so the
// gathering warps share a block's passes, warp `rank` of kGatherWarps taking every kGatherWarps-th.
// The row loop is not unrolled: unrolled, the copies of all rows spilled the producer's 24
// registers. `chunk_at(row, column)` is the shared memory
// address of a chunk; a row has kColumns columns in shared memory (the kernel's head dim of K or
// V), `columns` of them real.
template <class Traits, int kColumns, class ChunkAt>
CUTE_DEVICE void gather_key_block(const ForwardParams<Traits>& params, const RowTensor& src, int columns,
                                  const ForwardTile& t, int n, int rank, ChunkAt chunk_at, int& fault) {
  using Element = typename Traits::Element;
  constexpr int kChunkElements = 16 / sizeof(Element);
  constexpr int kChunksPerRow = kColumns / kChunkElements;
  constexpr int kWarp = cutlass::NumThreadsPerWarp;
  constexpr int kLanesPerRow = 2;
  constexpr int kRowsPerPass = kWarp / kLanesPerRow;
  // A block of kBlockN keys spans at most kBlockN table entries (page size 1; kBlockN / 2 + 1
  // at page size 2, fewer above).
  constexpr int kEntriesPerLane = (Traits::kBlockN + kWarp - 1) / kWarp;
  static_assert(Traits::kBlockN % kRowsPerPass == 0 && kChunksPerRow % kLanesPerRow == 0,
                "a pass copies whole rows");
  constexpr int kPastTheEnd = -2;  // a row past the sequence: zeros, no fault (-1: outside the cache)
  const KeyCache& cache = params.problem.key_cache;
  const int lane = threadIdx.x % kWarp;
  const GatheredBlock g = gathered_block(cache, t, n, Traits::kBlockN);
  int held[kEntriesPerLane];
  CUTE_UNROLL
  for (int j = 0; j < kEntriesPerLane; ++j) {
    const int e = j * kWarp + lane;
    held[j] = e < g.entries ? gathered_page(cache, t, g, e) : -1;
  }
#pragma unroll 1
  for (int pass = rank * kRowsPerPass; pass < Traits::kBlockN; pass += kGatherWarps * kRowsPerPass) {
    const int r = pass + lane / kLanesPerRow;
    const int e = g.entry(r, cache.page_size);
    // One shuffle per entry register and a select, rather than a computed index into `held`
    // (which ptxas puts in local memory).
    int page = kPastTheEnd;
    CUTE_UNROLL
    for (int j = 0; j < kEntriesPerLane; ++j) {
      const int shuffled = __shfl_sync(0xffffffff, held[j], e % kWarp);
      page = e / kWarp == j ? shuffled : page;
    }
    if (!g.real(r)) page = kPastTheEnd;
    fault |= page == -1;
    const bool real = page >= 0;
    const Element* row = static_cast<const Element*>(src.data);
    if (real) row = src.at<const Element>(page, g.row_in_page(r, cache.page_size), t.head_kv);
    CUTE_UNROLL
    for (int j = 0; j < kChunksPerRow / kLanesPerRow; ++j) {
      const int c = j * kLanesPerRow + lane % kLanesPerRow;
      const bool copied = real && c * kChunkElements < columns;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(chunk_at(r, c * kChunkElements)),
                   "l"(copied ? row + c * kChunkElements : row), "r"(copied ? 16 : 0)
                   : "memory");
    }
  }
}

// kHelper: warps 2 and 3 (gather_rank 1 and 2) walk the producer's tiles and blocks: with
// gathered key blocks each copies its share of every block's rows; with 16-key page boxes warp 2
// loads V (kVLoaderRank) while the producer loads K and Q; otherwise they return at once. A template
// parameter, so that the producer's own code (and its 24 registers) stays as it was.
template <class Traits, bool kHelper = false>
CUTE_DEVICE void forward_producer(const ForwardParams<Traits>& params, typename Traits::SharedStorage& smem,
                                  typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v,
                                  int gather_rank = 0) {
  using namespace cute;
  using Smem = ForwardSmemTensors<Traits>;
  cute::Tensor sQ = Smem::q(smem);
  cute::Tensor sK = Smem::k(smem);
  // FP8: V's TMA fills the v_rows ring, which the transposer warps turn into V^T's stages.
  cute::Tensor sVt = Smem::v_loaded(smem);
  cute::Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);     // (tokens, D, heads, batch)
  cute::Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);     // (tokens, D, heads_kv, batch)
  cute::Tensor mVt = params.tma_vt.get_tma_tensor(params.shape_vt);  // (Dv, tokens, heads_kv, batch)

  auto state_k = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  auto state_v = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  cutlass::PipelineState<Traits::kFp8 ? Traits::kVRowStages : 1> v_rows_state(0, 1, 0);  // FP8: producer of v_rows
  const bool gather = Traits::kLoadsSmallPages && params.problem.key_cache.gather;
  const bool v_beside = Traits::kLoadsSmallPages && loads_v_beside_producer(params.problem.key_cache);
  const bool v_loader = kHelper && v_beside && gather_rank == kVLoaderRank;
  if (kHelper && !gather && !v_loader) return;
  // 16-key page boxes: K (and Q) by the producer, V by the V loader; gathered blocks: both by
  // every gathering warp; otherwise both by the producer.
  const bool loads_k = !v_loader;
  const bool loads_v = !v_beside || v_loader;
  const bool leader = threadIdx.x % cutlass::NumThreadsPerWarp == 0;
  const bool boxes = Traits::kLoadsSmallPages && params.problem.key_cache.page_box_rows > 0;
  const bool wide_boxes = params.problem.key_cache.page_box_rows == kWidePageBoxRows;
  const int boxes_per_block = boxes ? Traits::kBlockN / params.problem.key_cache.page_box_rows : 0;
  const int lane = threadIdx.x % cutlass::NumThreadsPerWarp;
  const int total_tiles = params.scheduler.total_tiles();
  int round = 0;
  int slot = 0;
  uint32_t scheduled_phase = 0;
  for (;; ++round) {
    smem.scheduled_full[slot].wait(scheduled_phase);
    asm volatile("" ::: "memory");  // the read of the slot stays after the wait (acquire)
    const ScheduledTile scheduled = smem.scheduled[slot];
    // A helper has read the slot: the publisher waits for that before it reuses the slot. The
    // producer needs no such arrival (no tile is released before its Q, which the producer loads
    // after reading the slot), but the consumers release tiles without keys while a helper may
    // still copy an earlier tile's V.
    if constexpr (kHelper) {
      __syncwarp();  // every lane's read before the arrival
      if (cute::elect_one_sync()) smem.slot_read[slot].arrive();
    }
    const int tile_slot = slot;
    slot = next_published_tile_slot(slot);
    if (slot == 0) scheduled_phase ^= 1;
    if (scheduled.linear >= total_tiles) break;
    // The producer works out the tile's coordinates itself rather than wait for the publisher's:
    // it runs a tile or more ahead, and of the tile it keeps only what its loads need.
    const ForwardTile t = make_forward_tile(params, scheduled);
    if (t.n_blocks.empty()) {  // the consumers write it without loads, once q_full completes
      if constexpr (kHelper) continue;
      wait_query_released_before<Traits>(smem, round);
      if (leader) smem.q_full.arrive();
      continue;
    }

    // A negative first row (query_block_pad) reads zeros, or rows of the previous sequence in
    // varlen mode; those rows are never stored.
    cute::Tensor gQ = local_tile(domain_offset(make_coord(t.q_offset + t.first_row, _0{}), mQ(_, _, t.head, t.batch_coord)),
                           Shape<typename Traits::BlockM, typename Traits::HeadDim>{},
                           make_coord(_0{}, _0{}));  // (M, D)
    cute::Tensor gK = local_tile(domain_offset(make_coord(t.k_offset, _0{}, _0{}), mK(_, _, t.head_kv, _)),
                           Shape<typename Traits::BlockN, typename Traits::HeadDim>{},
                           make_coord(_, _0{}));  // (N, D, blocks, batch)
    cute::Tensor gVt = local_tile(domain_offset(make_coord(_0{}, t.k_offset, _0{}), mVt(_, _, t.head_kv, _)),
                            Shape<typename Traits::HeadDimV, typename Traits::BlockN>{},
                            make_coord(_0{}, _));  // (Dv, N, blocks, batch)
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    // (source, destination) pairs; the lambdas below take them whole (C++17 cannot capture a
    // structured binding).
    const auto k_copy = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    const auto v_copy = tma_partition(params.tma_vt, _0{}, Layout<_1>{}, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
    // Pages of whole boxes (KeyCache::page_box_rows): a stage as boxes of `rows` keys, and the
    // cache as (box rows, head dim, box of the page, page); K's and V's (source, destination) pairs.
    // Made where a block is loaded: kept from the tile's start, both box sizes' pairs spilled the
    // producer's 24 registers (96 bytes at d128).
    auto box_copies = [&](auto rows, auto const& k_tma, auto const& v_tma) {
      using BoxK = Shape<decltype(rows), typename Traits::HeadDim>;
      using BoxVt = Shape<typename Traits::HeadDimV, decltype(rows)>;
      cute::Tensor gKBox = local_tile(mK(_, _, t.head_kv, _), BoxK{}, make_coord(_, _0{}));      // (B, D, boxes, pages)
      cute::Tensor gVtBox = local_tile(mVt(_, _, t.head_kv, _), BoxVt{}, make_coord(_0{}, _));  // (Dv, B, boxes, pages)
      cute::Tensor sKBox = flat_divide(sK, BoxK{})(_, _, _, _0{}, _);     // (B, D, boxes, stages)
      cute::Tensor sVtBox = flat_divide(sVt, BoxVt{})(_, _, _0{}, _, _);  // (Dv, B, boxes, stages)
      return cute::make_tuple(
          tma_partition(k_tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sKBox), group_modes<0, 2>(gKBox)),
          tma_partition(v_tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sVtBox), group_modes<0, 2>(gVtBox)));
    };

    // The fault flag of this tile's slot (cleared by the publisher before it published the slot):
    // set before the arrivals on its stages, so that the consumers, who read it after their last
    // wait, see it.
    int fault = 0;  // gathered rows: whether this lane met a page outside the cache in this tile
    // With page boxes, where this lane's box of key block n lies (a lane per box, one table
    // latency a block; nothing for the other paths, which look their blocks up themselves). K
    // and V of a block lie on the same pages, so the loops below look a block's boxes up once for
    // both where V follows K. On paged chunked prefill (page 16, d128) the producer was the
    // bottleneck at about 560 instructions a block with the lookups and their divisions done for
    // K and again for V (ncu source counters, H100). Whole blocks keep a lookup each: shared,
    // their coordinate stayed in local memory across the copies and bought nothing measurable.
    auto page_boxes_at = [&](int n) -> KeyBlockCoord {
      const bool has_box = (Traits::kKeyGroupMajor || boxes) && lane < boxes_per_block;
      return has_box ? page_box_coord(params.problem.key_cache, t, n, lane, Traits::kBlockN)
                     : KeyBlockCoord{0, 0, false};
    };
    // A block's boxes: once the stage is free, each box's lane issues its copy: issue(lane, its
    // box's coordinates `at`, the stage's full barrier).
    auto load_boxes = [&](auto& pipeline, auto& state, const KeyBlockCoord& at, auto&& issue) {
      if (__any_sync(0xffffffff, at.fault) && leader) smem.page_faults[tile_slot] = 1;
      asm volatile("" ::: "memory");  // the fault store stays before the arrival below
      // Every lane waits for the stage; the leader's expected bytes cover all boxes, whose copies
      // may complete before it (the stage cannot complete without its arrival).
      pipeline.producer_acquire(state);
      if (lane < boxes_per_block) issue(lane, at, pipeline.producer_get_barrier(state));
    };
    // One K or V^T block into the next stage of its ring. Gathered, each lane's arrival on the
    // stage's full barrier comes when its cp.async copies complete (kGatherFullArrivals), and the
    // leader's after every lane's fault store (__syncwarp) publishes the fault flag. kColumns:
    // the rows' head dim in shared memory (K's or V's), `columns` the real one; kv:
    // _0 for K, _1 for V; `at`: this lane's box of the block where it is loaded in page boxes.
    auto load = [&](auto& pipeline, auto& storage, auto& state, auto const& tma, auto const& copies, auto kv,
                    auto chunk_at, const RowTensor& rows, auto kColumns, int columns, int n, const KeyBlockCoord& at) {
      if constexpr (Traits::kKeyGroupMajor) {  // page boxes only (with_forward_traits): one copy each
        constexpr int kKV = decltype(kv)::value;
        constexpr int kStageColumns = decltype(kColumns)::value;
        const KeyCache& cache = params.problem.key_cache;
        const int box_groups = cache.page_box_rows / kKeyGroupRows;
        const int page_groups = cache.page_size.divisor() / kKeyGroupRows;
        typename Traits::Element* stage = (kKV == 0 ? smem.k.data() : smem.v.data()) +
                                          state.index() * (Traits::kBlockN * kStageColumns);
        load_boxes(pipeline, state, at, [&](int box, const KeyBlockCoord& at, uint64_t* full) {
          // Past the sequence or the cache, at.batch is num_pages: past the tensor, zeros.
          const int group = at.batch * page_groups + at.block * box_groups;
          copy_page_rows(kKV == 0 ? params.k_page_rows : params.v_page_rows, full,
                         stage + box * (cache.page_box_rows * kStageColumns), t.head_kv, group);
        });
      } else if (boxes) {
        // Boxes of box_rows keys, K's or V's (kv).
        auto load_in = [&](auto box_rows, auto const& k_tma, auto const& v_tma) {
          constexpr int kKV = decltype(kv)::value;
          const auto pairs = box_copies(box_rows, k_tma, v_tma);
          auto const& box_tma = [&]() -> auto const& {
            if constexpr (kKV == 0) {
              return k_tma;
            } else {
              return v_tma;
            }
          }();
          auto const& copies = get<kKV>(pairs);
          load_boxes(pipeline, state, at, [&](int box, const KeyBlockCoord& at, uint64_t* full) {
            copy(box_tma.with(*full), get<0>(copies)(_, at.block, at.batch), get<1>(copies)(_, box, state.index()));
          });
        };
        // Wide boxes only where they divide the key block (Traits::kWidePageBoxes).
        if constexpr (Traits::kWidePageBoxes) {
          if (wide_boxes) {
            load_in(Int<kWidePageBoxRows>{}, params.tma_k_wide_box, params.tma_vt_wide_box);
          } else {
            load_in(Int<kPageBoxRows>{}, params.tma_k_box, params.tma_vt_box);
          }
        } else {
          load_in(Int<kPageBoxRows>{}, params.tma_k_box, params.tma_vt_box);
        }
      } else if (kHelper || gather) {  // (the V loader takes the branches above)
        storage.empty_barrier_[state.index()].wait(state.phase());
        gather_key_block<Traits, decltype(kColumns)::value>(
            params, rows, columns, t, n, gather_rank, [&](int r, int c) { return chunk_at(r, c, state.index()); }, fault);
        if (fault) smem.page_faults[tile_slot] = 1;
        cutlass::arch::cpasync_barrier_arrive_noinc(
            reinterpret_cast<uint64_t const*>(&storage.full_barrier_[state.index()]));
        __syncwarp();
        if (leader) storage.full_barrier_[state.index()].arrive();
      } else {
        const KeyBlockCoord whole = key_block_coord(params.problem.key_cache, t, n, Traits::kBlockN);
        if (whole.fault && leader) smem.page_faults[tile_slot] = 1;
        // CUTLASS's barrier asm has no memory clobber: keep the store before the arrival below.
        asm volatile("" ::: "memory");
        pipeline.producer_acquire(state);
        if (leader) {
          copy(tma.with(*pipeline.producer_get_barrier(state)), get<0>(copies)(_, whole.block, whole.batch),
               get<1>(copies)(_, state.index()));
        }
      }
      ++state;
    };
    auto k_chunk = [&](int r, int c, int stage) { return cute::cast_smem_ptr_to_uint(&sK(r, c, stage)); };
    auto v_chunk = [&](int r, int c, int stage) { return cute::cast_smem_ptr_to_uint(&sVt(c, r, stage)); };
    auto load_k = [&](int n, const KeyBlockCoord& at) {
      if (!loads_k) return;
      load(pipeline_k, smem.pipeline_k, state_k, params.tma_k, k_copy, _0{}, k_chunk, params.k, typename Traits::HeadDim{},
           params.problem.head_dim, n, at);
    };
    // FP8: V block n into the next v_rows stage once the transposers are done with it; they
    // write its V^T stage (fp8_v_transposer).
    auto load_v_rows = [&](int n) {
      const KeyBlockCoord at = key_block_coord(params.problem.key_cache, t, n, Traits::kBlockN);
      const int stage = v_rows_state.index();
      smem.v_rows_empty[stage].wait(v_rows_state.phase());
      if (leader) {
        smem.v_rows_full[stage].arrive_and_expect_tx(Traits::kVBytes);
        copy(params.tma_vt.with(reinterpret_cast<uint64_t&>(smem.v_rows_full[stage])), get<0>(v_copy)(_, at.block, at.batch),
             get<1>(v_copy)(_, stage));
      }
      ++v_rows_state;
    };
    auto load_v = [&](int n, const KeyBlockCoord& at) {
      if (!loads_v) return;
      if constexpr (Traits::kFp8) {
        load_v_rows(n);
      } else {
        load(pipeline_v, smem.pipeline_v, state_v, params.tma_vt, v_copy, _1{}, v_chunk, params.v,
             typename Traits::HeadDimV{}, params.problem.head_dim_v, n, at);
      }
    };
    const KeyBlockCoord last = page_boxes_at(t.n_blocks.end - 1);
    load_k(t.n_blocks.end - 1, last);  // while the consumers may still be in the previous tile's epilogue
    if constexpr (!kHelper) {  // Q is the producer's alone
      wait_query_released_before<Traits>(smem, round);  // sQ holds the previous tile's Q until then
      if (params.pack.divisor() > 1) {
        // The consumers load this tile's Q themselves (load_packed_query).
        if (leader) smem.q_full.arrive();
      } else if (leader) {
        smem.q_full.arrive_and_expect_tx(Traits::kQBytes);
        copy(params.tma_q.with(reinterpret_cast<uint64_t&>(smem.q_full)), tQgQ, tQsQ);
      }
    }
    if constexpr (Traits::kKeysAhead) {  // see ForwardTileShape; V looks its block up again
      for (int n = t.n_blocks.end - 1; n > t.n_blocks.begin; --n) {
        load_k(n - 1, page_boxes_at(n - 1));
        load_v(n, page_boxes_at(n));
      }
      load_v(t.n_blocks.begin, page_boxes_at(t.n_blocks.begin));
    } else {
      load_v(t.n_blocks.end - 1, last);
      for (int n = t.n_blocks.end - 2; n >= t.n_blocks.begin; --n) {
        const KeyBlockCoord at = page_boxes_at(n);
        load_k(n, at);
        load_v(n, at);
      }
    }
  }
  // The end marker's q_full phase takes the producer's arrival too, once the last tile is released.
  if constexpr (!kHelper) {
    wait_query_released_before<Traits>(smem, round);
    if (leader) smem.q_full.arrive();
  }
  if constexpr (Traits::kFp8) {  // the transposers' end marker, in the next v_rows stage
    smem.v_rows_empty[v_rows_state.index()].wait(v_rows_state.phase());
    if (leader) {
      smem.v_rows_end[v_rows_state.index()] = 1;
      asm volatile("" ::: "memory");  // the marker before the arrival that publishes it
      smem.v_rows_full[v_rows_state.index()].arrive();
    }
  }
  // The last gathered V block's copies may still be in flight (the consumers released the tile
  // after its last S GEMM, before its last P V): a thread does not leave with copies pending.
  if (gather) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// FP8: warps 2 and 3 of the producer warpgroup turn each block of the v_rows ring, in the order the
// producer loads them, into the next V^T stage (transpose_v_block), until the producer's end
// marker. A V^T stage's full barrier counts one arrival per transposer thread (forward_kernel).
template <class Traits>
CUTE_DEVICE void fp8_v_transposer(typename Traits::SharedStorage& smem) {
  using namespace cute;
  using Smem = ForwardSmemTensors<Traits>;
  cute::Tensor sVRows = Smem::v_rows(smem);
  cute::Tensor sVt = Smem::vt(smem);
  using Step = Fp8VTransposeStep;
  const int thread = static_cast<int>(threadIdx.x) - 2 * cutlass::NumThreadsPerWarp;
  const int warp = thread / cutlass::NumThreadsPerWarp, lane = thread % cutlass::NumThreadsPerWarp;
  cutlass::PipelineState<Traits::kVRowStages> rows;  // a consumer of v_rows
  auto stage = cutlass::make_producer_start_state<typename Traits::Pipeline>();  // a producer of V^T
  for (;; ++rows, ++stage) {
    smem.v_rows_full[rows.index()].wait(rows.phase());
    asm volatile("" ::: "memory");  // the marker is read after the wait
    if (smem.v_rows_end[rows.index()]) break;
    smem.pipeline_v.empty_barrier_[stage.index()].wait(stage.phase());
    const uint32_t from = cast_smem_ptr_to_uint(&sVRows(0, Step::source_key(lane), rows.index()));
    const uint32_t to =
        cast_smem_ptr_to_uint(&sVt(Step::target_column(lane), Step::target_position(lane), stage.index()));
    transpose_v_block<Traits>(from, to, warp);
    cutlass::arch::fence_view_async_shared();  // the V^T writes, towards the WGMMAs (async proxy)
    smem.pipeline_v.full_barrier_[stage.index()].arrive();
    smem.v_rows_empty[rows.index()].arrive();
  }
}

// Q of a tile that packs GQA heads: its rows are (query, head) pairs, strided two ways, which no
// TMA box covers, so each consumer warpgroup copies its own 64 rows (the only ones its S GEMMs
// read) with cp.async, 16 bytes per thread at a time, zero-filling rows outside the sequence and
// columns past the head dim. The warpgroup's previous S GEMMs are complete (it waited for them
// before its epilogue), so the rows are free. Its threads wait for their copies, fence them
// towards the async proxy (WGMMA reads sQ through it) and meet at the warpgroup's barrier. Done
// by the consumers, not the producer warp: with its 24 registers the producer spilled around the
// address arithmetic.
template <class Traits, class SmemQ>
CUTE_DEVICE void load_packed_query(const ForwardParams<Traits>& params, const ForwardTile& t, SmemQ& sQ, int thread) {
  using Element = typename Traits::Element;
  constexpr int kThreads = cutlass::NumThreadsPerWarpGroup;
  constexpr int kRows = 64;
  constexpr int kChunkElements = 16 / sizeof(Element);
  constexpr int kChunksPerRow = Traits::kHeadDim / kChunkElements;
  const int warpgroup = thread / kThreads;
  const int columns = params.problem.head_dim;
  // Not unrolled: unrolled, ptxas hoisted every copy's shared-memory address (a function of the
  // thread alone) to the kernel's start and kept them through the main loop, 100 bytes of spills.
#pragma unroll 1
  for (int i = thread % kThreads; i < kRows * kChunksPerRow; i += kThreads) {
    const int r = warpgroup * kRows + i / kChunksPerRow;
    const int column = i % kChunksPerRow * kChunkElements;
    const int row = t.first_row + r;
    const bool real = static_cast<unsigned>(row) < static_cast<unsigned>(t.rows(params.pack)) && column < columns;
    const Element* src = static_cast<const Element*>(params.q.data);
    if (real) {
      src = params.q.template at<Element>(t.batch, static_cast<long long>(t.q_offset) + t.query_of(row, params.pack),
                                          t.head_of(row, params.pack)) +
            column;
    }
    const uint32_t dst = cute::cast_smem_ptr_to_uint(&sQ(r, column));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(real ? 16 : 0) : "memory");
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(kThreads, barrier_id(FwdBarrier::kPackedQueryLoaded0, warpgroup));
}

// Ping-pong between consumer warpgroups: a warpgroup waits for its turn before issuing its GEMMs
// and hands the turn to the next one right after. Without ping-pong every call is a no-op.
template <class Traits>
struct WarpgroupTurns {
  static constexpr int kCount = Traits::kPingPong ? Traits::kConsumerWarpgroups : 1;
  static constexpr uint32_t kThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  int warpgroup;

  CUTE_DEVICE void start() const {  // the first warpgroup goes first
    if constexpr (kCount > 1) {
      if (warpgroup == kCount - 1) cutlass::arch::NamedBarrier::arrive(kThreads, barrier_id(FwdBarrier::kWarpScheduler0));
    }
  }
  CUTE_DEVICE void wait() const {
    if constexpr (kCount > 1) cutlass::arch::NamedBarrier::sync(kThreads, barrier_id(FwdBarrier::kWarpScheduler0, warpgroup));
  }
  CUTE_DEVICE void pass() const {
    if constexpr (kCount > 1) {
      cutlass::arch::NamedBarrier::arrive(kThreads,
                                          barrier_id(FwdBarrier::kWarpScheduler0, (warpgroup + 1) % kCount));
    }
  }
};

// Once the row maxima settle, most blocks leave them unchanged (every factor exactly 1): a warp
// then skips rescaling O, which costs as many multiplies as the softmax itself.
template <int kRows>
CUTE_DEVICE bool any_factor_below_one(const float (&rescale)[kRows]) {
  bool moved = false;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) moved |= rescale[r] != 1.f;
  return __any_sync(0xffffffff, moved);
}

// kPackedRows: the tiles pack GQA heads (params.pack > 1), see forward_kernel; kScores: what
// happens to a score before the softmax (score_variant.hpp).
template <class Traits, bool kPackedRows, ScoreVariant kScores>
CUTE_DEVICE void forward_consumer(const ForwardParams<Traits>& params, typename Traits::SharedStorage& smem,
                                  typename Traits::Pipeline& pipeline_k, typename Traits::Pipeline& pipeline_v) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Smem = ForwardSmemTensors<Traits>;
  const int thread = threadIdx.x - cutlass::NumThreadsPerWarpGroup;  // among the consumer threads
  const WarpgroupTurns<Traits> turns{thread / cutlass::NumThreadsPerWarpGroup};

  cute::Tensor sQ = Smem::q(smem);
  cute::Tensor sK = Smem::k(smem);
  cute::Tensor sVt = Smem::vt(smem);
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(thread);
  auto thr_pv = mma_pv.get_thread_slice(thread);
  cute::Tensor tSrQ = thr_qk.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K)
  cute::Tensor tSrK = thr_qk.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K, PIPE)
  cute::Tensor tOrVt = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, PIPE)
  // (m, n) coordinates of this thread's score entries, viewed as (rows, cols).
  cute::Tensor tScS = as_row_col(thr_qk.partition_C(make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::BlockN>{})));
  constexpr int kRows = decltype(size<0>(tScS))::value;

  typename Traits::PipelineState state_k, state_v;
  uint32_t q_phase = 0;
  const FastDivisor pack = kPackedRows ? params.pack : FastDivisor();
  const BandMask mask = params.problem.mask;
  constexpr bool kSoftcap = kScores == ScoreVariant::kSoftcap;
  const bool prescale = !kSoftcap && params.scale_log2 < 0.f;
  // With softcap the softmax runs on t = tanh(...) in [-1, 1], its exp2 factor softcap * log2(e).
  const float factor = kSoftcap ? params.softcap_log2 : (prescale ? 1.f : params.scale_log2);
  turns.start();

  // Masked entries become -inf. The mask's bounds are computed once per row, and only the
  // boundary blocks pay for them. A negative scale is applied here (see OnlineSoftmax), and the
  // softcap's tanh (softcap.cuh).
  auto prescale_and_mask = [&](auto& tSrS, const ForwardTile& t, int n_block) {
    cute::Tensor s = as_row_col(tSrS);
    if constexpr (kSoftcap) {
      CUTE_UNROLL
      for (int i = 0; i < size(s); ++i) s(i) = fast_tanh(s(i) * params.softcap_in);
    } else if (prescale) {
      CUTE_UNROLL
      for (int i = 0; i < size(s); ++i) s(i) *= params.scale_log2;
    }
    if (n_block >= t.unmasked.begin && n_block < t.unmasked.end) return;
    const BandView view = BandView::from_queries(mask, t.seqlen_q, t.seqlen_k);
    hide_invisible(s, tScS, view, t.first_row, n_block * Traits::kBlockN, -INFINITY, pack);
  };

  // Declared once for all tiles, and tiles without keys leave the loop body early: this form
  // measured 1% faster at d128 than state declared per tile with every tile on one path, for the
  // same work (docs/perf-log.md).
  OnlineSoftmax<kRows> softmax;
  float rescale[kRows];
  cute::Tensor tOrO = partition_fragment_C(mma_pv, Shape<typename Traits::BlockM, typename Traits::HeadDimV>{});
  cute::Tensor tSrS = partition_fragment_C(mma_qk, Shape<typename Traits::BlockM, typename Traits::BlockN>{});
  // P as the P V WGMMA's A operand: the accumulator's layout reread as 16-bit A, or for FP8 an
  // e4m3 copy in A's own order (fwd_fp8.cuh).
  cute::Tensor rP = make_tensor_like<Element>(tSrS);
  auto tOrP = [&] {
    if constexpr (Traits::kFp8) {
      return cute::make_tensor<Element>(cute::Shape<cute::Shape<_4, _2, _2>, _1, cute::Int<Traits::kBlockN / 32>>{});
    } else {
      return make_tensor(rP.data(), accumulator_as_a_operand_layout(rP.layout()));
    }
  }();
  auto convert_p = [&] {
    if constexpr (Traits::kFp8) {
      convert_p_to_fp8_operand(tSrS, tOrP);
    } else {
      convert_fragment(tSrS, rP);
    }
  };

  for (int slot = 0;; slot = next_published_tile_slot(slot)) {
    smem.q_full.wait(q_phase);
    q_phase ^= 1;
    asm volatile("" ::: "memory");  // the read of the published tile stays after the wait (acquire)
    // The slot stays this tile's until after its epilogue, which reads it again rather than
    // keeping the output coordinates in registers through the loop.
    const ForwardTile& published = smem.tiles[slot];
    const ForwardTile t = published;
    if (t.is_end_marker()) break;
    if (t.n_blocks.empty()) {  // no key to attend to: O = 0, LSE = -inf
      release_query<Traits>(smem);
      if (!t.has_rows(pack)) continue;
      // A faulted KV cache sequence (fwd_tile.hpp) saw no key either, but its rows are NaN.
      const float lse = published.faulted ? NAN : -INFINITY;
      if (params.scheduler.key_splits() > 1) {
        store_empty_split_partial<Traits>(params, t, key_split_of(params, smem.scheduled[slot]), pack, lse, thread);
      } else {
        store_empty_tile<Traits>(params, t, pack, lse, thread, Traits::kConsumerThreads);
      }
      continue;
    }

    if constexpr (kPackedRows) load_packed_query<Traits>(params, t, sQ, thread);
    // FP8: S's descale (q's times k's) joins the softmax's factor, O's (v's) its normalisation.
    float tile_factor = factor, out_descale = 1.f;
    if constexpr (Traits::kFp8) {
      tile_factor *= params.q_descale.at(t.batch, t.head_kv) * params.k_descale.at(t.batch, t.head_kv);
      out_descale = params.v_descale.at(t.batch, t.head_kv);
    }

    // The first (highest) key block: S, then its softmax with nothing to overlap yet.
    int n_block = t.n_blocks.end - 1;
    pipeline_k.consumer_wait(state_k);
    turns.wait();
    issue_warpgroup_gemm</*kZeroInit=*/true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
    turns.pass();
    warpgroup_wait<0>();
    pipeline_k.consumer_release(state_k);
    ++state_k;
    softmax.reset();
    prescale_and_mask(tSrS, t, n_block);
    softmax.template update<Traits::kFp8>(as_row_col(tSrS), tile_factor, rescale);
    convert_p();
    clear(tOrO);
    bool rescale_o = false;  // O is still zero

    // Steady state: S of block n is computed while P V of block n + 1 runs; the softmax of block
    // n runs once S is done, under P V. O's rescale for block n runs either under the next S GEMM
    // (before P V reads O) or right after this P V (see ForwardTileShape).
    for (--n_block; n_block >= t.n_blocks.begin; --n_block) {
      pipeline_k.consumer_wait(state_k);
      turns.wait();
      issue_warpgroup_gemm</*kZeroInit=*/true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
      if (Traits::kRescaleUnderQK && rescale_o) scale_rows(tOrO, rescale);
      pipeline_v.consumer_wait(state_v);
      issue_warpgroup_gemm</*kZeroInit=*/false>(mma_pv, tOrP, tOrVt(_, _, _, state_v.index()), tOrO);
      turns.pass();
      warpgroup_wait<1>();
      pipeline_k.consumer_release(state_k);
      ++state_k;
      prescale_and_mask(tSrS, t, n_block);
      softmax.template update<Traits::kFp8>(as_row_col(tSrS), tile_factor, rescale);
      rescale_o = any_factor_below_one(rescale);
      // ptxas moves this wait up to the start of the softmax, so that it can interleave the P
      // conversions below with the exponentials; held below the softmax (the overlap as written)
      // it measured 1-3% slower at d128/d256 (docs/perf-log.md), so the order is left to ptxas.
      warpgroup_wait<0>();
      pipeline_v.consumer_release(state_v);
      ++state_v;
      convert_p();
      if (!Traits::kRescaleUnderQK && rescale_o) scale_rows(tOrO, rescale);
    }

    release_query<Traits>(smem);  // every S GEMM of this tile is done
    if (Traits::kRescaleUnderQK && rescale_o) scale_rows(tOrO, rescale);
    pipeline_v.consumer_wait(state_v);
    issue_warpgroup_gemm</*kZeroInit=*/false>(mma_pv, tOrP, tOrVt(_, _, _, state_v.index()), tOrO);
    float inv_sum[kRows], lse[kRows];
    softmax.finalize(tile_factor, inv_sum, lse);
    warpgroup_wait<0>();
    pipeline_v.consumer_release(state_v);
    ++state_v;
    if (params.problem.key_cache.paged() && smem.page_faults[slot]) {  // after the tile's last wait
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) inv_sum[r] = lse[r] = NAN;
    }

    if constexpr (Traits::kFp8) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) inv_sum[r] *= out_descale;
    }
    scale_rows(tOrO, inv_sum);
    asm volatile("" ::: "memory");  // read the published tile here, not before the loop
    if (params.scheduler.key_splits() > 1) {  // a piece of the tile's keys: the combine kernel stores the tile
      store_split_partial<Traits>(params, published, key_split_of(params, smem.scheduled[slot]), pack, tOrO, thr_pv,
                                  lse, thread);
      continue;
    }
    const TailPiece piece = smem.scheduled[slot].piece;
    if (piece.writes_partial()) {  // a piece of a split tile: its owner stores the tile
      store_tail_partial<Traits>(params, piece.partial_slot, tOrO, lse, thread);
      continue;
    }
    if (piece.merge_count > 0) merge_tail_partials<Traits>(params, piece, tOrO, lse, thread);
    if (params.sinks != nullptr) add_sinks<Traits>(params, published, smem.sink_logits[slot], tOrO, tScS, lse, pack);
    store_tile<Traits>(params, published, tOrO, tScS, lse, pack, thread);
  }
}

}  // namespace hopattn
