// The backward main kernel's three roles in one CTA (a block of kBlockN keys of one KV head):
// - the producer warp loads K and V once, then streams Q, dO and the rows' LSE and D for every
//   visible query block of every query head of its slice of the group through a kStages ring
//   (TMA, mbarriers);
// - the MMA warpgroups compute S^T = K Q^T and dP^T = V dO^T, turn them into P^T and dS^T in
//   registers, accumulate dV += P^T dO and dK += dS^T Q, and their share of dQ = dS K through dS^T
//   in shared memory. With 128 keys each warpgroup owns 64 keys and P^T / dS^T feed dV / dK from
//   registers; with 64 keys (d192/d256) the warpgroups split the queries of S^T / dP^T and the
//   head dim of dK / dV, and P^T / dS^T go through shared memory;
// - the dQ writer warp adds each block's dQ partial sums into the fp32 accumulator in global memory
//   with bulk reduce-adds, in key-block order when the call asks for determinism.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/bwd/bwd_params.cuh"
#include "kernels/common/accumulator_store.cuh"
#include "kernels/common/fast_exp2.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/mask_fragment.cuh"
#include "kernels/common/score_variant.hpp"
#include "kernels/common/softcap.cuh"
#include "kernels/common/mma_layouts.cuh"
#include "kernels/common/named_barriers.hpp"
#include "kernels/common/warpgroup_mma.cuh"

namespace hopattn {

template <class Traits>
struct BackwardSmemTensors {
  using SharedStorage = typename Traits::SharedStorage;
  template <class Layout, class T>
  CUTE_DEVICE static auto view(T* data) {
    return cute::make_tensor(cute::make_smem_ptr(data), Layout{});
  }
  CUTE_DEVICE static auto q(SharedStorage& s) { return view<typename Traits::SmemLayoutQ>(s.q.data()); }
  CUTE_DEVICE static auto qt(SharedStorage& s) { return view<typename Traits::SmemLayoutQt>(s.q.data()); }
  CUTE_DEVICE static auto dout(SharedStorage& s) { return view<typename Traits::SmemLayoutDO>(s.dout.data()); }
  CUTE_DEVICE static auto doutt(SharedStorage& s) { return view<typename Traits::SmemLayoutDOt>(s.dout.data()); }
  CUTE_DEVICE static auto k(SharedStorage& s) { return view<typename Traits::SmemLayoutK>(s.k.data()); }
  CUTE_DEVICE static auto kt(SharedStorage& s) { return view<typename Traits::SmemLayoutKt>(s.k.data()); }
  CUTE_DEVICE static auto v(SharedStorage& s) { return view<typename Traits::SmemLayoutV>(s.v.data()); }
  CUTE_DEVICE static auto ds(SharedStorage& s) { return view<typename Traits::SmemLayoutDS>(s.ds.data()); }
  CUTE_DEVICE static auto dst(SharedStorage& s) { return view<typename Traits::SmemLayoutDSt>(s.ds.data()); }
  CUTE_DEVICE static auto p(SharedStorage& s) { return view<typename Traits::SmemLayoutDS>(s.p.data()); }
};

// threadIdx.x read where it is used: a volatile read cannot be merged with earlier ones, so
// ptxas rematerializes it instead of keeping (or spilling) a value derived from it.
CUTE_DEVICE uint32_t thread_index_x_uncached() {
  uint32_t x;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(x));
  return x;
}

CUTE_DEVICE float opaque_zero() {
  float zero;
  asm volatile("mov.b32 %0, 0;\n" : "=f"(zero));
  return zero;
}

// The query heads of a KV head's group; a CTA visits those of its slice in order.
CUTE_DEVICE int group_size(const Problem& p) { return p.heads / p.heads_kv; }

// What a role carries from one of its CTA's tiles to the next (persistent CTAs): the Q/dO ring's
// position, and how many tiles' K and V went through their barriers (the phase of kv_full and
// kv_empty; tiles without a visible query block load none).
template <class Traits>
struct BackwardRoleState {
  typename Traits::PipelineState ring;
  int kv_tiles = 0;
};

// kPersistent: this CTA takes further tiles (backward_kernel).
template <class Traits, bool kPersistent>
CUTE_DEVICE void backward_producer(const BackwardParams<Traits>& params, typename Traits::SharedStorage& smem,
                                   typename Traits::Pipeline& pipeline_q, typename Traits::Pipeline& pipeline_do,
                                   const BackwardTile& t, BackwardRoleState<Traits>& role) {
  using namespace cute;
  using Smem = BackwardSmemTensors<Traits>;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  using HeadDimV = typename Traits::HeadDimV;
  const bool leader = threadIdx.x == 0;  // the pipelines' leader, which also arms the stage barriers

  // A CTA that sees no query writes zeros and loads nothing (it must not exit with loads in flight).
  if (t.m_blocks.empty()) return;
  cute::Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);
  cute::Tensor mV = params.tma_v.get_tma_tensor(params.shape_v);
  auto key_block = [&](auto& m, auto columns) {
    return local_tile(domain_offset(make_coord(t.k_offset, _0{}), m(_, _, t.head_kv, t.batch_coord)),
                      Shape<BlockN, decltype(columns)>{}, make_coord(t.n_block, _0{}));
  };
  cute::Tensor gK = key_block(mK, HeadDim{});
  cute::Tensor gV = key_block(mV, HeadDimV{});
  cute::Tensor sK = Smem::k(smem);
  cute::Tensor sV = Smem::v(smem);
  auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  constexpr bool kSeparate = Traits::kSeparateQdOPipelines;
  // The previous tile's K and V are free once the MMA warpgroups' last GEMMs of it completed.
  if (kPersistent && role.kv_tiles > 0) smem.kv_empty.wait((role.kv_tiles - 1) & 1);
  const bool first_tile = role.kv_tiles == 0;
  ++role.kv_tiles;
  if constexpr (!kSeparate) {  // K and V on a barrier of their own, then every block's stage after the preprocess
    if (leader) {
      smem.kv_full.arrive_and_expect_tx(Traits::kKVBytes);
      copy(params.tma_k.with(reinterpret_cast<uint64_t&>(smem.kv_full)), tKgK, tKsK);
      copy(params.tma_v.with(reinterpret_cast<uint64_t&>(smem.kv_full)), tVgV, tVsV);
    }
    if (first_tile) wait_for_previous_kernel();  // the preprocess writes the row statistics
  }

  cute::Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);
  cute::Tensor mdO = params.tma_dout.get_tma_tensor(params.shape_dout);
  cute::Tensor sQ = Smem::q(smem);
  cute::Tensor sdO = Smem::dout(smem);
  const BackwardWorkspace& ws = params.workspace;
  auto& state = role.ring;  // of each pipeline
  const int group = group_size(params.problem);
  bool first = true;
  for (int g = t.first_head; g < t.end_head; ++g) {
    const int head = t.head_kv * group + g;
    auto query_blocks = [&](auto& m, auto columns) {
      return local_tile(domain_offset(make_coord(t.q_offset, _0{}), m(_, _, head, t.batch_coord)),
                        Shape<BlockM, decltype(columns)>{}, make_coord(_, _0{}));  // (M, D, m_blocks)
    };
    cute::Tensor gQ = query_blocks(mQ, HeadDim{});
    cute::Tensor gdO = query_blocks(mdO, HeadDimV{});
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tdOgdO, tdOsdO] =
        tma_partition(params.tma_dout, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    const long long first_row = ws.row_index(head, t.padded_row);
    for (int m = t.m_blocks.begin; m < t.m_blocks.end; ++m) {
      const int stage = state.index();
      const long long row = first_row + static_cast<long long>(m) * Traits::kBlockM;
      // Separate pipelines: the first block's stages also carry K (with Q) and V (with dO), so
      // that its S^T GEMM waits for K, Q and LSE only. Q, dO, K and V are inputs of the call; the
      // row statistics come from the preprocess, so only their copies wait for it.
      pipeline_q.producer_acquire(state);
      uint64_t* q_full = pipeline_q.producer_get_barrier(state);
      if (leader) {
        if (kSeparate && first) {
          pipeline_q.producer_expect_transaction(state, Traits::kKBytes);
          copy(params.tma_k.with(*q_full), tKgK, tKsK);
        }
        copy(params.tma_q.with(*q_full), tQgQ(_, m), tQsQ(_, stage));
      }
      uint64_t* do_full = q_full;
      if constexpr (kSeparate) {
        pipeline_do.producer_acquire(state);
        do_full = pipeline_do.producer_get_barrier(state);
        if (leader && first) {
          pipeline_do.producer_expect_transaction(state, Traits::kVBytes);
          copy(params.tma_v.with(*do_full), tVgV, tVsV);
        }
      }
      if (leader) copy(params.tma_dout.with(*do_full), tdOgdO(_, m), tdOsdO(_, stage));
      if (kSeparate && first && first_tile) wait_for_previous_kernel();  // the preprocess writes the row statistics
      first = false;
      if (leader) {
        SM90_BULK_COPY_G2S::copy(ws.lse_log2 + row, q_full, smem.lse_log2.data() + stage * Traits::kBlockM,
                                 Traits::kRowStatBytes);
        SM90_BULK_COPY_G2S::copy(ws.dpsum + row, do_full, smem.dpsum.data() + stage * Traits::kBlockM,
                                 Traits::kRowStatBytes);
      }
      ++state;
    }
  }
}

namespace backward_detail {

CUTE_DEVICE void bulk_reduce_add(float* global, const float* shared, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :
               : "l"(global), "r"(cute::cast_smem_ptr_to_uint(shared)), "r"(bytes)
               : "memory");
}
// The MMA warpgroups' dQ staging stores (generic proxy) reach the writer through the named barrier;
// a proxy fence in the thread that issues the bulk reduce-add, after that barrier, orders them
// before the copy's async-proxy reads (PTX memory model: a proxy fence on the causality path from
// the writes to the async access, in the async access's CTA). One thread fences instead of every
// MMA thread before it arrives.
CUTE_DEVICE void staging_to_async_proxy() { cutlass::arch::fence_view_async_shared(); }
CUTE_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The committed bulk operations have finished reading shared memory.
CUTE_DEVICE void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// The committed bulk operations have completed, their writes to global memory included.
CUTE_DEVICE void bulk_wait_complete() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Adds to a semaphore with release semantics: this thread's earlier writes, the completed bulk
// reduce-adds included, are visible to whoever acquires the new value.
CUTE_DEVICE void release_add(int32_t* global, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(global), "r"(value) : "memory");
}
// Adds two floats to `global` (8-byte aligned) with one vector reduction.
CUTE_DEVICE void reduce_add2(float* global, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(global), "f"(a), "f"(b) : "memory");
}

}  // namespace backward_detail

// Without determinism: once the tile's bulk reduce-adds have completed, its key block's dQ is in
// and the postprocess may convert its query blocks (the counter `finished`, if any, is the tile's).
template <bool kDeterministic>
CUTE_DEVICE void backward_dq_writer_finish(int32_t*& finished) {
  if constexpr (!kDeterministic) {
    if (finished != nullptr && threadIdx.x % cutlass::NumThreadsPerWarp == 0) {
      backward_detail::bulk_wait_complete();
      __threadfence();
      atomicAdd(finished, 1);
    }
    finished = nullptr;
  }
}

// Deterministic mode: the turn watcher warp hands writer warp `writer` its turn at the next query
// block. Both warps wait here, each from its own place in the code, so the barrier is the unaligned
// form (CUTLASS's sync is bar.sync, .aligned: every thread that meets it must run the same
// instruction; synccheck reported the aligned form here as divergence).
template <class Traits>
CUTE_DEVICE void turn_handoff(int writer) {
  cutlass::arch::NamedBarrier(Traits::kTurnHandoffThreads, barrier_id(BwdBarrier::kTurn0, writer))
      .arrive_and_wait_unaligned();
}

// Deterministic mode: query block m of a head receives the key blocks' partial sums in descending
// key-block order. Every key block that sees m adds into it exactly once, and these key blocks are
// consecutive, so block n waits until (last key block of m - n) later ones have added; those were
// launched first (make_backward_tile), so the wait always ends. Descending, because a key block
// meets its query blocks in ascending order and under a causal or local mask a higher key block's
// first query block is no earlier than a lower one's: the key block that must add before n reached
// m no later than n did, and the key blocks of a head rarely wait (in ascending order they formed
// a wavefront, each waiting for the previous one at every query block).
//
// Writer `writer` writes the dQ shares of MMA warpgroups [writer * shares, (writer + 1) * shares);
// in deterministic mode they keep their order on the semaphore of the first (Traits::
// kDeterministicDqWriters says how many writer warps share a block).
//
// Without determinism a tile's end (its sums complete in global memory, then the counter the
// postprocess reads) waits in `finished` until the writer has announced the next tile's staging
// buffers empty, so that the MMA warpgroups' first handoff of that tile does not wait for it.
template <class Traits, bool kDeterministic>
CUTE_DEVICE void backward_dq_writer(const BackwardParams<Traits>& params, typename Traits::SharedStorage& smem,
                                    const BackwardTile& t, int writer, int shares, int32_t*& finished) {
  using namespace backward_detail;
  constexpr int kShareBytes = Traits::kDqFloatsPerWarpgroup * sizeof(float);
  const BackwardWorkspace& ws = params.workspace;
  const Problem& p = params.problem;
  const int group = group_size(p);
  const int blocks = (t.end_head - t.first_head) * t.m_blocks.size();
  const bool lane0 = threadIdx.x % cutlass::NumThreadsPerWarp == 0;
  // Every staging buffer starts the tile empty (announced only if used, so that no arrival is left
  // pending at exit).
  auto announce_empty = [&](int warpgroup) {
    cutlass::arch::NamedBarrier::arrive(Traits::kDqHandoffThreads, barrier_id(BwdBarrier::kDqEmpty0, warpgroup));
  };
  const int first_share = writer * shares, end_share = first_share + shares;
  for (int wg = first_share; wg < end_share && blocks > 0; ++wg) announce_empty(wg);
  backward_dq_writer_finish<kDeterministic>(finished);
  int done = 0;
  for (int g = t.first_head; g < t.end_head; ++g) {
    const int head = t.head_kv * group + g;
    const long long first_row = ws.row_index(head, t.padded_row);
    for (int m = t.m_blocks.begin; m < t.m_blocks.end; ++m) {
      const long long row = first_row + static_cast<long long>(m) * Traits::kBlockM;
      float* dq = ws.dq_accum + row * ws.head_dim;
      const bool last = done + 1 == blocks;
      if constexpr (kDeterministic) {
        int32_t* semaphore = ws.dq_share_semaphore(row, first_share);
        // A key block's turn at a query block comes after the previous key block's sums are in, so
        // the time from one turn to the next is on the query block's critical path: the writer
        // waits for the turn (seen by the watcher warp, backward_turn_watcher) before the staging
        // buffers fill, adds its shares back to back and hands the turn on with one release.
        turn_handoff<Traits>(writer);
        for (int wg = first_share; wg < end_share; ++wg) {
          cutlass::arch::NamedBarrier::sync(Traits::kDqHandoffThreads, barrier_id(BwdBarrier::kDqFull0, wg));
          if (lane0) {
            if (wg == first_share) asm volatile("fence.proxy.async.global;\n" ::: "memory");
            staging_to_async_proxy();
            const int offset = wg * Traits::kDqFloatsPerWarpgroup;
            bulk_reduce_add(dq + offset, smem.dq.data() + offset, kShareBytes);
            bulk_commit();
          }
        }
        if (lane0) bulk_wait_read();
        __syncwarp();
        for (int wg = first_share; wg < end_share && !last; ++wg) announce_empty(wg);
        if (lane0) {  // the next key block may add once these sums are in
          bulk_wait_complete();
          release_add(semaphore, 1);
        }
      } else {
        for (int wg = first_share; wg < end_share; ++wg) {
          cutlass::arch::NamedBarrier::sync(Traits::kDqHandoffThreads, barrier_id(BwdBarrier::kDqFull0, wg));
          if (lane0) {
            staging_to_async_proxy();
            const int offset = wg * Traits::kDqFloatsPerWarpgroup;
            bulk_reduce_add(dq + offset, smem.dq.data() + offset, kShareBytes);
            bulk_commit();
            bulk_wait_read();
          }
          __syncwarp();
          if (!last) announce_empty(wg);
        }
      }
      ++done;
    }
  }
  if constexpr (kDeterministic) {
    if (lane0) bulk_wait_complete();
  } else {
    finished = ws.finished_key_blocks(t.head_kv, group, t.padded_row);
  }
}

// Deterministic mode: waits for each writer warp's turns (its semaphore reaching this key block's
// order) one query block ahead of it and hands each over on the writer's turn barrier, so that the
// acquire's round trip (~0.43 us, a clock trace on the H100) runs while the writer completes and
// releases its previous block instead of adding to its turn: deterministic d128 +3-14%, GQA 0-14%,
// d256 +3-10% (H100). The barrier orders the watcher's acquire before the writer's reduce-add
// (which a proxy fence then orders for the bulk copy).
template <class Traits>
CUTE_DEVICE void backward_turn_watcher(const BackwardParams<Traits>& params, const BackwardTile& t, int writers) {
  const BackwardWorkspace& ws = params.workspace;
  const Problem& p = params.problem;
  const int group = group_size(p);
  const int lane = threadIdx.x % cutlass::NumThreadsPerWarp;
  const int shares = Traits::kMmaWarpgroups / writers;
  for (int g = t.first_head; g < t.end_head; ++g) {
    const long long first_row = ws.row_index(t.head_kv * group + g, t.padded_row);
    for (int m = t.m_blocks.begin; m < t.m_blocks.end; ++m) {
      if (lane < writers) {  // lane w: writer w's semaphore
        const long long row = first_row + static_cast<long long>(m) * Traits::kBlockM;
        const int32_t* semaphore = ws.dq_share_semaphore(row, lane * shares);
        const int order =
            n_block_range(p.mask, m, Traits::kBlockM, Traits::kBlockN, t.seqlen_q, t.seqlen_k).end - 1 - t.n_block;
        while (load_acquire(semaphore) != order) __nanosleep(32);
      }
      __syncwarp();
      for (int w = 0; w < writers; ++w) turn_handoff<Traits>(w);
    }
  }
}

// With head slices: adds this CTA's dK (already scaled) and dV of its key block's real keys into
// the workspace's fp32 accumulators, two neighbouring columns per reduction; in deterministic mode
// the slices of a key block add one after the other, in slice order. dk_coords / dv_coords: the
// (key, column) of each accumulator entry.
template <class Traits, bool kDeterministic, class AccK, class CoordsK, class AccV, class CoordsV>
CUTE_DEVICE void add_key_block_slice(const BackwardParams<Traits>& params, const BackwardTile& t, AccK const& dk,
                                     CoordsK const& dk_coords, AccV const& dv, CoordsV const& dv_coords, int thread) {
  using namespace cute;
  const BackwardWorkspace& ws = params.workspace;
  const long long first_row =
      ws.key_row_index(t.head_kv, t.padded_key_row) + static_cast<long long>(t.n_block) * Traits::kBlockN;
  int32_t* semaphore = ws.kv_semaphore(first_row);
  if constexpr (kDeterministic) {
    if (thread == 0) {
      while (load_acquire(semaphore) != t.slice) __nanosleep(64);
    }
    cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, barrier_id(BwdBarrier::kScoresPublished));
  }
  auto add = [&](auto const& acc, auto const& coords, float* sums, int row_length) {
    cute::Tensor values = as_row_col(acc);  // (rows, columns): columns 2c and 2c + 1 are neighbours
    CUTE_UNROLL
    for (int r = 0; r < size<0>(values); ++r) {
      const int row = get<0>(coords(r, 0));
      if (t.n_block * Traits::kBlockN + row >= t.seqlen_k) continue;
      float* sum_row = sums + (first_row + row) * row_length;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(values); c += 2) {
        backward_detail::reduce_add2(sum_row + get<1>(coords(r, c)), values(r, c), values(r, c + 1));
      }
    }
  };
  add(dk, dk_coords, ws.dk_accum, ws.head_dim);
  add(dv, dv_coords, ws.dv_accum, ws.head_dim_v);
  if constexpr (kDeterministic) {  // the next slice may add once these sums are in
    __threadfence();
    cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, barrier_id(BwdBarrier::kScoresPublished));
    if (thread == 0) atomicAdd(semaphore, 1);
  }
}

// kScores: what happens to a score before the softmax (score_variant.hpp).
template <class Traits, bool kDeterministic, ScoreVariant kScores, bool kPersistent>
CUTE_DEVICE void backward_mma(const BackwardParams<Traits>& params, typename Traits::SharedStorage& smem,
                              typename Traits::Pipeline& pipeline_q, typename Traits::Pipeline& pipeline_do,
                              const BackwardTile& t, BackwardRoleState<Traits>& role) {
  // The stage goes back after the dQ handoff where dK runs under it (kDqBeforeDk), in both modes:
  // the deterministic kernel once released it before the handoff (waiting for dK first), when
  // its handoffs waited on long key-block chains; the L2-section order and the writer's shorter
  // turn made those waits short (bwd_grid_order.hpp).
  constexpr bool kReleaseBeforeHandoff = !Traits::kDqBeforeDk;
  using namespace cute;
  using Element = typename Traits::Element;
  using Smem = BackwardSmemTensors<Traits>;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  using HeadDimV = typename Traits::HeadDimV;
  constexpr int kWgThreads = cutlass::NumThreadsPerWarpGroup;
  const int thread = threadIdx.x - kWgThreads;  // among the MMA threads

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDK mma_dk;
  typename Traits::TiledMmaDV mma_dv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(thread);
  // A shared-memory operand is one descriptor for all 128 threads of a warpgroup: partitioned by
  // the warpgroup's first thread, made warp-uniform, the descriptors stay in uniform registers
  // instead of being rebuilt in per-thread registers and moved over before every WGMMA.
  const int warpgroup_thread = (cutlass::canonical_warp_group_idx() - 1) * kWgThreads;
  auto wg_sdp = mma_sdp.get_slice(warpgroup_thread);
  auto wg_dk = mma_dk.get_slice(warpgroup_thread);
  auto wg_dv = mma_dv.get_slice(warpgroup_thread);
  auto wg_dq = mma_dq.get_slice(warpgroup_thread);

  cute::Tensor tSrK = wg_sdp.partition_fragment_A(Smem::k(smem));        // (MMA, MMA_N, MMA_K)
  cute::Tensor tSrQ = wg_sdp.partition_fragment_B(Smem::q(smem));        // (MMA, MMA_M, MMA_K, PIPE)
  cute::Tensor tdPrV = wg_sdp.partition_fragment_A(Smem::v(smem));
  cute::Tensor tdPrdO = wg_sdp.partition_fragment_B(Smem::dout(smem));
  cute::Tensor tdVrdOt = wg_dv.partition_fragment_B(Smem::doutt(smem));  // (MMA, MMA_D, MMA_M, PIPE)
  cute::Tensor tdKrQt = wg_dk.partition_fragment_B(Smem::qt(smem));
  cute::Tensor tdQrdS = wg_dq.partition_fragment_A(Smem::dst(smem));  // (MMA, MMA_M, MMA_K, PIPE)
  cute::Tensor tdQrKt = wg_dq.partition_fragment_B(Smem::kt(smem));
  // dS^T (with split queries P^T too) goes to shared memory through stmatrix, 16 bytes of a thread
  // (four 8x8 tiles a warp) per instruction. An element-wise copy through the swizzled layout
  // compiled to a 4-byte generic store per register, each with a 64-bit address of its own (32
  // stores and their address registers per block at d64).
  // The destination's swizzle acts on offsets within one stage (CuTe's position-independent
  // form) and a stage is a pointer offset, so this thread's swizzled offsets are the same every
  // block. Swizzled through the pointer (CuTe's default for shared memory), the stage being a
  // runtime coordinate, every block recomputed each 64-bit address and its XOR: six instructions
  // per stmatrix, 48 per block at d64, whose kernels then spilled in the loop. With the 64-bit
  // descriptor adds (k_step_operand) the d64 backward gained 5-6% (H100, both modes).
  auto score_store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_score_store = score_store.get_thread_slice(thread);
  constexpr int kScoreStageElements = typename Traits::SmemLayoutDS{}.layout_b()(0, 0, 1);
  static_assert(kScoreStageElements * sizeof(Element) % 1024 == 0,
                "a stage is whole swizzle periods (1024 bytes), so it moves the swizzled layout as a whole");
  auto stage_of = [&](auto const& stage0, int stage) {
    return make_tensor(stage0.data() + stage * kScoreStageElements, stage0.layout());
  };
  cute::Tensor tdSsdS = thr_score_store.partition_D(as_position_independent_swizzle_tensor(Smem::ds(smem)(_, _, 0)));

  // (key, query) of every score entry this thread holds, relative to the tile.
  cute::Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<BlockN, BlockM>{}));

  cute::Tensor tdVrdV = partition_fragment_C(mma_dv, Shape<BlockN, HeadDimV>{});
  cute::Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<BlockN, HeadDim>{});
  // Zeros the optimizer cannot see as constants: a plain clear() was hoisted above the register
  // reallocation (setmaxnreg), where the kernel's entry budget of 168 registers could not hold
  // dK and dV, and ptxas then kept them in local memory and serialized the WGMMAs (d192/d256).
  const float zero = opaque_zero();
  fill(tdVrdV, zero);
  fill(tdKrdK, zero);

  if (!t.m_blocks.empty()) {
    cute::Tensor tSrS = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});
    cute::Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});
    cute::Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});
    cute::Tensor rP = make_tensor_like<Element>(tSrS);
    cute::Tensor rdS = make_tensor_like<Element>(tdPrdP);

    const BandMask mask = params.problem.mask;
    const float scale_log2 = params.scale_log2;
    const int first_key = t.n_block * Traits::kBlockN;
    constexpr bool kSoftcap = kScores == ScoreVariant::kSoftcap;
    // dS^T = P^T * (dP^T - D), to the element type. With softcap, times d tanh = 1 - t^2, with t
    // recovered from P itself, t = (log2 P + LSE log2) / (softcap log2 e): kept from P's
    // computation instead, 32 more live registers at d128 spilled in the loop. P is 0 or at least
    // FLT_MIN (fast_exp2 flushes), and a zero P makes dS 0 whatever t.
    auto compute_ds = [&](const float* dpsum, const float* lse_log2) {
      CUTE_UNROLL
      for (int i = 0; i < size(tdPrdP); ++i) {
        tdPrdP(i) = tSrS(i) * (tdPrdP(i) - dpsum[get<1>(cS(i))]);
        if constexpr (kSoftcap) {
          const float p = tSrS(i);
          const float tanh_score = (fast_log2(p) + lse_log2[get<1>(cS(i))]) * params.softcap_log2_inverse;
          tdPrdP(i) *= p > 0.f ? fmaf(-tanh_score, tanh_score, 1.f) : 0.f;
        }
      }
      convert_fragment(tdPrdP, rdS);
    };
    // The scores this thread wrote to shared memory (dS^T; with split queries P^T too) become
    // visible to the WGMMAs (async proxy) once every MMA thread has written its entries. The proxy
    // fence comes after the barrier, on the path from every thread's stores to this thread's
    // WGMMAs (the PTX memory model's placement for a fence in the async access's CTA): the warps
    // arrive without first waiting for their own stores (MEMBAR.ALL.CTA before the arrival).
    auto publish_scores = [&] {
      cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, barrier_id(BwdBarrier::kScoresPublished));
      cutlass::arch::fence_view_async_shared();
    };
    // With one stage the dS^T buffer is rewritten every block while the other warpgroup's dQ GEMM
    // of the last block may still read it (the Q/dO stage goes back before that GEMM ends): each
    // warpgroup arrives here with its own dQ GEMM done.
    auto wait_until_scores_read = [&] {
      if constexpr (Traits::kStages == 1) {
        cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, barrier_id(BwdBarrier::kScoresPublished));
      }
    };
    auto& state = role.ring;  // of each pipeline
    constexpr bool kSeparate = Traits::kSeparateQdOPipelines;
    static_assert(kSeparate == kReleaseBeforeHandoff, "separate pipelines release their stages before the dQ handoff");
    if constexpr (!kSeparate) smem.kv_full.wait(kPersistent ? role.kv_tiles & 1 : 0);
    for (int g = t.first_head; g < t.end_head; ++g) {
      for (int m = t.m_blocks.begin; m < t.m_blocks.end; ++m) {
        const int stage = state.index();
        pipeline_q.consumer_wait(state);  // (separate: the first block's stage carries K too, and V dO's)
        issue_warpgroup_gemm</*kZeroInit=*/true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
        if constexpr (kSeparate) pipeline_do.consumer_wait(state);
        issue_warpgroup_gemm</*kZeroInit=*/true>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), tdPrdP);

        // P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)); padding rows carry LSE = +inf, so P = 0.
        // With softcap, P^T = exp2(t * softcap * log2(e) - LSE * log2(e)), t = tanh(S^T * softcap_in).
        const float* lse_log2 = smem.lse_log2.data() + stage * Traits::kBlockM;
        const float* dpsum = smem.dpsum.data() + stage * Traits::kBlockM;
        warpgroup_wait<1>();
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) {
          if constexpr (kSoftcap) {
            tSrS(i) = fast_exp2(fmaf(fast_tanh(tSrS(i) * params.softcap_in), params.softcap_log2,
                                     -lse_log2[get<1>(cS(i))]));
          } else {
            tSrS(i) = fast_exp2(fmaf(tSrS(i), scale_log2, -lse_log2[get<1>(cS(i))]));
          }
        }
        // Boundary blocks only (a warp-uniform branch): hidden pairs get P = 0, and with it dS = 0.
        if (t.masked(m)) {
          const BandView view = BandView::from_keys(mask, t.seqlen_q, t.seqlen_k);
          hide_invisible(as_row_col(tSrS), as_row_col(cS), view, first_key, m * Traits::kBlockM, 0.f);
        }
        auto issue_dq = [&] {
          issue_warpgroup_gemm</*kZeroInit=*/true>(mma_dq, tdQrdS(_, _, _, stage), tdQrKt, tdQrdQ);
        };
        if constexpr (Traits::kSplitQueries) {
          cute::Tensor tPsP = thr_score_store.partition_D(as_position_independent_swizzle_tensor(Smem::p(smem)(_, _, 0)));
          cute::Tensor tdVsP = wg_dv.partition_fragment_A(Smem::p(smem));  // (MMA, MMA_N, MMA_M, PIPE)
          cute::Tensor tdKsdS = wg_dk.partition_fragment_A(Smem::ds(smem));
          convert_fragment(tSrS, rP);
          copy(score_store, thr_score_store.retile_S(rP), stage_of(tPsP, stage));
          warpgroup_wait<0>();  // dP^T
          compute_ds(dpsum, lse_log2);
          wait_until_scores_read();
          copy(score_store, thr_score_store.retile_S(rdS), stage_of(tdSsdS, stage));
          publish_scores();
          issue_warpgroup_gemm</*kZeroInit=*/false>(mma_dv, tdVsP(_, _, _, stage), tdVrdOt(_, _, _, stage), tdVrdV);
          issue_warpgroup_gemm</*kZeroInit=*/false>(mma_dk, tdKsdS(_, _, _, stage), tdKrQt(_, _, _, stage), tdKrdK);
          issue_dq();
        } else {
          cute::Tensor tdVrP = make_tensor(rP.data(), accumulator_as_a_operand_layout(rP.layout()));
          cute::Tensor tdKrdS = make_tensor(rdS.data(), accumulator_as_a_operand_layout(rdS.layout()));
          auto issue_dk = [&] {
            issue_warpgroup_gemm</*kZeroInit=*/false>(mma_dk, tdKrdS, tdKrQt(_, _, _, stage), tdKrdK);
          };
          if constexpr (Traits::kDvUnderDs) {
            convert_fragment(tSrS, rP);
            issue_warpgroup_gemm</*kZeroInit=*/false>(mma_dv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV);
            warpgroup_wait<1>();  // dP^T
            compute_ds(dpsum, lse_log2);
          } else {
            warpgroup_wait<0>();  // dP^T
            compute_ds(dpsum, lse_log2);
            convert_fragment(tSrS, rP);
            issue_warpgroup_gemm</*kZeroInit=*/false>(mma_dv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV);
          }
          if constexpr (!Traits::kDqBeforeDk) issue_dk();
          wait_until_scores_read();
          copy(score_store, thr_score_store.retile_S(rdS), stage_of(tdSsdS, stage));
          publish_scores();
          issue_dq();
          if constexpr (Traits::kDqBeforeDk) issue_dk();
        }
        if constexpr (Traits::kDqBeforeDk) {
          warpgroup_wait<1>();  // dV and dQ; dK runs on while dQ goes to shared memory
        } else {
          // dV and dK; with kReleaseStageBeforeDq the dQ GEMM may still run while the stages go back.
          warpgroup_wait<Traits::kReleaseStageBeforeDq ? 1 : 0>();
          pipeline_do.consumer_release(state);
          pipeline_q.consumer_release(state);
          if constexpr (Traits::kReleaseStageBeforeDq) warpgroup_wait<0>();  // dQ
        }

        // Hand the partial dQ to the writer warp in register order, once it has read out the last
        // block's: conflict-free stores, and the postprocess kernel reads the same order back.
        // Read again each block: kept in a register across the loop, the handoff's barrier ids were
        // spilled to local memory at d64 (two loads a block).
        const int warpgroup = static_cast<int>(thread_index_x_uncached()) / kWgThreads - 1;
        cutlass::arch::NamedBarrier::sync(Traits::kDqHandoffThreads, barrier_id(BwdBarrier::kDqEmpty0, warpgroup));
        float* dq = smem.dq.data();
        static_assert(decltype(size(tdQrdQ))::value % 4 == 0, "dQ values move in groups of four");
        CUTE_UNROLL
        for (int i = 0; i < size(tdQrdQ); i += 4) {
          *reinterpret_cast<float4*>(dq + Traits::dq_staging_offset(i, thread)) =
              make_float4(tdQrdQ(i), tdQrdQ(i + 1), tdQrdQ(i + 2), tdQrdQ(i + 3));
        }
        // No proxy fence here: the writer warp fences after the barrier (backward_dq_writer). Here it
        // compiled to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S on every MMA warp's path each block; a build
        // without it ran d64 4%, d128 1-2% faster (H100).
        cutlass::arch::NamedBarrier::arrive(Traits::kDqHandoffThreads, barrier_id(BwdBarrier::kDqFull0, warpgroup));
        if constexpr (!kReleaseBeforeHandoff) {
          warpgroup_wait<0>();  // dK
          pipeline_q.consumer_release(state);
        }
        ++state;
      }
    }
    // Every GEMM of the tile has completed (the last block's waits): K and V may be replaced.
    if constexpr (kPersistent) {
      smem.kv_empty.arrive();
      ++role.kv_tiles;
    }
  }

  // Epilogue: dK (times the softmax scale) and dV of the block's real keys, in the input dtype, or
  // with head slices added in fp32 into the workspace for the dK/dV postprocess.
  cute::Tensor cdK = as_row_col(mma_dk.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<BlockN, HeadDim>{})));
  cute::Tensor cdV = as_row_col(mma_dv.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<BlockN, HeadDimV>{})));
  const float scale = params.problem.softmax_scale;
  CUTE_UNROLL
  for (int i = 0; i < size(tdKrdK); ++i) tdKrdK(i) *= scale;
  if (params.head_slices > 1) {
    add_key_block_slice<Traits, kDeterministic>(params, t, tdKrdK, cdK, tdVrdV, cdV, thread);
    return;
  }
  const int quad_lane = thread % 4;
  auto store = [&](auto const& acc, auto const& coords, int columns, const RowTensor& out) {
    auto key_row = [&](int tile_row) -> Element* {  // null past the sequence's last key
      const int key = t.n_block * Traits::kBlockN + tile_row;
      return key < t.seqlen_k ? out.at<Element>(t.batch, static_cast<long long>(t.k_offset) + key, t.head_kv) : nullptr;
    };
    const int first_column = get<1>(coords(0, 0)) - 2 * quad_lane;  // this warpgroup's share of the head dim
    store_accumulator_rows<Element>(acc, coords, first_column, columns, key_row, quad_lane);
  };
  store(tdVrdV, cdV, params.problem.head_dim_v, params.dv);
  store(tdKrdK, cdK, params.problem.head_dim, params.dk);
}

}  // namespace hopattn
