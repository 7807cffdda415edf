// The backward main kernel: barrier setup and warp roles. One CTA per (key block, KV head, batch);
// warpgroup 0 is the producer group (warp 0 issues TMA, warp 1 writes dQ; in deterministic mode
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

  const BackwardTile t = make_backward_tile(params);
  if (t.n_block * Traits::kBlockN >= t.seqlen_k) return;  // past this sequence's keys (varlen)

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();
  if (warp == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_dout.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    if constexpr (!Traits::kSeparateQdOPipelines) smem.kv_full.init(/*arrive_count=*/1);
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
    if (warp == 0) backward_producer<Traits>(params, smem, pipeline_q, pipeline_do, t);
    // dQ writers: warp 1, or in deterministic mode warps 1 .. kDeterministicDqWriters.
    constexpr int kWriters = kDeterministic ? Traits::kDeterministicDqWriters : 1;
    static_assert(Traits::kMmaWarpgroups <= BackwardWorkspace::kDqShares, "a semaphore for each writer's shares");
    if (warp >= 1 && warp <= kWriters) {
      constexpr int kShares = Traits::kMmaWarpgroups / kWriters;
      backward_dq_writer<Traits, kDeterministic>(params, smem, t, /*writer=*/warp - 1, kShares);
    }
    if constexpr (kDeterministic) {
      constexpr int kWatcherWarp = cutlass::NumWarpsPerWarpGroup - 1;
      static_assert(kWriters < kWatcherWarp, "the turn watcher needs a warp of its own");
      if (warp == kWatcherWarp) backward_turn_watcher<Traits>(params, t, kWriters);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    backward_mma<Traits, kDeterministic, kScores>(params, smem, pipeline_q, pipeline_do, t);
  }
#endif
}

}  // namespace hopattn
