// Host side of the backward: the workspace carved up, TMA descriptors, the head slices, and the
// launches (preprocess, main, dQ postprocess; with head slices, a clear before and a dK/dV
// postprocess after).
// Included only by the generated instantiation units.
#pragma once

#include <cute/tensor.hpp>

#include <algorithm>
#include <type_traits>

#include "kernels/bwd/backward_kernels.hpp"
#include "kernels/bwd/bwd_kernel.cuh"
#include "kernels/bwd/bwd_head_slices.hpp"
#include "kernels/bwd/bwd_kernel_traits.cuh"
#include "kernels/bwd/bwd_postprocess.cuh"
#include "kernels/bwd/bwd_preprocess.cuh"
#include "kernels/common/constants.hpp"
#include "kernels/common/cutlass_element.hpp"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/kernel_setup.cuh"
#include "kernels/common/tma_tensors.cuh"

namespace hopattn {

// The tiles of score variant kScores (bwd_tile_config.hpp).
template <int kHeadDim, ScoreVariant kScores>
using BackwardTileConfigOf = std::conditional_t<kScores == ScoreVariant::kSoftcap, BackwardSoftcapTileConfig<kHeadDim>,
                                                BackwardTileConfig<kHeadDim>>;

// The kernel traits of one instantiation: a (Q/K, V) head dim pair takes the tiles of its Q/K
// head dim.
template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
using BackwardTraitsOf = BackwardKernelTraits<typename CutlassElement<kDType>::type, kHeadDim, kHeadDimV,
                                              BackwardTileConfigOf<kHeadDim, kScores>>;

namespace backward_launch_detail {

template <class Traits>
BackwardParams<Traits> make_backward_params(const Problem& p, const BackwardTensors& t, void* workspace,
                                            int head_slices, bool deterministic, long long l2_bytes) {
  using namespace cute;
  using Element = typename Traits::Element;
  const bool varlen = p.varlen();
  const int32_t q_tokens = static_cast<int32_t>(varlen ? p.total_q() : p.max_seqlen_q);
  const int32_t k_tokens = static_cast<int32_t>(varlen ? p.total_k() : p.max_seqlen_k);
  const int32_t batch = varlen ? 1 : p.batch;
  const int64_t q_span = tma_unused_stride({t.q.row_stride * q_tokens, t.q.head_stride * p.heads,
                                            t.dout.row_stride * q_tokens, t.dout.head_stride * p.heads, 8});
  const int64_t k_span = tma_unused_stride({t.k.row_stride * k_tokens, t.k.head_stride * p.heads_kv,
                                            t.v.row_stride * k_tokens, t.v.head_stride * p.heads_kv, 8});
  BackwardParams<Traits> params{};
  params.shape_q = make_shape(q_tokens, int32_t(p.head_dim), int32_t(p.heads), batch);
  params.shape_dout = make_shape(q_tokens, int32_t(p.head_dim_v), int32_t(p.heads), batch);
  params.shape_k = make_shape(k_tokens, int32_t(p.head_dim), int32_t(p.heads_kv), batch);
  params.shape_v = make_shape(k_tokens, int32_t(p.head_dim_v), int32_t(p.heads_kv), batch);
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  using HeadDimV = typename Traits::HeadDimV;
  params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tma_tokens_tensor<Element>(t.q, q_tokens, p.head_dim, p.heads, batch, q_span),
                               take<0, 2>(typename Traits::SmemLayoutQ{}), Shape<BlockM, HeadDim>{}, _1{});
  params.tma_dout = make_tma_copy(
      SM90_TMA_LOAD{}, tma_tokens_tensor<Element>(t.dout, q_tokens, p.head_dim_v, p.heads, batch, q_span),
      take<0, 2>(typename Traits::SmemLayoutDO{}), Shape<BlockM, HeadDimV>{}, _1{});
  params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tma_tokens_tensor<Element>(t.k, k_tokens, p.head_dim, p.heads_kv, batch, k_span),
                               typename Traits::SmemLayoutK{}, Shape<BlockN, HeadDim>{}, _1{});
  params.tma_v = make_tma_copy(SM90_TMA_LOAD{}, tma_tokens_tensor<Element>(t.v, k_tokens, p.head_dim_v, p.heads_kv, batch, k_span),
                               typename Traits::SmemLayoutV{}, Shape<BlockN, HeadDimV>{}, _1{});
  params.problem = p;
  params.dk = t.dk;
  params.dv = t.dv;
  params.workspace = BackwardWorkspace::carve(workspace, p, HeadDimPair{Traits::kHeadDim, Traits::kHeadDimV});
  params.scale_log2 = p.softmax_scale * kLog2e;
  params.softcap_in = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  params.softcap_log2 = p.softcap * kLog2e;
  params.softcap_log2_inverse = p.softcap > 0.f ? 1.f / params.softcap_log2 : 0.f;
  params.head_slices = head_slices;
  params.deterministic = deterministic;
  params.tile_counter = nullptr;  // persistent CTAs' (launch_backward_gradients)
  // What a unit (a slice of a KV head's group, one sequence) streams: Q, dO and the fp32 dQ
  // accumulator of its query heads, and its K and V. Under a mask every unit is a section of its
  // own (section_units = 1, the key-block-fastest order: bwd_grid_order.hpp says why).
  const long long query_bytes_per_token =
      static_cast<long long>(p.head_dim) * (sizeof(Element) + sizeof(float)) + p.head_dim_v * sizeof(Element);
  const long long bytes_per_unit = static_cast<long long>(p.heads / p.heads_kv / head_slices) * p.max_seqlen_q *
                                       query_bytes_per_token +
                                   static_cast<long long>(p.max_seqlen_k) * (p.head_dim + p.head_dim_v) *
                                       static_cast<long long>(sizeof(Element));
  params.section_units = p.mask.unbounded()
                              ? backward_section_units(bytes_per_unit, l2_bytes, head_slices * p.heads_kv * p.batch)
                              : 1;
  return params;
}

}  // namespace backward_launch_detail

// dQ, dK and dV: the preprocess, the main kernel, the postprocesses.
template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
cudaError_t launch_backward_gradients(const Problem& problem, const BackwardTensors& tensors, void* workspace,
                                      bool deterministic, const DeviceLimits& device, cudaStream_t stream) {
  using namespace backward_launch_detail;
  using Element = typename CutlassElement<kDType>::type;
  using Traits = BackwardTraitsOf<kDType, kHeadDim, kHeadDimV, kScores>;
  // With max_seqlen_q = 0 there is no query block: only the main kernel runs, writing dK = dV = 0
  // itself (one slice).
  auto blocks_of = [&](int rows) {
    return dim3((problem.max_seqlen_q + rows - 1) / rows, problem.heads, problem.batch);
  };
  const dim3 query_blocks = blocks_of(Traits::kBlockM);
  const bool has_queries = query_blocks.x > 0;
  const int key_blocks = backward_key_blocks(problem, Traits::kBlockN);
  const BackwardGridShape grid_shape{key_blocks, static_cast<int>(query_blocks.x), device.multiprocessors, deterministic};
  const int head_slices = has_queries ? backward_head_slices(problem, grid_shape) : 1;
  BackwardParams<Traits> params =
      make_backward_params<Traits>(problem, tensors, workspace, head_slices, deterministic, device.l2_bytes);

  if (head_slices > 1) {  // the slices add dK and dV into zeroed sums
    const BackwardWorkspace& ws = params.workspace;
    if (cudaError_t e = cudaMemsetAsync(ws.dk_accum, 0, ws.kv_clear_bytes(problem.heads_kv), stream); e != cudaSuccess) {
      return e;
    }
  }
  // With attention sinks the preprocess and the dQ postprocess also compute their gradient.
  const float* sinks = tensors.dsinks != nullptr ? tensors.sinks : nullptr;
  if (has_queries) {
    backward_preprocess_kernel<Element, kHeadDim, kHeadDimV>
        <<<blocks_of(BackwardWorkspace::kRowBlock), kPreprocessThreads, 0, stream>>>(
            problem, tensors.o, tensors.dout, tensors.lse, sinks, params.workspace);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }

  auto* const main_kernel =
      deterministic ? &backward_kernel<Traits, true, kScores> : &backward_kernel<Traits, false, kScores>;
  if (cudaError_t e = deterministic ? allow_shared_bytes<&backward_kernel<Traits, true, kScores>>(Traits::kSharedBytes)
                                    : allow_shared_bytes<&backward_kernel<Traits, false, kScores>>(Traits::kSharedBytes);
      e != cudaSuccess) {
    return e;
  }
  const long long tiles = static_cast<long long>(key_blocks) * head_slices * problem.heads_kv * problem.batch;
  // A CTA per tile, or persistent CTAs (at most one per SM: the shared memory allows no second)
  // where the tiles are short: a CTA's start and end cost about four blocks' time, which a
  // persistent CTA hides under its previous tile. On the H100, non-causal, of cuDNN, with a fixed
  // round-robin: d64 512 / 1k / 2k +17 / +12 / +6%, d128 512 / 1k +3%, d128 2k level and 8k -1%.
  // They take their tiles from the workspace's counter (bwd_tile_stream.cuh), which the preprocess
  // zeroes (there is none without query rows), so masked and varlen tiles of unequal work balance
  // as a CTA per tile does; causal, of cuDNN: d64 512 / 1k / 2k +13 / +13 / +9%, d128 1k +4%,
  // 512 -1.6%; varlen d128 512 +2.5%, 1k level. d192 / d256 (64-key tiles), of cuDNN: non-causal
  // 512 / 1k +4.1 / +4.2% and +2.8 / +3.5%, causal 512 level, 1k +1%.
  constexpr int kPersistentMaxQueryBlocks = 16;
  const bool persistent = (deterministic ? Traits::template kPersistent<true> : Traits::template kPersistent<false>) &&
                          has_queries && problem.max_seqlen_q <= kPersistentMaxQueryBlocks * Traits::kBlockM;
  const long long ctas = persistent ? std::min<long long>(tiles, std::max(device.multiprocessors, 1)) : tiles;
  params.tile_counter = persistent ? params.workspace.tile_counter : nullptr;
  // Each kernel after the preprocess sets up under the previous one's last wave (grid_dependency.cuh).
  const dim3 main_grid(static_cast<unsigned>(ctas));
  if (has_queries) {
    cudaError_t e =
        launch_overlapping_previous(main_kernel, main_grid, Traits::kThreads, Traits::kSharedBytes, stream, params);
    if (e != cudaSuccess) return e;
    e = launch_overlapping_previous(&backward_postprocess_kernel<Traits>, query_blocks, Traits::kMmaThreads, 0,
                                    stream, problem, tensors.dq, params.workspace, head_slices, deterministic,
                                    tensors.dsinks);
    if (e != cudaSuccess || head_slices == 1) return e;
    // After the dQ postprocess, whose last CTA waits for the main kernel to complete.
    const dim3 key_row_blocks((problem.max_seqlen_k + BackwardWorkspace::kRowBlock - 1) / BackwardWorkspace::kRowBlock,
                              problem.heads_kv, problem.batch);
    backward_key_postprocess_kernel<Element><<<key_row_blocks, kKeyPostprocessThreads, 0, stream>>>(
        problem, tensors.dk, tensors.dv, params.workspace);
    return cudaGetLastError();
  }
  main_kernel<<<main_grid, Traits::kThreads, Traits::kSharedBytes, stream>>>(params);
  return cudaGetLastError();
}

template <DType kDType, int kHeadDim, int kHeadDimV, ScoreVariant kScores>
cudaError_t launch_backward_kernels(const Problem& problem, const BackwardTensors& tensors, void* workspace,
                                    bool deterministic, const DeviceLimits& device, cudaStream_t stream) {
  if (score_variant(problem) != kScores) return cudaErrorInvalidValue;  // the dispatcher's job
  const cudaError_t e = launch_backward_gradients<kDType, kHeadDim, kHeadDimV, kScores>(problem, tensors, workspace,
                                                                                        deterministic, device, stream);
  if (e != cudaSuccess || tensors.dsinks == nullptr || problem.max_seqlen_q > 0) return e;
  // Attention sinks without a query row: their gradient is 0 (with rows, the preprocess and the dQ
  // postprocess computed it).
  return cudaMemsetAsync(tensors.dsinks, 0, sizeof(float) * problem.heads, stream);
}

}  // namespace hopattn
