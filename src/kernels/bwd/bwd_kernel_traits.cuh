// Compile-time description of one backward kernel: tiles, the four WGMMA tilings, shared-memory
// layouts (each operand once, with transposed views where a GEMM reads it the other way round) and
// the shared storage they add up to.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <type_traits>

#include "kernels/bwd/bwd_tile_config.hpp"
#include "kernels/bwd/bwd_tile_stream.cuh"
#include "kernels/bwd/bwd_workspace.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/named_barriers.hpp"
#include "kernels/common/register_split.hpp"
#include "kernels/common/swizzle_atoms.cuh"

namespace hopattn {

// The same shared-memory tensor read with its two modes swapped (e.g. Q as Q^T): a WGMMA then sees
// an MN-major operand, which it reads natively.
template <class Layout, class Rows, class Cols>
using TransposedLayout = decltype(cute::composition(
    Layout{}, cute::make_layout(cute::Shape<Cols, Rows>{}, cute::Stride<Rows, cute::_1>{})));
template <class Layout, class Rows, class Cols, class Stages>
using TransposedStagedLayout = decltype(cute::composition(
    Layout{}, cute::make_layout(cute::Shape<Cols, Rows, Stages>{},
                                cute::Stride<Rows, cute::_1, cute::Int<Rows::value * Cols::value>>{})));

// kHeadDim: Q, K, dQ and dK's head dim; kHeadDimV: V, dO and dV's (head_dim_v pairs).
template <typename Element_, int kHeadDim_, int kHeadDimV_, class Config_ = BackwardTileConfig<kHeadDim_>>
struct BackwardKernelTraits {
  using Element = Element_;
  using Config = Config_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;

  // Where the keys are split between the warpgroups, P^T feeds the dV GEMM from registers. With 64
  // queries the dV GEMM is issued before dS^T is computed and runs under it; with 128, fp32 P^T,
  // its 16-bit copy and dP^T (64 + 32 + 64 registers besides dK and dV) do not fit at once
  // (ptxas then serializes the WGMMAs), so dS^T comes first and P^T's fp32 registers die as it
  // is converted.
  static constexpr bool kDvUnderDs = kBlockM == 64;
  // Q, dO and the row statistics of a block are done with once its dV and dK GEMMs are; only the
  // dQ GEMM (dS^T and K) is still running. With a single stage the producer could not load the
  // next block until then, so the stage goes back early (d256: +6-7%). With two stages the next
  // block is already loaded and releasing early measured no gain at d128.
  static constexpr bool kReleaseStageBeforeDq = kStages == 1;

  static constexpr int kMmaWarpgroups = 2;
  static_assert(kMmaWarpgroups <= kMaxBwdMmaWarpgroups, "BwdBarrier reserves ids for at most kMaxBwdMmaWarpgroups");
  // With 128 keys each warpgroup owns 64 of them. With 64 keys (d192/d256, where 64 keys per
  // warpgroup leave no registers for dK and dV) the warpgroups split the block's queries for
  // S^T / dP^T and the head dim for dK / dV; P^T and dS^T then reach the dV / dK GEMMs through
  // shared memory, since neither warpgroup holds all of a key's scores.
  static constexpr bool kSplitQueries = kBlockN == 64;
  // The dK GEMM is issued after the dQ GEMM, so that it runs while the warpgroup stores dQ to
  // shared memory for the writer warp (instead of the tensor cores idling until the next block's
  // S^T): d64 +1-2%, d128 +2.5-5.5% (d128 spilled with dV under dS^T until dS^T went to shared
  // memory through stmatrix). The stage then goes back after the handoff (backward_mma).
  static constexpr bool kDqBeforeDk = !kSplitQueries;
  // Where the CTA takes 64 keys, Q (with LSE) and dO (with D) come in pipelines of their own, as in
  // FlashAttention-3/4: the S^T GEMM waits for Q only, and the first block's stages also carry K
  // and V. Measured on an H100 for every head dim (docs/perf-log.md, twenty-third session): d256
  // +2.4-3.5% deterministic and +0-4% default, its loop's spills gone; but d64 -1 to -2.4% and
  // GQA 64/8 causal 16k -4% at d128 (the loop's second wait and release). With 128 keys one
  // pipeline carries a block's Q, dO and row statistics, and K and V have a barrier of their own.
  // As here (twenty-seventh session, H100): d256 +2.3% default, +3.0% deterministic, the rest level.
  static constexpr bool kSeparateQdOPipelines = kSplitQueries;
  // Persistent CTAs, one per SM taking the tiles in the grid's order (bwd_tile_stream.cuh), without
  // determinism (the launcher takes them for short tiles only, launch_backward_gradients): the next
  // tile's K and V load once the MMA warpgroups' last GEMMs of a tile have read them (kv_empty),
  // under its dK/dV epilogue and last dQ handoff, and the Q/dO ring runs on across tiles. One CTA
  // per tile paid for that start and end on every tile: about four blocks' time a CTA at d128 (a
  // fit of the 512 and 16k rows of a full run, docs/perf-log.md). The deterministic kernel's loop
  // spilled (d128: 24/32 -> 388/488 bytes) with the tile loop around it.
  template <bool kDeterministic>
  static constexpr bool kPersistent = !kDeterministic;
  static constexpr int kScoreWarpgroups = kBlockN / 64;                      // along the keys
  static constexpr int kHeadDimSplits = kMmaWarpgroups / kScoreWarpgroups;  // of dK and dV
  static constexpr int kQuerySplits = kHeadDimSplits;                        // of S^T and dP^T
  static constexpr int kMmaThreads = kMmaWarpgroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kThreads = kMmaThreads + cutlass::NumThreadsPerWarpGroup;  // + producer group
  // The producer group holds the TMA warp and the dQ writer warp; the MMA warpgroups hold the
  // dK and dV accumulators for the whole CTA lifetime and need the registers.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kMmaRegisters = 240;
  static_assert(kBlockN == 64 || kBlockN == 128, "64 keys per CTA (shared scores) or per MMA warpgroup");
  static_assert(BackwardWorkspace::kRowBlock % kBlockM == 0 && kBlockM % BackwardWorkspace::kSemaphoreRows == 0,
                "query blocks must tile the workspace's row blocks and own a semaphore each");
  static_assert(register_split_fits(kMmaWarpgroups, kProducerRegisters, kMmaRegisters),
                "the MMA warpgroups' registers must come from those the producer group releases");
  static_assert(kHeadDim % 32 == 0 && kHeadDimV % 32 == 0, "kernel head dims are multiples of 32");

  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using HeadDimV = cute::Int<kHeadDimV>;
  using Stages = cute::Int<kStages>;

  // S^T = K Q^T and dP^T = V dO^T, (keys, queries): both operands K-major in shared memory. With
  // keys as the rows, P^T and dS^T come out in the layout of the dV and dK GEMMs' A operands. The
  // atom depends on M and N only: one tiling serves both GEMMs whatever their K (head dims).
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kBlockM / kQuerySplits>, HeadDim>>(),
      cute::Layout<cute::Shape<cute::Int<kScoreWarpgroups>, cute::Int<kQuerySplits>, cute::_1>>{}));
  // dK += dS^T Q and dV += P^T dO, (keys, head dim), Q^T and dO^T MN-major. A comes from the
  // registers that computed it, or with split queries from P^T / dS^T in shared memory.
  template <int kColumns>
  using MmaKeyRowsShape = cute::Shape<cute::_64, cute::Int<kColumns / kHeadDimSplits>, BlockM>;
  template <int kColumns>
  using MmaKeyRowsAtom = std::conditional_t<
      kSplitQueries,
      decltype(cute::GMMA::ss_op_selector<Element, Element, float, MmaKeyRowsShape<kColumns>, cute::GMMA::Major::K,
                                          cute::GMMA::Major::MN>()),
      decltype(cute::GMMA::rs_op_selector<Element, Element, float, MmaKeyRowsShape<kColumns>, cute::GMMA::Major::K,
                                          cute::GMMA::Major::MN>())>;
  template <int kColumns>
  using TiledMmaKeyRows = decltype(cute::make_tiled_mma(
      MmaKeyRowsAtom<kColumns>{},
      cute::Layout<cute::Shape<cute::Int<kScoreWarpgroups>, cute::Int<kHeadDimSplits>, cute::_1>>{}));
  using TiledMmaDK = TiledMmaKeyRows<kHeadDim>;
  using TiledMmaDV = TiledMmaKeyRows<kHeadDimV>;
  // dQ = dS K, (queries, head dim), dS^T and K read transposed (MN-major), over all keys, so one
  // partial sum per query block leaves the CTA. With 128 queries each warpgroup takes 64 of them
  // over the whole head dim; otherwise each takes half of the head dim. At d64 the head-dim split
  // made the GEMM N = 32 wide: a 64 x 32 x 16 SS WGMMA reads 3 KB of shared memory (24 cycles at
  // 128 bytes a cycle) for 16 cycles of tensor-core work, where 64 x 64 x 16 reads 4 KB in 32.
  // Measured with the per-warpgroup dQ handoff below: d64 +4% (docs/perf-log.md).
  static constexpr bool kDqSplitsQueries = kBlockM == 64 * kMmaWarpgroups;
  static constexpr int kDqHeadDimSplits = kDqSplitsQueries ? 1 : kMmaWarpgroups;
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kHeadDim / kDqHeadDimSplits>, BlockN>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<kMmaWarpgroups / kDqHeadDimSplits>, cute::Int<kDqHeadDimSplits>, cute::_1>>{}));

  // Q and dO; where dK/dV split the head dim, each half of Q^T / dO^T must be whole atoms.
  template <int kColumns>
  using SmemLayoutQueryRows = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::K, Element, kColumns / kHeadDimSplits>(),
      cute::Shape<BlockM, cute::Int<kColumns>, Stages>{}));
  using SmemLayoutQ = SmemLayoutQueryRows<kHeadDim>;
  using SmemLayoutQt = TransposedStagedLayout<SmemLayoutQ, BlockM, HeadDim, Stages>;
  using SmemLayoutDO = SmemLayoutQueryRows<kHeadDimV>;
  using SmemLayoutDOt = TransposedStagedLayout<SmemLayoutDO, BlockM, HeadDimV, Stages>;
  // K: where the dQ GEMM reads K^T split in two along the head dim, each half must be whole
  // swizzle atoms: 128-byte swizzle at d64/d128/d256, 64-byte at d192, 32-byte at d96. V (read only
  // K-major, by dP^T) takes the same rule where its head dim is K's, so that the two stay alike.
  template <int kColumns>
  using SmemLayoutKeyRows = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::K, Element, kColumns / kDqHeadDimSplits>(),
      cute::Shape<BlockN, cute::Int<kColumns>>{}));
  using SmemLayoutK = SmemLayoutKeyRows<kHeadDim>;
  using SmemLayoutKt = TransposedLayout<SmemLayoutK, BlockN, HeadDim>;
  using SmemLayoutV = SmemLayoutKeyRows<kHeadDimV>;
  // dS^T (keys, queries), one buffer per pipeline stage: a warpgroup may write the next block's
  // dS^T while the other still reads this block's in its dQ GEMM. P^T (split queries only) alike.
  using SmemLayoutDS = decltype(cute::tile_to_shape(widest_swizzle_atom<cute::GMMA::Major::K, Element, kBlockM>(),
                                                    cute::Shape<BlockN, BlockM, Stages>{}));
  using SmemLayoutDSt = TransposedStagedLayout<SmemLayoutDS, BlockN, BlockM, Stages>;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kDOBytes = kBlockM * kHeadDimV * sizeof(Element);
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kKVBytes = kKBytes + kVBytes;
  // A stage of each pipeline: Q and LSE, dO and D (the first block's also K, V: bwd_mainloop.cuh);
  // with one pipeline (kSeparateQdOPipelines false) the Q stage carries all four.
  static constexpr uint32_t kDOStageBytes = kDOBytes + kRowStatBytes;
  static constexpr uint32_t kQStageBytes = kQBytes + kRowStatBytes + (kSeparateQdOPipelines ? 0 : kDOStageBytes);
  // The dQ of one query block, as it travels to dq_accum: each MMA warpgroup stages its share in
  // a buffer of its own and hands it to the writer warp on a barrier pair of its own (the writer
  // warp and that warpgroup), so a warpgroup never waits for the other's handoff.
  static constexpr int kDqFloatsPerWarpgroup = kBlockM * kHeadDim / kMmaWarpgroups;
  static constexpr uint32_t kDqHandoffThreads = cutlass::NumThreadsPerWarpGroup + cutlass::NumThreadsPerWarp;
  // Deterministic mode: writer warps, each with the shares of kMmaWarpgroups / writers warpgroups
  // and a semaphore (a turn) of its own per query block. One warp's turn a block (wait for it, add,
  // wait until the sums are in, hand it on) took ~2.4 us at d128 against the MMA warpgroups' 2.0
  // (a clock trace, H100), so it set every CTA's pace; a warp per share: deterministic d128 / d256
  // and GQA +4-13% (docs/perf-log.md, thirty-first session). With 128-row blocks (d64) the one
  // warp kept up, and two lost 4-6% at 16k.
  static constexpr int kDeterministicDqWriters = kBlockM == 64 ? kMmaWarpgroups : 1;
  // Deterministic mode's turn handoff: the turn watcher warp and one writer warp
  // (BwdBarrier::kTurn0, backward_turn_watcher).
  static constexpr uint32_t kTurnHandoffThreads = 2 * cutlass::NumThreadsPerWarp;
  static_assert(kMmaWarpgroups % kDeterministicDqWriters == 0, "writers share the warpgroups evenly");
  // Where accumulator value i of MMA thread `thread` sits in a staged block: its warpgroup's share,
  // then groups of four values per thread, so that each thread moves 16 bytes at a time and a
  // warp's accesses are contiguous. The main kernel stores and the postprocess reads in this order.
  CUTE_HOST_DEVICE static constexpr int dq_staging_offset(int i, int thread) {
    constexpr int kWgThreads = cutlass::NumThreadsPerWarpGroup;
    return thread / kWgThreads * kDqFloatsPerWarpgroup + ((i / 4) * kWgThreads + thread % kWgThreads) * 4 + i % 4;
  }

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    // A token size where P^T stays in registers.
    cute::array_aligned<Element, kSplitQueries ? cute::cosize_v<SmemLayoutDS> : 8, kSplitQueries ? 1024 : 16> p;
    cute::array_aligned<float, kMmaWarpgroups * kDqFloatsPerWarpgroup, 128> dq;
    cute::array_aligned<float, kStages * kBlockM, 128> lse_log2;
    cute::array_aligned<float, kStages * kBlockM, 128> dpsum;
    cutlass::arch::ClusterTransactionBarrier kv_full;  // K and V, with one pipeline
    cutlass::arch::ClusterBarrier kv_empty;            // K and V read by the MMA warpgroups (persistent CTAs)
    BackwardTileRing tile_ring;                        // persistent CTAs' next tiles (bwd_tile_stream.cuh)
    typename Pipeline::SharedStorage pipeline_q;
    typename Pipeline::SharedStorage pipeline_do;  // with separate pipelines
  };
  static constexpr int kSharedBytes = sizeof(SharedStorage);
  static_assert(kSharedBytes <= kMaxSharedBytesPerCta, "shared storage exceeds what an sm_90 CTA can have");
};

}  // namespace hopattn
