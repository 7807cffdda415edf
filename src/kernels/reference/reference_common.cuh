// Building blocks of the GPU reference kernels: warp-per-row addressing, dtype conversion and the
// rounding that the naive low-precision mode applies to intermediates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "api/problem.hpp"
#include "kernels/common/block_range.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/seqlen.hpp"

namespace hopattn::reference_detail {

constexpr int kWarpSize = 32;
constexpr int kMaxHeadDim = 256;
constexpr int kElemsPerLane = kMaxHeadDim / kWarpSize;  // lane l holds elements l, l + 32, ...
constexpr int kThreadsPerBlock = 128;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr int kMaxBlocks = 1 << 16;  // warps loop (grid-stride) beyond this

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// Rounds an intermediate to the input dtype when emulating a naive low-precision computation.
template <typename T, typename Acc>
__device__ __forceinline__ Acc maybe_round(Acc x, bool round_to_input) {
  return round_to_input ? static_cast<Acc>(to_float(from_float<T>(static_cast<float>(x)))) : x;
}

template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One row of a (batch, row, head, dim) tensor held across the lanes of a warp.
template <typename Acc>
struct WarpRow {
  Acc x[kElemsPerLane];

  template <typename T>
  __device__ void load(const T* row, int head_dim, int lane) {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      x[c] = d < head_dim ? static_cast<Acc>(to_float(row[d])) : Acc(0);
    }
  }
  template <typename T>
  __device__ void store(T* row, int head_dim, int lane, Acc scale) const {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < head_dim) row[d] = from_float<T>(static_cast<float>(x[c] * scale));
    }
  }
  __device__ void zero() {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) x[c] = Acc(0);
  }
  // Full dot product with another row (same on every lane).
  template <typename T>
  __device__ Acc dot(const T* row, int head_dim, int lane) const {
    Acc partial = 0;
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < head_dim) partial += x[c] * static_cast<Acc>(to_float(row[d]));
    }
    return warp_sum(partial);
  }
  // x += alpha * row
  template <typename T>
  __device__ void axpy(Acc alpha, const T* row, int head_dim, int lane) {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < head_dim) x[c] += alpha * static_cast<Acc>(to_float(row[d]));
    }
  }
};

// A token of the packed row axis resolved to its sequence.
struct RowLocation {
  int batch;
  int index;  // position inside the sequence
  bool real;  // false past seqused (or past a clamped sequence end): the row is not touched
};

__device__ inline RowLocation locate_row(const SequenceLayout& layout, int batch, long long row) {
  int b;
  if (layout.varlen()) {
    // Last b with cu_seqlens[b] <= row (binary search over batch + 1 prefix sums).
    int lo = 0, hi = batch;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (layout.cu_seqlens[mid] <= row) lo = mid; else hi = mid - 1;
    }
    b = lo;
  } else {
    b = static_cast<int>(row / layout.fixed_length);
  }
  if (b >= batch) return RowLocation{0, 0, false};
  const Sequence seq = layout.sequence(b);
  const long long base = layout.varlen() ? seq.offset : static_cast<long long>(b) * layout.fixed_length;
  const long long index = row - base;
  return RowLocation{b, static_cast<int>(index), index >= 0 && index < seq.length};
}

template <typename T>
__device__ __forceinline__ T* row_pointer(const RowTensor& t, int batch, long long packed_row, int head) {
  return static_cast<T*>(t.data) + batch * t.batch_stride + packed_row * t.row_stride + head * t.head_stride;
}

// Packed token index of position `index` of sequence `batch` (the row axis of RowTensor).
__device__ __forceinline__ long long packed_row(const SequenceLayout& layout, int batch, int index) {
  return layout.varlen() ? layout.sequence(batch).offset + index : index;
}

inline int grid_for(long long warps) {
  const long long blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace hopattn::reference_detail
