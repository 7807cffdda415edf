// Host side of the forward kernel: TMA descriptors from the validated problem, the tile schedule,
// and the launch. Included only by the generated instantiation units.
#pragma once

#include <cute/tensor.hpp>

#include <algorithm>
#include <type_traits>

#include "kernels/common/constants.hpp"
#include "kernels/common/cutlass_element.hpp"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/kernel_setup.cuh"
#include "kernels/common/tma_tensors.cuh"
#include "kernels/fwd/forward_kernels.hpp"
#include "kernels/fwd/fwd_kernel.cuh"
#include "kernels/fwd/fwd_kernel_traits.cuh"
#include "kernels/fwd/fwd_split_combine.cuh"
#include "kernels/fwd/fwd_split_plan.hpp"
#include "kernels/fwd/fwd_workspace.cuh"

namespace hopattn {

namespace forward_launch_detail {

// CTAs of the persistent grid: one per SM (the split tail's workspace has a slot per CTA).
inline int persistent_ctas(const DeviceLimits& device) { return std::max(device.multiprocessors, 1); }

// Packed GQA heads and key splits for `p` (fwd_split_plan.hpp); splits only with a workspace.
template <class Traits>
ForwardSplitPlan forward_split_plan(const Problem& p, const DeviceLimits& device, bool workspace) {
  ForwardSplitInputs in;
  in.batch = p.batch;
  in.heads = p.heads;
  in.heads_kv = p.heads_kv;
  in.max_seqlen_q = p.max_seqlen_q;
  in.max_seqlen_k = p.max_seqlen_k;
  in.block_m = Traits::kBlockM;
  in.block_n = Traits::kBlockN;
  in.ctas = persistent_ctas(device);
  in.num_splits = p.num_splits;
  in.pack_gqa = Traits::kPackedRows ? p.pack_gqa : PackGqa::kOff;  // see with_forward_traits
  in.workspace = workspace;
  return choose_forward_split(in);
}

// Tiles (query blocks x tile heads x batch) of `p` with `pack` rows per query.
template <class Traits>
long long forward_problem_tiles(const Problem& p, int pack) {
  return static_cast<long long>(forward_m_blocks(p.max_seqlen_q, pack, Traits::kBlockM)) * (p.heads / pack) * p.batch;
}

// The split tail this kernel would use for `p` on `device` (see TileScheduler): only where every
// tile has the same key blocks, i.e. without a mask and with fixed lengths, and the tiles are not
// split along their keys already.
template <class Traits>
TailSplit forward_tail_split(const Problem& p, const ForwardSplitPlan& layout, const DeviceLimits& device) {
  if (!p.mask.unbounded() || !p.uniform_lengths() || layout.split()) return TailSplit{};
  const long long tiles = forward_problem_tiles<Traits>(p, layout.pack);
  const int key_blocks = (p.max_seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  return TailSplit::choose(tiles, key_blocks, persistent_ctas(device));
}

// What the kernel does for `p` on `device`, with or without a workspace: packed heads (either
// way); with one, key splits, the split tail where every tile has the same key blocks, and the
// dynamic schedule where tile lengths vary (a mask or varlen) and there are more tiles (pieces of
// split tiles) than CTAs. With no more than one each there is nothing to balance, and the static
// schedule needs no counter, so no reset kernel: 2.2 us of a 32/1 decode step of about 33 (H100).
struct ForwardWorkspacePlan {
  ForwardSplitPlan layout;
  TailSplit tail;
  bool dynamic = false;

  bool needed() const { return dynamic || tail.enabled() || layout.split(); }
};

template <class Traits>
ForwardWorkspacePlan forward_workspace_plan(const Problem& p, const DeviceLimits& device, bool workspace) {
  ForwardWorkspacePlan plan;
  plan.layout = forward_split_plan<Traits>(p, device, workspace);
  if (!workspace) return plan;
  plan.tail = forward_tail_split<Traits>(p, plan.layout, device);
  const long long pieces = forward_problem_tiles<Traits>(p, plan.layout.pack) * plan.layout.splits;
  plan.dynamic = (!p.mask.unbounded() || !p.uniform_lengths()) && pieces > persistent_ctas(device);
  return plan;
}

// Output rows (query token, head) that the key splits' partials cover.
inline long long forward_output_rows(const Problem& p) { return p.total_q() * p.heads; }

// The workspace the plan asks for (key splits' partials, the tail's, the dynamic schedule's counter).
template <class Traits>
size_t forward_workspace_bytes_for(const Problem& p, const DeviceLimits& device) {
  const ForwardWorkspacePlan plan = forward_workspace_plan<Traits>(p, device, /*workspace=*/true);
  if (!plan.needed()) return 0;
  return ForwardWorkspace<Traits>::bytes_for(persistent_ctas(device), plan.tail.enabled(),
                                             plan.layout.split() ? plan.layout.splits : 0, forward_output_rows(p));
}

// The token and batch extents of K/V's TMA tensors: a KV cache's (capacity, cache rows), or
// paged (page_size, num_pages); else those of the keys' layout.
struct KeyTensorExtent {
  int32_t tokens;
  int32_t batch;
};

inline KeyTensorExtent key_tensor_extent(const Problem& p) {
  const KeyCache& cache = p.key_cache;
  if (cache.paged()) return KeyTensorExtent{cache.page_size.divisor(), cache.num_pages};
  if (cache.enabled()) return KeyTensorExtent{p.keys.fixed_length, cache.rows};
  if (p.keys.varlen()) return KeyTensorExtent{static_cast<int32_t>(p.total_k()), 1};
  return KeyTensorExtent{p.max_seqlen_k, p.batch};
}

// How a tile with key blocks of block_n keys loads `problem`'s cache (choose_paged_loads' choice).
inline KeyCache paged_loads(const Problem& problem, int block_n) {
  KeyCache cache = problem.key_cache;
  choose_paged_loads(cache, problem.keys.start != nullptr, block_n);
  return cache;
}

// `workspace`: null, or forward_workspace_bytes_for() bytes.
template <class Traits>
ForwardParams<Traits> make_forward_params(const Problem& p, const ForwardTensors& t, const DeviceLimits& device,
                                          void* workspace) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Params = ForwardParams<Traits>;
  const bool varlen = p.varlen();
  const int32_t q_tokens = static_cast<int32_t>(varlen ? p.total_q() : p.max_seqlen_q);
  const int32_t batch = varlen ? 1 : p.batch;
  const KeyTensorExtent keys = key_tensor_extent(p);
  const int32_t k_tokens = keys.tokens;
  const int64_t q_span = tma_unused_stride({t.q.row_stride * q_tokens, t.q.head_stride * p.heads, 8});
  const int64_t k_span = tma_unused_stride({t.k.row_stride * k_tokens, t.k.head_stride * p.heads_kv,
                                            t.v.row_stride * k_tokens, t.v.head_stride * p.heads_kv, 8});

  Params params{};
  params.shape_q = make_shape(q_tokens, int32_t(p.head_dim), int32_t(p.heads), batch);
  params.shape_k = make_shape(k_tokens, int32_t(p.head_dim), int32_t(p.heads_kv), keys.batch);
  params.shape_vt = make_shape(int32_t(p.head_dim_v), k_tokens, int32_t(p.heads_kv), keys.batch);
  auto vt_stride = make_stride(_1{}, tma_stride(t.v.row_stride, k_tokens, k_span),
                               tma_stride(t.v.head_stride, p.heads_kv, k_span),
                               tma_stride(t.v.batch_stride, keys.batch, k_span));
  cute::Tensor mQ = tma_tokens_tensor<Element>(t.q, q_tokens, p.head_dim, p.heads, batch, q_span);
  cute::Tensor mK = tma_tokens_tensor<Element>(t.k, k_tokens, p.head_dim, p.heads_kv, keys.batch, k_span);
  // V viewed as V^T (head dim, tokens): bf16 WGMMA reads it so from shared memory, FP8 transposes
  // it there first (fwd_fp8.cuh).
  cute::Tensor mVt = make_tensor(make_gmem_ptr(static_cast<Element const*>(t.v.data)), params.shape_vt, vt_stride);
  params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Traits::SmemLayoutQ{},
                               Shape<typename Traits::BlockM, typename Traits::HeadDim>{}, _1{});
  params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                               Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, _1{});
  params.tma_vt = make_tma_copy(SM90_TMA_LOAD{}, mVt, take<0, 2>(typename Traits::SmemLayoutVLoaded{}),
                                Shape<typename Traits::HeadDimV, typename Traits::BlockN>{}, _1{});

  params.problem = p;
  // A paged cache's pages that hold whole key blocks take one TMA copy per block; pages that hold
  // whole boxes of kPageBoxRows keys one per box; other pages, or keys that start inside a page
  // (left padding), are gathered row by row.
  params.problem.key_cache = paged_loads(p, Traits::kBlockN);
  using BoxRows = Int<kPageBoxRows>;
  using WideBoxRows = Int<kWidePageBoxRows>;
  if constexpr (Traits::kFp8) {  // an FP8 cache's pages hold whole key blocks (validate.cpp): no boxes
  } else if constexpr (Traits::kKeyGroupMajor) {  // only for page boxes of consecutive pages (with_forward_traits)
    const KeyCache& cache = params.problem.key_cache;
    const long long rows = static_cast<long long>(cache.num_pages) * cache.page_size.divisor();
    params.page_rows_ready =
        cache.page_box_rows > 0 && cache.consecutive_pages &&
        make_page_rows_tma<Element, Traits::kHeadDim>(params.k_page_rows, t.k.data, t.k.row_stride, t.k.head_stride,
                                                      rows, p.heads_kv, p.head_dim, cache.page_box_rows) &&
        make_page_rows_tma<Element, Traits::kHeadDimV>(params.v_page_rows, t.v.data, t.v.row_stride,
                                                       t.v.head_stride, rows, p.heads_kv, p.head_dim_v,
                                                       cache.page_box_rows);
  } else if (params.problem.key_cache.page_box_rows == kPageBoxRows) {
    params.tma_k_box = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::template SmemLayoutKBox<kPageBoxRows>{},
                                     Shape<BoxRows, typename Traits::HeadDim>{}, _1{});
    params.tma_vt_box = make_tma_copy(SM90_TMA_LOAD{}, mVt, typename Traits::template SmemLayoutVtBox<kPageBoxRows>{},
                                      Shape<typename Traits::HeadDimV, BoxRows>{}, _1{});
  } else if (params.problem.key_cache.page_box_rows == kWidePageBoxRows) {
    params.tma_k_wide_box = make_tma_copy(SM90_TMA_LOAD{}, mK,
                                          typename Traits::template SmemLayoutKBox<kWidePageBoxRows>{},
                                          Shape<WideBoxRows, typename Traits::HeadDim>{}, _1{});
    params.tma_vt_wide_box = make_tma_copy(SM90_TMA_LOAD{}, mVt,
                                           typename Traits::template SmemLayoutVtBox<kWidePageBoxRows>{},
                                           Shape<typename Traits::HeadDimV, WideBoxRows>{}, _1{});
  }
  params.q = t.q;
  params.k = t.k;
  params.v = t.v;
  params.o = t.o;
  params.lse = t.lse;
  params.sinks = t.sinks;
  params.q_descale = t.q_descale;
  params.k_descale = t.k_descale;
  params.v_descale = t.v_descale;
  params.scale_log2 = p.softmax_scale * kLog2e;
  params.softcap_in = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  params.softcap_log2 = p.softcap * kLog2e;
  // Without a mask every tile has the same length and only L2 reuse matters: one KV head per
  // section, so the m_blocks of a head run side by side and a round of the grid reads the K/V of a
  // few heads (as cuDNN orders it). Sections of heads whose K/V fit in half of L2 read 2.5x more
  // from HBM at d128 2k (ncu: 650 MB against cuDNN's 260 MB) and ran 2-3% slower at d128.
  // Under a mask tile lengths vary. With a workspace the CTAs take tiles from a counter (dynamic
  // schedule), in L2 sections of equal length: heads whose K/V fit in half of L2, at least 4
  // rounds of the grid a section. Measured at d128 against one global longest-first order
  // (docs/perf-log.md): causal 4k +6%, 8k +4%, 16k +2.5%. Where heads have at most
  // kFewQueryBlocks query blocks, one round: 4 rounds held more K/V than L2 (causal 512 d256,
  // batch 32: 433 MB from HBM against 268 MB of inputs and output, ncu on the H100), and one
  // round measured 0.66 -> 0.87 of cuDNN there (1k: 0.88 -> 0.95), but lost 2-6% from 2k up,
  // where each head's K/V is read by many more tiles. Without one the static zig-zag balances
  // the CTAs only where lengths fall steadily over a few rounds, so it keeps one global order where
  // at least 2 CTAs share each (batch, head) pair, and sections spanning whole rounds otherwise.
  const int ctas = persistent_ctas(device);
  const ForwardWorkspacePlan plan = forward_workspace_plan<Traits>(p, device, workspace != nullptr);
  const ForwardSplitPlan& layout = plan.layout;
  params.pack = FastDivisor(layout.pack);
  if (plan.needed()) {
    ForwardWorkspace<Traits>::carve(workspace, ctas, plan.dynamic, plan.tail.enabled(),
                                    layout.split() ? layout.splits : 0, forward_output_rows(p), params);
  }
  // Packed, a tile row group holds a query row of each of the group's heads: the scheduler sees
  // one "head" per KV head, with the group's rows in its query blocks.
  const int num_m_blocks = forward_m_blocks(p.max_seqlen_q, layout.pack, Traits::kBlockM);
  const int tile_heads = p.heads / layout.pack;
  const int group = tile_heads / p.heads_kv;
  if (p.mask.unbounded()) {
    params.scheduler = TileScheduler::make(num_m_blocks, tile_heads, p.batch, group, /*kv_heads_per_section=*/1, 0);
    params.scheduler.split_keys(layout.splits);
    params.scheduler.tail = plan.tail;
    return params;
  }
  constexpr long long kMinCtasPerPair = 2;
  constexpr int kFewQueryBlocks = 8;
  const long long min_masked_rounds = plan.dynamic && num_m_blocks <= kFewQueryBlocks ? 1 : 4;
  const bool global_order = !plan.dynamic && ctas >= kMinCtasPerPair * static_cast<long long>(tile_heads) * p.batch;
  const long long kv_bytes_per_head =
      static_cast<long long>(p.max_seqlen_k) * (Traits::kHeadDim + Traits::kHeadDimV) * sizeof(Element);
  const long long kv_heads = global_order ? 0 : TileScheduler::kv_heads_within(device.l2_bytes / 2, kv_bytes_per_head);
  params.scheduler = TileScheduler::make(num_m_blocks, tile_heads, p.batch, group, kv_heads, min_masked_rounds * ctas,
                                         /*equal_sections=*/plan.dynamic);
  params.scheduler.split_keys(layout.splits);
  return params;
}

// The unmasked tile's wider key blocks save per-block work, but the last block of a sequence is
// padded: they pay where the padding is under 2% of the keys. Measured at d128 (176 against 128
// keys): +1-2% at 8k and 16k (1% padding), -1-3% at 1k-4k (3% padding).
inline bool wider_key_blocks_pay(long long seqlen_k, int block_n) {
  const long long padded = (seqlen_k + block_n - 1) / block_n * block_n;
  return (padded - seqlen_k) * 50 < seqlen_k;
}

// The counters' reset, the forward kernel and, for key splits, the combine kernel.
template <class Traits, auto* kernel>
cudaError_t launch_forward_grid(const Problem& problem, const ForwardParams<Traits>& params, const DeviceLimits& device,
                                cudaStream_t stream) {
  const int tiles = params.scheduler.total_tiles();
  if (cudaError_t e = allow_shared_bytes<kernel>(Traits::kSharedBytes); e != cudaSuccess) return e;
  const int ctas = persistent_ctas(device);
  // A split tail deals its keys to every CTA, also when there are fewer tiles than SMs.
  const int grid = params.scheduler.tail.enabled() ? ctas : std::min(tiles, ctas);
  // The counters serve the dynamic schedule and the split tail only: key splits alone skip their
  // reset (a launch of a few us per decode step). The forward overlaps the reset, and both a KV
  // cache's append (Problem::after_append).
  const bool counters = params.tile_counter != nullptr || params.scheduler.tail.enabled();
  if (counters && problem.after_append) {
    const cudaError_t e = launch_overlapping_previous(&reset_forward_counters_kernel<Traits>, dim3(1), dim3(32), 0,
                                                      stream, params.workspace_counters, params.workspace_counter_count);
    if (e != cudaSuccess) return e;
  } else if (counters) {
    reset_forward_counters_kernel<Traits><<<1, 32, 0, stream>>>(params.workspace_counters, params.workspace_counter_count);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (counters || problem.after_append) {
    const cudaError_t e =
        launch_overlapping_previous(kernel, dim3(grid), dim3(Traits::kThreads), Traits::kSharedBytes, stream, params);
    if (e != cudaSuccess) return e;
  } else {
    kernel<<<grid, Traits::kThreads, Traits::kSharedBytes, stream>>>(params);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (params.scheduler.key_splits() == 1) return cudaSuccess;
  // The pieces' partials into O and LSE; the combine kernel's CTAs start as the forward's finish
  // and wait for all of them before reading. Its grid fits (fwd_split_plan.hpp checks).
  constexpr int kRows = SplitCombineShape<Traits::kHeadDimV>::kRows;
  const long long row_blocks = (static_cast<long long>(problem.max_seqlen_q) * problem.heads + kRows - 1) / kRows;
  auto launch_combine = [&](auto wide_ctas) {
    constexpr bool kWide = decltype(wide_ctas)::value;
    return launch_overlapping_previous(
        &combine_key_splits_kernel<typename Traits::OutputElement, Traits::kHeadDimV, kWide>,
        dim3(static_cast<unsigned>(row_blocks * problem.batch)),
        dim3(SplitCombineShape<Traits::kHeadDimV, kWide>::kThreads), 0, stream, split_combine_params(params),
        static_cast<int>(row_blocks));
  };
  return row_blocks * problem.batch < ctas ? launch_combine(std::true_type{}) : launch_combine(std::false_type{});
}

template <class Traits, ScoreVariant kScores>
cudaError_t launch_forward_tiles(const Problem& problem, const ForwardTensors& tensors, const DeviceLimits& device,
                                 void* workspace, cudaStream_t stream) {
  const ForwardParams<Traits> params = make_forward_params<Traits>(problem, tensors, device, workspace);
  const int tiles = params.scheduler.total_tiles();
  if (tiles == 0) return cudaSuccess;
  // with_forward_traits never gives a problem of pages smaller than a key block a tile without
  // the paths for them.
  if ((params.problem.key_cache.gather || params.problem.key_cache.page_box_rows > 0) && !Traits::kLoadsSmallPages) {
    return cudaErrorInvalidValue;
  }
  // A key-group-major kernel loads page boxes only, and only through its own descriptors.
  if (Traits::kKeyGroupMajor && !params.page_rows_ready) return cudaErrorInvalidValue;

  return launch_forward_grid<Traits, &forward_kernel<Traits, Traits::kPackedRows, kScores>>(problem, params, device,
                                                                                             stream);
}

// Which kernels have a key-group-major form (KeyGroupMajorTileConfig): where it saves copies
// (kernel head dims of more than one 64-column chunk, whole chunks), every score variant.
template <int kHeadDim, int kHeadDimV, ScoreVariant kScores>
inline constexpr bool kHasKeyGroupMajorForm = kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 && kHeadDim + kHeadDimV > 128;

// Whether the key-group-major form of a tile with key blocks of block_n keys loads `problem`'s
// cache: paged, of pages of whole boxes but not whole blocks, for which its TMA tensor exists
// (consecutive pages, head dims of whole chunks: make_page_rows_tma).
inline bool loads_key_group_major(const Problem& problem, int block_n) {
  const KeyCache cache = paged_loads(problem, block_n);
  return cache.page_box_rows > 0 && cache.consecutive_pages && problem.head_dim % 64 == 0 &&
         problem.head_dim_v % 64 == 0;
}

// Whether such a tile loads `problem`'s keys in pieces smaller than a block (page boxes or
// gathered rows).
inline bool loads_small_pages(const Problem& problem, int block_n) {
  const KeyCache cache = paged_loads(problem, block_n);
  return cache.gather || cache.page_box_rows > 0;
}

// Calls f(Traits{}) with the kernel traits that launch_forward_kernel uses for `problem` and score
// variant kScores: the packed tile where the plan packs GQA heads (the only traits that pack), else
// the unmasked tile where it pays (not for paged caches), else the any-mask tile (the softcap
// variant's own where it differs); the key-group-major form of the packed or any-mask tile for
// paged caches loaded in boxes (loads_key_group_major); with plain scores, the narrow packed tile's
// form without small-page loads where none are needed (WholeKeyBlocksTileConfig), with 64-key
// blocks where that makes a cache's pages whole blocks (ForwardPackedNarrowPageTileConfig).
template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores, class F>
auto with_forward_traits(const Problem& problem, const DeviceLimits& device, F&& f) {
  using Element = typename CutlassElement<kDType>::type;
  using AnyMask = std::conditional_t<kScores == ScoreVariant::kSoftcap, ForwardSoftcapTileConfig<kHeadDim>,
                                     ForwardTileConfig<kHeadDim, kHeadDimV>>;
  // The wider unmasked tile where it is one of its own (d128), else the any-mask tile.
  using Unmasked = std::conditional_t<ForwardUnmaskedTileConfig<kHeadDim>::kShape == ForwardTileConfig<kHeadDim>::kShape,
                                      AnyMask, ForwardUnmaskedTileConfig<kHeadDim>>;
  // FP8 inputs: their tile (no wider unmasked blocks yet), whose keys are whole FP8 WGMMA K steps,
  // or up to d128 its packed form where the plan packs GQA heads (at d256 the packed kernel's
  // 128-key blocks, which the V transposition needs, spilled 124 bytes: not packed there).
  if constexpr (kDType == DType::kFloat8E4M3) {
    using Fp8Traits = ForwardKernelTraits<Element, kHeadDim, kHeadDimV, ForwardFp8TileConfig<kHeadDim>>;
    static_assert(Fp8Traits::kBlockN == kFp8KeyBlock, "paged FP8 caches' rule");
    if constexpr (kHeadDim <= 128) {
      using Fp8PackedTraits = ForwardKernelTraits<Element, kHeadDim, kHeadDimV, ForwardFp8PackedTileConfig<kHeadDim>>;
      static_assert(Fp8PackedTraits::kBlockN == kFp8KeyBlock, "paged FP8 caches' rule");
      if (forward_split_plan<Fp8PackedTraits>(problem, device, /*workspace=*/false).packed()) {
        return f(Fp8PackedTraits{});
      }
    }
    return f(Fp8Traits{});
  } else {
    using PackedTraits = ForwardKernelTraits<Element, kHeadDim, kHeadDimV, ForwardPackedTileConfig<kHeadDim>>;
    using NarrowPackedTraits = ForwardKernelTraits<Element, kHeadDim, kHeadDimV, ForwardPackedNarrowTileConfig<kHeadDim>>;
    const ForwardSplitPlan packed = forward_split_plan<PackedTraits>(problem, device, /*workspace=*/false);
    if (packed.packed()) {
      // A query row or a few of each head of the group fit one warpgroup's 64 rows.
      const bool narrow = static_cast<long long>(problem.max_seqlen_q) * packed.pack <= NarrowPackedTraits::kBlockM &&
                          forward_split_plan<NarrowPackedTraits>(problem, device, /*workspace=*/false).packed();
      if (narrow) {
        if constexpr (kScores == ScoreVariant::kPlain) {
          if (!loads_small_pages(problem, NarrowPackedTraits::kBlockN)) {
            return f(ForwardKernelTraits<Element, kHeadDim, kHeadDimV,
                                         WholeKeyBlocksTileConfig<ForwardPackedNarrowTileConfig<kHeadDim>>>{});
          }
          // Pages of 64 keys: 64-key blocks, whole pages (ForwardPackedNarrowPageTileConfig).
          using NarrowPage = WholeKeyBlocksTileConfig<ForwardPackedNarrowPageTileConfig<kHeadDim>>;
          using NarrowPageTraits = ForwardKernelTraits<Element, kHeadDim, kHeadDimV, NarrowPage>;
          if constexpr (kHasNarrowPageTile<kHeadDim>) {
            if (!loads_small_pages(problem, NarrowPageTraits::kBlockN) &&
                forward_split_plan<NarrowPageTraits>(problem, device, /*workspace=*/false).packed()) {
              return f(NarrowPageTraits{});
            }
          }
        }
        return f(NarrowPackedTraits{});
      }
      // Chunked prefill packs where the group's rows need fewer tiles together (seqlen_q of 3000
      // at 32/8: 94 tiles a KV head against 96).
      if constexpr (kHasKeyGroupMajorForm<kHeadDim, kHeadDimV, kScores>) {
        if (loads_key_group_major(problem, PackedTraits::kBlockN)) {
          return f(ForwardKernelTraits<Element, kHeadDim, kHeadDimV,
                                       KeyGroupMajorTileConfig<ForwardPackedTileConfig<kHeadDim>>>{});
        }
      }
      return f(PackedTraits{});
    }
    if constexpr (!(AnyMask::kShape == Unmasked::kShape)) {
      // Not for paged caches: its 176-key blocks divide no power-of-two page, and its kernel has no
      // path for smaller pages (ForwardKernelTraits::kLoadsSmallPages).
      if (problem.mask.unbounded() && !problem.key_cache.paged() &&
          wider_key_blocks_pay(problem.max_seqlen_k, Unmasked::kShape.block_n)) {
        return f(ForwardKernelTraits<Element, kHeadDim, kHeadDimV, Unmasked>{});
      }
    }
    if constexpr (kHasKeyGroupMajorForm<kHeadDim, kHeadDimV, kScores>) {
      if (loads_key_group_major(problem, AnyMask::kShape.block_n)) {
        return f(ForwardKernelTraits<Element, kHeadDim, kHeadDimV, KeyGroupMajorTileConfig<AnyMask>>{});
      }
    }
    return f(ForwardKernelTraits<Element, kHeadDim, kHeadDimV, AnyMask>{});
  }
}

}  // namespace forward_launch_detail

template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
cudaError_t launch_forward_kernel(const Problem& problem, const ForwardTensors& tensors, const DeviceLimits& device,
                                  void* workspace, cudaStream_t stream) {
  if (score_variant(problem) != kScores) return cudaErrorInvalidValue;  // the dispatcher's job
  return forward_launch_detail::with_forward_traits<kDType, kHeadDim, kHeadDimV, kScores>(problem, device, [&](auto traits) {
    return forward_launch_detail::launch_forward_tiles<decltype(traits), kScores>(problem, tensors, device, workspace,
                                                                                 stream);
  });
}

template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
size_t forward_workspace_bytes(const Problem& problem, const DeviceLimits& device) {
  return forward_launch_detail::with_forward_traits<kDType, kHeadDim, kHeadDimV, kScores>(problem, device, [&](auto traits) {
    return forward_launch_detail::forward_workspace_bytes_for<decltype(traits)>(problem, device);
  });
}

}  // namespace hopattn
