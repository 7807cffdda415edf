// The forward kernel: warp roles, shared storage and barrier setup. One persistent CTA per SM;
// warpgroup 0 is the producer (one warp issues TMA, one publishes the tiles, the other two help
// gather small pages or, with FP8 inputs, transpose V; the group gives registers back),
// warpgroups 1.. are the consumers (64 query rows each, they take the registers).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/kernel_setup.cuh"
#include "kernels/fwd/fwd_mainloop.cuh"

namespace hopattn {

// kPackedRows: the tiles' rows pack GQA heads (params.pack > 1; fwd_split_plan.hpp), on a tile
// of their own (ForwardPackedTileConfig). A kernel of its own: with both consumers in one kernel,
// the packed rows' mask (a division per row) and Q copies cost the other one's main loop 100-300
// bytes of spills at d128. kScores: the score variant (score_variant.hpp).
template <class Traits, bool kPackedRows, ScoreVariant kScores>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    forward_kernel(CUTE_GRID_CONSTANT ForwardParams<Traits> const params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char shared_memory[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(shared_memory);
  using Pipeline = typename Traits::Pipeline;

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();
  if (warp == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_vt.get_tma_descriptor());
    if constexpr (Traits::kKeyGroupMajor) {  // its page boxes' own descriptors (the box copies' are unset)
      cute::prefetch_tma_descriptor(&params.k_page_rows);
      cute::prefetch_tma_descriptor(&params.v_page_rows);
    } else {
      if (Traits::kLoadsSmallPages && params.problem.key_cache.page_box_rows == kPageBoxRows) {
        cute::prefetch_tma_descriptor(params.tma_k_box.get_tma_descriptor());
        cute::prefetch_tma_descriptor(params.tma_vt_box.get_tma_descriptor());
      }
      if (Traits::kLoadsSmallPages && params.problem.key_cache.page_box_rows == kWidePageBoxRows) {
        cute::prefetch_tma_descriptor(params.tma_k_wide_box.get_tma_descriptor());
        cute::prefetch_tma_descriptor(params.tma_vt_wide_box.get_tma_descriptor());
      }
    }
    smem.q_full.init(/*arrive_count=*/2);  // the producer's and the publisher's
    smem.q_released.init(Traits::kQueryReleaseArrivals);
    for (auto& b : smem.scheduled_full) b.init(/*arrive_count=*/1);  // the publisher's
    // The helpers' reads: the two gather helpers', or the V loader's (loads_v_beside_producer).
    const int slot_readers = params.problem.key_cache.gather ? kGatherWarps - 1 : 1;
    for (auto& b : smem.slot_read) b.init(slot_readers);
    if constexpr (Traits::kFp8) {
      for (auto& b : smem.v_rows_full) b.init(/*arrive_count=*/1);  // the producer's
      for (auto& b : smem.v_rows_empty) b.init(kFp8TransposerThreads);
      for (int& end : smem.v_rows_end) end = 0;
    }
  }

  auto k_params = tma_pipeline_params<Pipeline>(warpgroup, Traits::kKBytes, Traits::kConsumerThreads);
  auto v_params = tma_pipeline_params<Pipeline>(warpgroup, Traits::kVBytes, Traits::kConsumerThreads);
  // Gathered key blocks (a paged cache whose pages do not hold whole blocks) complete a stage with
  // the producer lanes' arrivals, not with a TMA transaction (forward_producer).
  if (Traits::kLoadsSmallPages && params.problem.key_cache.gather) {
    k_params.num_producers = v_params.num_producers = kGatherFullArrivals;
  }
  // With the V loader, V's stages expect their bytes from its first lane (forward_producer;
  // helper rank r is warp r + 1, the publisher being warp 1).
  if (Traits::kLoadsSmallPages && loads_v_beside_producer(params.problem.key_cache)) {
    v_params.is_leader = threadIdx.x == (kVLoaderRank + 1) * cutlass::NumThreadsPerWarp;
  }
  // FP8: the transposer threads complete a V^T stage (fp8_v_transposer).
  if constexpr (Traits::kFp8) v_params.num_producers = kFp8TransposerThreads;
  Pipeline pipeline_k(smem.pipeline_k, k_params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  Pipeline pipeline_v(smem.pipeline_v, v_params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  __syncthreads();  // barriers initialised before anyone waits on them
  // After a KV cache's append, everything below may read what it writes (the cache, key counts,
  // rotated q): only the set-up above overlaps it.
  if (params.problem.after_append) wait_for_previous_kernel();
  // Key splits: the combine kernel behind this one may launch at once, its CTAs taking SMs as this
  // kernel's leave them, so that its launch does not wait for the last of them; it waits for this
  // kernel's completion before it reads anything (fwd_split_combine.cuh).
  if (params.scheduler.key_splits() > 1) allow_next_kernel_to_start();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp == 0) forward_producer<Traits>(params, smem, pipeline_k, pipeline_v);
    if (warp == 1) forward_tile_publisher<Traits>(params, smem);
    if constexpr (Traits::kFp8) {
      if (warp >= 2) fp8_v_transposer<Traits>(smem);
    }
    // Warps 2 and 3 help gather key blocks of small pages (kGatherWarps), warp 2 loads V of 16-key
    // page boxes (kVLoaderRank), and they return at once otherwise: ranks 1 and 2 beside the producer's 0.
    if constexpr (Traits::kLoadsSmallPages) {
      if (warp >= 2) forward_producer<Traits, /*kHelper=*/true>(params, smem, pipeline_k, pipeline_v, warp - 1);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    forward_consumer<Traits, kPackedRows, kScores>(params, smem, pipeline_k, pipeline_v);
  }
#endif
}

}  // namespace hopattn
