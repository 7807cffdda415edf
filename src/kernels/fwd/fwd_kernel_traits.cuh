// Compile-time description of one forward kernel: tile shapes, WGMMA tilings, shared-memory
// layouts and the shared storage they add up to.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "kernels/common/constants.hpp"
#include "kernels/common/named_barriers.hpp"
#include "kernels/common/register_split.hpp"
#include "kernels/common/swizzle_atoms.cuh"
#include "kernels/fwd/fwd_tile_config.hpp"
#include "kernels/fwd/fwd_tile_info.cuh"

namespace hopattn {

// kHeadDim: Q and K's head dim; kHeadDimV: V and O's (head_dim_v pairs, e.g. 192 / 128).
template <typename Element_, int kHeadDim_, int kHeadDimV_, class Config_ = ForwardTileConfig<kHeadDim_>>
struct ForwardKernelTraits {
  using Element = Element_;  // Q's, K's and V's
  // FP8 (e4m3) inputs: O is bf16 (docs/semantics.md), V is transposed in shared memory by two
  // producer warps (fwd_fp8.cuh), P enters the P V WGMMA as e4m3.
  static constexpr bool kFp8 = sizeof(Element) == 1;
  using OutputElement = std::conditional_t<kFp8, cutlass::bfloat16_t, Element>;
  using Config = Config_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = Config::kShape.block_m;
  static constexpr int kBlockN = Config::kShape.block_n;
  static constexpr int kStages = Config::kShape.stages;
  static constexpr bool kKeysAhead = Config::kShape.keys_ahead;
  static constexpr bool kRescaleUnderQK = Config::kShape.rescale_under_qk;
  static constexpr bool kPingPong = Config::kShape.ping_pong;
  // Whether this is a tile of packed GQA rows (forward_kernel's kPackedRows, see
  // with_forward_traits; the key-group-major form of the packed tile too): its kernel is the
  // packed one, the others' the plain one.
  static constexpr bool kPackedRows = std::is_base_of_v<ForwardPackedTileConfig<kHeadDim>, Config> ||
                                      std::is_base_of_v<ForwardPackedNarrowTileConfig<kHeadDim>, Config> ||
                                      std::is_same_v<Config, ForwardFp8PackedTileConfig<kHeadDim>>;
  // Whether the producer can load a paged KV cache whose pages do not hold whole key blocks (in
  // boxes or gathered row by row): not in the wider unmasked tile, whose 176-key blocks split
  // every power-of-two page and whose producer spilled with the gather's state; paged caches
  // never take it (with_forward_traits); nor WholeKeyBlocksTileConfig's.
  static constexpr bool kLoadsSmallPages = !std::is_same_v<Config, ForwardUnmaskedTileConfig<kHeadDim>> && !kFp8 &&
                                           !std::is_base_of_v<WholeKeyBlocksForm, Config>;
  // K's and V^T's stages key-group-major (KeyGroupMajorTileConfig): each 8-key group's 64-column
  // chunks of the head dim together, so that a page box is one TMA copy (fwd_page_rows_tma.hpp).
  static constexpr bool kKeyGroupMajor = std::is_base_of_v<KeyGroupMajorForm, Config>;
  static_assert(!kKeyGroupMajor || (!kFp8 && kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 && kLoadsSmallPages),
                "key-group-major stages are made of 128-byte swizzle rows of 16-bit elements, for paged caches");

  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kThreads = kConsumerThreads + cutlass::NumThreadsPerWarpGroup;  // + producer
  // One arrival per consumer warp releases sQ.
  static constexpr int kQueryReleaseArrivals = kConsumerThreads / cutlass::NumThreadsPerWarp;
  // Register budget per thread after setmaxnreg: the producer keeps few, the consumers take the rest
  // (65536 registers per SM, one CTA per SM).
  // With one consumer warpgroup (256 threads) the launch's 256 registers a thread already cover
  // the consumers' most.
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 1 ? 56 : kConsumerWarpgroups == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 1 ? 256 : kConsumerWarpgroups == 2 ? 240 : 160;

  static_assert(kBlockM % 64 == 0 && kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= kMaxConsumerWarpgroups,
                "each consumer warpgroup owns 64 query rows");
  static_assert(kBlockN % 16 == 0, "P feeds the P V WGMMA in K-steps of 16");
  static_assert(kHeadDim % 32 == 0 && kHeadDimV % 32 == 0, "kernel head dims are multiples of 32");
  static_assert(kConsumerWarpgroups * cutlass::NumThreadsPerWarpGroup == kConsumerThreads, "");
  static_assert(register_split_fits(kConsumerWarpgroups, kProducerRegisters, kConsumerRegisters),
                "the consumers' registers must come from those the producer releases");

  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using HeadDimV = cute::Int<kHeadDimV>;
  using WarpgroupLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;

  // S = Q K^T: both operands from shared memory, K-major (head dim contiguous).
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, BlockN, HeadDim>>(),
      WarpgroupLayout{}));
  // O += P V: P from registers, V^T from shared memory with the head dim contiguous (MN-major).
  // FP8 WGMMA takes K-major operands only: there V^T has the keys contiguous.
  static constexpr cute::GMMA::Major kVtMajor = kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, HeadDimV, BlockN>,
                                 cute::GMMA::Major::K, kVtMajor>(),
      WarpgroupLayout{}));
  static_assert(!kFp8 || kBlockN % 32 == 0, "FP8 P V WGMMAs take keys in steps of 32");

  static_assert(decltype(cute::size<1>(typename TiledMmaQK::AtomShape_MNK{}))::value == kBlockN &&
                    decltype(cute::size<1>(typename TiledMmaPV::AtomShape_MNK{}))::value == kHeadDimV,
                "each GEMM must be one WGMMA atom wide (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)");

  using SmemLayoutQ = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<BlockM, HeadDim>{}));
  // Swizzle atoms down the keys first (per 64-column chunk of the head dim), or across the head
  // dim first where the stages are key-group-major.
  using KeyAtomOrder = std::conditional_t<kKeyGroupMajor, cute::Step<cute::_2, cute::_1, cute::_3>,
                                          cute::Step<cute::_1, cute::_2, cute::_3>>;
  using SmemLayoutK = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::K, Element, kHeadDim>(),
      cute::Shape<BlockN, HeadDim, cute::Int<kStages>>{}, KeyAtomOrder{}));
  // V is stored as V^T (head_dim_v, keys) with the head dim contiguous, which is how it sits in
  // global memory, so TMA loads it without a transpose. The swizzle atoms (64 head-dim elements x
  // 8 keys) are laid out keys first, so that one TMA box covers a 64-wide column of the whole
  // block: head dim first made every atom its own 1 KB box (32 TMA instructions per V block at
  // d128, 40 at d256), and the producer could not keep the ring ahead of the consumers.
  // FP8: V arrives that way in a ring of its own (SmemLayoutVRows), and the transposer warps write
  // V^T with the keys contiguous (K-major) into the stages the consumers read.
  // Key-group-major stages lay the atoms head dim first instead (a V block then takes one copy
  // per page box, never a whole-block copy: with_forward_traits).
  using VAtomOrder = std::conditional_t<kKeyGroupMajor, cute::Step<cute::_1, cute::_2, cute::_3>,
                                        cute::Step<cute::_2, cute::_1, cute::_3>>;
  template <int kRingStages>
  using SmemLayoutVAsLoaded = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::MN, Element, kHeadDimV>(),
      cute::Shape<HeadDimV, BlockN, cute::Int<kRingStages>>{}, VAtomOrder{}));
  using SmemLayoutVt = std::conditional_t<
      kFp8,
      decltype(cute::tile_to_shape(widest_swizzle_atom<cute::GMMA::Major::K, Element, kBlockN>(),
                                   cute::Shape<HeadDimV, BlockN, cute::Int<kStages>>{})),
      SmemLayoutVAsLoaded<kStages>>;
  // FP8: two stages of V as loaded, so that the next block's load runs under a transposition.
  static constexpr int kVRowStages = kFp8 ? 2 : 0;
  using SmemLayoutVRows = SmemLayoutVAsLoaded<kFp8 ? kVRowStages : 1>;
  // Where V's TMA writes: the v_rows ring (FP8) or the stages the consumers read.
  using SmemLayoutVLoaded = std::conditional_t<kFp8, SmemLayoutVRows, SmemLayoutVt>;

  // A paged KV cache whose pages hold whole boxes of kRows keys but not whole key blocks takes
  // each block as boxes, one TMA copy each from its own page (KeyCache::page_box_rows): their
  // layouts in a stage, kRows = kPageBoxRows or kWidePageBoxRows.
  static_assert(kBlockN % kPageBoxRows == 0, "a key block is whole boxes");
  static constexpr bool kWidePageBoxes = kBlockN % kWidePageBoxRows == 0;
  template <int kRows>
  using SmemLayoutKBox = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<cute::Int<kRows>, HeadDim>{}));
  template <int kRows>
  using SmemLayoutVtBox = decltype(cute::tile_to_shape(
      widest_swizzle_atom<cute::GMMA::Major::MN, Element, kHeadDimV>(), cute::Shape<HeadDimV, cute::Int<kRows>>{},
      cute::Step<cute::_2, cute::_1>{}));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);

  // Swizzled TMA destinations need 1024-byte alignment.
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutVt>, 1024> v;
    // FP8: V as loaded, before the transposition (a token size otherwise).
    cute::array_aligned<Element, kFp8 ? cute::cosize_v<SmemLayoutVRows> : 16, kFp8 ? 1024 : 16> v_rows;
    cutlass::arch::ClusterTransactionBarrier q_full;  // the next tile's Q and its entry of `tiles` are in
    cutlass::arch::ClusterBarrier q_released;         // every consumer warp is done with sQ (its S GEMMs)
    ForwardTile tiles[kPublishedTileSlots];          // published tiles, in turn
    ScheduledTile scheduled[kPublishedTileSlots];    // and what the schedule said of each
    cutlass::arch::ClusterBarrier scheduled_full[kPublishedTileSlots];  // its entry of `scheduled` is in
    // With gathered key blocks: both helper warps have read the slot (forward_producer).
    cutlass::arch::ClusterBarrier slot_read[kPublishedTileSlots];
    // Whether the producer met a page outside a paged KV cache while loading the tile: its rows
    // are then NaN. Written before the arrivals on the tile's K/V stages, read after the last wait.
    int page_faults[kPublishedTileSlots];
    // With attention sinks, the sink logit of the tile's (first) head, which the publisher loads
    // tiles ahead for the consumers' epilogue (add_sinks).
    float sink_logits[kPublishedTileSlots];
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    // FP8: the v_rows ring's barriers (full: the producer's TMA; empty: every transposer thread),
    // and the producer's end marker for the transposers, one per stage, read after that stage's
    // full barrier completed. One flag for the ring hung the kernel (H100, paged decode): the
    // producer raised it in the stage after the last V block while that block's copy was still
    // in flight, and the transposers, once it landed, read the flag and left without it.
    cutlass::arch::ClusterTransactionBarrier v_rows_full[kFp8 ? kVRowStages : 1];
    cutlass::arch::ClusterBarrier v_rows_empty[kFp8 ? kVRowStages : 1];
    int v_rows_end[kFp8 ? kVRowStages : 1];
  };
  static constexpr int kSharedBytes = sizeof(SharedStorage);
  static_assert(kSharedBytes <= kMaxSharedBytesPerCta, "shared storage exceeds what an sm_90 CTA can have");
};

}  // namespace hopattn
