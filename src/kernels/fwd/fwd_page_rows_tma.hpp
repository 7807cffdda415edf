// One TMA copy per page box for the key-group-major forward (ForwardKernelTraits::kKeyGroupMajor).
//
// A key block's K (and V^T) stage is made of 8-key groups of 128-byte swizzle rows. In the usual
// order each 64-element chunk of the head dim holds the whole block's keys, so the keys of one
// page sit in one place per chunk: at d128 a page box was two copies, at d256 four (and paged
// chunked prefill on 16-key pages ran at 0.69 of the contiguous cache, its producer issuing 32
// copies a block; with 64-key boxes, 8 copies, 0.85). Key-group-major stages keep each group's
// chunks together instead, so a page box is one run of shared memory, and TMA can fill it in one
// copy if it sees the cache as
//
//   (chunk column [64], key in its group [8], chunk [head_dim / 64], head, 8-key group of the cache)
//
// with strides (1, row, 64 elements, head, 8 rows): five dimensions, the most a TMA tensor has.
// The last axis counts 8-key groups across all pages, which needs pages that follow one another
// as runs of rows (KeyCache::consecutive_pages). The WGMMA descriptors of such stages only change
// their strides (K: 8-key groups 2 KiB apart instead of 1; V^T: chunks 1 KiB apart, key groups 2).
#pragma once

#include <cstdint>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/cuda_host_adapter.hpp>

namespace hopattn {

inline constexpr int kChunkElements = 64;  // of a 16-bit head dim in one 128-byte swizzle row
inline constexpr int kKeyGroupRows = 8;    // keys of one swizzle atom

// The TMA descriptor for page boxes of `box_rows` keys of a paged K or V (num_pages * page_size
// rows, each `row_stride` elements after the previous, heads `head_stride` apart, head_dim
// columns) into stages of kStageColumns (the kernel's head dim). The head dim must be whole chunks
// (this view has no bound inside a chunk): the chunks past it are past the tensor and fill zeros,
// as a narrower head dim's columns do in the other forward kernels. False where it is not, or
// where the driver refuses the descriptor.
template <class Element, int kStageColumns>
bool make_page_rows_tma(cute::TmaDescriptor& desc, const void* data, int64_t row_stride, int64_t head_stride,
                        long long rows, int heads, int head_dim, int box_rows) {
  static_assert(kStageColumns % kChunkElements == 0, "stages of whole chunks");
  if (head_dim % kChunkElements != 0 || head_dim > kStageColumns || box_rows % kKeyGroupRows != 0) return false;
  constexpr uint64_t kBytes = sizeof(Element);
  const uint64_t dims[5] = {kChunkElements, kKeyGroupRows, static_cast<uint64_t>(head_dim / kChunkElements),
                            static_cast<uint64_t>(heads), static_cast<uint64_t>(rows / kKeyGroupRows)};
  const uint64_t strides[4] = {static_cast<uint64_t>(row_stride) * kBytes, kChunkElements * kBytes,
                               static_cast<uint64_t>(head_stride) * kBytes,
                               static_cast<uint64_t>(row_stride) * kKeyGroupRows * kBytes};
  const uint32_t box[5] = {kChunkElements, kKeyGroupRows, kStageColumns / kChunkElements, 1,
                           static_cast<uint32_t>(box_rows / kKeyGroupRows)};
  const uint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      &desc, cute::TMA::to_CUtensorMapDataType<Element>(), 5, const_cast<void*>(data), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// Copies the box of key group `group` (of the whole cache) on, for head `head`, to `smem`,
// completing on `full`. A group past the cache reads nothing and fills zeros.
CUTE_DEVICE void copy_page_rows(const cute::TmaDescriptor& desc, uint64_t* full, void* smem, int head, int group) {
  constexpr uint64_t kEvictNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  cute::SM90_TMA_LOAD_5D::copy(&desc, full, kEvictNormal, smem, 0, 0, 0, head, group);
}

}  // namespace hopattn
