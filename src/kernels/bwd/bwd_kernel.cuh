// The backward main kernel: barrier setup and warp roles. One CTA per tile (key block, head slice,
// KV head, batch), or persistent CTAs taking tiles in turn (Traits::kPersistent); warpgroup 0 is the
// producer group (warp 0 issues TMA, warp 1 writes dQ; in deterministic mode
// warps 1 .. kDeterministicDqWriters write dQ and warp 3 watches for their turns; all give
// registers back), warpgroups 1 and 2 run the GEMMs (see bwd_mainloop.cuh for how they share the
// tile).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "kernels/bwd/bwd_mainloop.cuh"
#include "kernels/common/kernel_setup.cuh"

namespace hopattn {

// kDeterministic: the dQ writer adds in key-block order (params.deterministic says the same at run
// time, for the grid order); a template parameter, so that neither mode's MMA loop carries the
// other's branches (a run-time branch around the stage release made ptxas wait on every WGMMA).
// kScores: the score variant (score_variant.hpp).
template <class Traits, bool kDeterministic, ScoreVariant kScores>
__global__ void __launch_bounds__(Traits::kThreads, 1) backward_kernel(CUTE_GRID_CONSTANT BackwardParams<Traits> const params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char shared_memory[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(shared_memory);
  using Pipeline = typename Traits::Pipeline;

  constexpr bool kPersistent = Traits::template kPersistent<kDeterministic>;
  // A role's work per tile, f(tile): every tile of this CTA (for_each_backward_tile; `publisher`
  // says whether the role takes the next tiles for the others, as the producer warp does), or its
  // one tile, found here before any role starts (the deterministic kernel's loop spilled with the
  // tile found inside each role: 24/32 -> 348/516 bytes at d128).
  const BackwardTile own_tile = make_backward_tile(params, blockIdx.x);
  if (!kPersistent && own_tile.n_block * Traits::kBlockN >= own_tile.seqlen_k) return;  // past its keys (varlen)
  auto for_each_tile = [&](auto&& f, auto publisher) {
    if constexpr (kPersistent) {
      for_each_backward_tile<Traits, decltype(publisher)::value>(params, smem.tile_ring, f);
    } else {
      f(own_tile);
    }
  };
  constexpr cute::true_type kPublisher{};
  constexpr cute::false_type kReader{};

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();
  if (warp == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_dout.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    if constexpr (!Traits::kSeparateQdOPipelines) smem.kv_full.init(/*arrive_count=*/1);
    if constexpr (kPersistent) smem.kv_empty.init(/*arrive_count=*/Traits::kMmaThreads);
    // The tiles' readers: the dQ writer warp and the MMA warps.
    if constexpr (kPersistent) smem.tile_ring.init(1 + Traits::kMmaThreads / cutlass::NumThreadsPerWarp);
  }
  // Q (with LSE) and dO (with D), in one pipeline or two (kSeparateQdOPipelines); with one,
  // pipeline_do's barriers are not even initialised and nothing uses it.
  Pipeline pipeline_q(smem.pipeline_q,
                      tma_pipeline_params<Pipeline>(warpgroup, Traits::kQStageBytes, Traits::kMmaThreads),
                      cute::Shape<cute::_1, cute::_1, cute::_1>{});
  Pipeline pipeline_do(smem.pipeline_do,
                       tma_pipeline_params<Pipeline>(warpgroup, Traits::kDOStageBytes, Traits::kMmaThreads),
                       cute::Shape<cute::_1, cute::_1, cute::_1>{}, cute::bool_constant<Traits::kSeparateQdOPipelines>{},
                       cute::true_type{});
  __syncthreads();  // barriers initialised before anyone waits on them

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp == 0) {
      BackwardRoleState<Traits> role{cutlass::make_producer_start_state<Pipeline>()};
      for_each_tile([&](const BackwardTile& t) {
        backward_producer<Traits, kPersistent>(params, smem, pipeline_q, pipeline_do, t, role);
      }, kPublisher);
    }
    // dQ writers: warp 1, or in deterministic mode warps 1 .. kDeterministicDqWriters.
    constexpr int kWriters = kDeterministic ? Traits::kDeterministicDqWriters : 1;
    static_assert(Traits::kMmaWarpgroups <= BackwardWorkspace::kDqShares, "a semaphore for each writer's shares");
    if (warp >= 1 && warp <= kWriters) {
      wait_for_previous_kernel();  // the preprocess clears the dQ accumulator and the semaphores
      // Only now may the postprocess start: without determinism it reads the counters the writer
      // raises instead of waiting for this kernel to complete, so the preprocess must have
      // cleared them.
      allow_next_kernel_to_start();
      constexpr int kShares = Traits::kMmaWarpgroups / kWriters;
      int32_t* finished = nullptr;
      for_each_tile([&](const BackwardTile& t) {
        backward_dq_writer<Traits, kDeterministic>(params, smem, t, /*writer=*/warp - 1, kShares, finished);
      }, kReader);
      backward_dq_writer_finish<kDeterministic>(finished);
    }
    if constexpr (kDeterministic) {
      constexpr int kWatcherWarp = cutlass::NumWarpsPerWarpGroup - 1;
      static_assert(kWriters < kWatcherWarp, "the turn watcher needs a warp of its own");
      if (warp == kWatcherWarp) {
        wait_for_previous_kernel();  // the preprocess clears the semaphores
        for_each_tile([&](const BackwardTile& t) { backward_turn_watcher<Traits>(params, t, kWriters); }, kReader);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    BackwardRoleState<Traits> role;
    for_each_tile([&](const BackwardTile& t) {
      backward_mma<Traits, kDeterministic, kScores, kPersistent>(params, smem, pipeline_q, pipeline_do, t, role);
    }, kReader);
  }
#endif
}

}  // namespace hopattn
