// What the forward kernel receives: TMA descriptors for Q, K and V^T, the output pointers, the
// problem, the tile schedule and the pointers into the optional workspace. Built on the host by
// make_forward_params (fwd_launch.cuh).
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "kernels/common/problem.hpp"
#include "kernels/common/tile_scheduler.hpp"
#include "kernels/common/tma_tensors.cuh"
#include "kernels/fwd/fwd_page_rows_tma.hpp"
#include "kernels/fwd/fwd_tile.hpp"

namespace hopattn {

template <class Traits>
struct ForwardParams {
  using Element = typename Traits::Element;
  // Q, K: (tokens, head_dim, heads, batch); V^T: (head_dim_v, tokens, heads, batch). In varlen mode
  // tokens is the packed axis and batch has extent 1. A KV cache's K/V: (capacity, ..., cache
  // rows), or paged (page_size, ..., num_pages) (see key_tensor_extent).
  using ShapeTokens = TmaTokensShape;
  using StrideTokens = TmaTokensStride;
  using StrideTransposed = cute::Stride<cute::_1, int64_t, int64_t, int64_t>;

  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeTokens{}, StrideTokens{}),
      typename Traits::SmemLayoutQ{}, cute::Shape<typename Traits::BlockM, typename Traits::HeadDim>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeTokens{}, StrideTokens{}),
      cute::take<0, 2>(typename Traits::SmemLayoutK{}),
      cute::Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, cute::_1{}));
  using TmaVt = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeTokens{}, StrideTransposed{}),
      cute::take<0, 2>(typename Traits::SmemLayoutVLoaded{}),
      cute::Shape<typename Traits::HeadDimV, typename Traits::BlockN>{}, cute::_1{}));

  // The same tensors in boxes of kRows keys, for a paged cache whose pages do not hold whole key
  // blocks (problem.key_cache.page_box_rows; default-constructed otherwise).
  template <int kRows>
  using TmaKBox = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeTokens{}, StrideTokens{}),
      typename Traits::template SmemLayoutKBox<kRows>{}, cute::Shape<cute::Int<kRows>, typename Traits::HeadDim>{},
      cute::_1{}));
  template <int kRows>
  using TmaVtBox = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeTokens{},
                        StrideTransposed{}),
      typename Traits::template SmemLayoutVtBox<kRows>{}, cute::Shape<typename Traits::HeadDimV, cute::Int<kRows>>{},
      cute::_1{}));

  TmaQ tma_q;
  TmaK tma_k;
  TmaVt tma_vt;
  TmaKBox<kPageBoxRows> tma_k_box;
  TmaVtBox<kPageBoxRows> tma_vt_box;
  TmaKBox<kWidePageBoxRows> tma_k_wide_box;
  TmaVtBox<kWidePageBoxRows> tma_vt_wide_box;
  // Key-group-major stages (Traits::kKeyGroupMajor): K's and V's page boxes, one copy each
  // (fwd_page_rows_tma.hpp; made for such kernels only).
  cute::TmaDescriptor k_page_rows;
  cute::TmaDescriptor v_page_rows;
  bool page_rows_ready;  // both made (host side: the launch refuses a key-group-major kernel without)
  ShapeTokens shape_q;
  ShapeTokens shape_k;
  ShapeTokens shape_vt;

  Problem problem;
  RowTensor q;  // read directly (not through tma_q) where a tile packs GQA heads
  RowTensor k;  // and K, V where a paged KV cache's rows are gathered (problem.key_cache.gather)
  RowTensor v;
  RowTensor o;
  RowTensor lse;       // lse.data may be null
  const float* sinks;  // attention sinks, one logit per query head; null: none
  // FP8 inputs (Traits::kFp8): their descale factors (S's is q's times k's, O's v's).
  DescaleTensor q_descale, k_descale, v_descale;
  float scale_log2;    // softmax_scale * log2(e)
  // Softcap (ScoreVariant::kSoftcap): the tanh's argument is the raw score times softcap_in
  // (softmax_scale / softcap), the softmax's exp2 factor softcap_log2 (softcap * log2(e)).
  float softcap_in;
  float softcap_log2;
  FastDivisor pack;    // query heads per tile row group (fwd_split_plan.hpp); 1: none
  TileScheduler scheduler;
  // Into the workspace (fwd_workspace.cuh), all null without one: its counters, which a kernel
  // ahead of this one zeroes; the dynamic schedule's tile counter (null: the static schedule); the
  // split tail's flags and partials (null unless scheduler.tail is enabled).
  int32_t* workspace_counters;
  int workspace_counter_count;
  int32_t* tile_counter;
  int32_t* tail_flags;
  float* tail_partials;
  // The key splits' partials (null unless scheduler.key_splits() > 1): (splits, output rows,
  // kHeadDimV) and (splits, output rows), see fwd_workspace.cuh.
  float* split_o;
  float* split_lse;
  long long split_output_rows;
};

}  // namespace hopattn
