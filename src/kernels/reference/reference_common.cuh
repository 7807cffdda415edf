// Building blocks of the GPU reference kernels: warp-per-row addressing, dtype conversion and the
// rounding that the naive low-precision mode applies to intermediates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/common/problem.hpp"
#include "kernels/common/seqlen.hpp"
#include "kernels/reference/reference_attention.hpp"
#include "reference/mask_definition.hpp"

namespace hopattn::reference_detail {

constexpr int kWarpSize = 32;
constexpr int kMaxHeadDim = 256;
constexpr int kElemsPerLane = kMaxHeadDim / kWarpSize;  // lane l holds elements l, l + 32, ...
constexpr int kThreadsPerBlock = 128;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr int kMaxBlocks = 1 << 16;  // warps loop (grid-stride) beyond this

using Float8 = __nv_fp8_e4m3;  // DType::kFloat8E4M3

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(Float8 x) { return static_cast<float>(x); }

// Round to nearest even; FP8 saturates at its largest finite value, 448, as FP8 kernels convert.
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    static_assert(std::is_same_v<T, Float8>, "fp32, fp16, bf16 or fp8 e4m3 only");
    return Float8(x);  // __NV_SATFINITE, round to nearest even
  }
}

// Rounds an intermediate to T when emulating a naive low-precision computation.
template <typename T, typename Acc>
__device__ __forceinline__ Acc maybe_round(Acc x, bool round_to_input) {
  return round_to_input ? static_cast<Acc>(to_float(from_float<T>(static_cast<float>(x)))) : x;
}

// The dtypes the naive low-precision mode rounds the forward's intermediates to, for inputs of
// dtype T and an O of dtype Out, as a framework computing attention op by op does: 16-bit inputs
// round S and P to T. FP8 inputs go through FP8 GEMMs with 16-bit results, so S is rounded to Out,
// and P, which in [0, 1] is already in e4m3's range, to e4m3: the operand of the P V GEMM.
template <typename T, typename Out>
struct NaiveRounding {
  using Score = T;
  using Probability = T;
};
template <typename Out>
struct NaiveRounding<Float8, Out> {
  using Score = Out;
  using Probability = Float8;
};

template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One row of a (batch, row, head, dim) tensor held across the lanes of a warp: its first `dim`
// entries (head_dim for Q, K and their gradients, head_dim_v for V, O, dO and dV), the rest 0.
template <typename Acc>
struct WarpRow {
  Acc x[kElemsPerLane];

  template <typename T>
  __device__ void load(const T* row, int dim, int lane) {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      x[c] = d < dim ? static_cast<Acc>(to_float(row[d])) : Acc(0);
    }
  }
  template <typename T>
  __device__ void store(T* row, int dim, int lane, Acc scale) const {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < dim) row[d] = from_float<T>(static_cast<float>(x[c] * scale));
    }
  }
  __device__ void zero() {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) x[c] = Acc(0);
  }
  // Full dot product with another row (same on every lane).
  template <typename T>
  __device__ Acc dot(const T* row, int dim, int lane) const {
    Acc partial = 0;
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < dim) partial += x[c] * static_cast<Acc>(to_float(row[d]));
    }
    return warp_sum(partial);
  }
  // x += alpha * row
  template <typename T>
  __device__ void axpy(Acc alpha, const T* row, int dim, int lane) {
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < dim) x[c] += alpha * static_cast<Acc>(to_float(row[d]));
    }
  }
};

// A position of one sequence, in the two coordinates the kernels need.
struct RowLocation {
  int batch;
  int index;             // position inside the sequence
  long long token;       // position along the whole token axis (batch * seqlen + index when fixed)
  long long tensor_row;  // the row as RowTensor addresses it: `index` in fixed-length mode (the
                         // batch stride does the rest), `token` in varlen mode
  bool real;             // false past seqused (or a clamped sequence end): such rows are not touched
};

__device__ inline RowLocation at_position(const SequenceLayout& layout, int batch, int index) {
  if (layout.varlen()) {
    const long long token = layout.sequence(batch).offset + index;
    return RowLocation{batch, index, token, token, true};
  }
  return RowLocation{batch, index, static_cast<long long>(batch) * layout.fixed_length + index, index, true};
}

// Resolves `token` (along the whole token axis) to its sequence and position.
__device__ inline RowLocation locate_token(const SequenceLayout& layout, int batch, long long token) {
  int b;
  if (layout.varlen()) {
    // Last b with cu_seqlens[b] <= token (binary search over batch + 1 prefix sums).
    int lo = 0, hi = batch;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (layout.cu_seqlens[mid] <= token)
        lo = mid;
      else
        hi = mid - 1;
    }
    b = lo;
  } else {
    b = static_cast<int>(token / layout.fixed_length);
  }
  if (b >= batch) return RowLocation{0, 0, token, 0, false};
  const Sequence seq = layout.sequence(b);
  const long long start = layout.varlen() ? seq.offset : static_cast<long long>(b) * layout.fixed_length;
  const long long index = token - start;
  RowLocation at = at_position(layout, b, static_cast<int>(index));
  at.real = index >= 0 && index < seq.length;
  return at;
}

// Runs body(location, head) for every real (row, head) pair of one side of the problem, one warp
// per pair in a grid-stride loop. Consecutive warps take consecutive rows of one head, so they share
// the other side's rows through the caches.
template <typename Body>
__device__ void for_each_warp_row(const SequenceLayout& layout, int batch, int heads, Body&& body) {
  const long long total = layout.total_tokens;
  const long long work = total * heads;
  const long long stride = static_cast<long long>(gridDim.x) * kWarpsPerBlock;
  for (long long w = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize; w < work; w += stride) {
    const RowLocation at = locate_token(layout, batch, w % total);
    if (at.real) body(at, static_cast<int>(w / total));
  }
}

template <typename T>
__device__ __forceinline__ T* row_pointer(const RowTensor& t, const RowLocation& at, int head) {
  return static_cast<T*>(t.data) + at.batch * t.batch_stride + at.tensor_row * t.row_stride + head * t.head_stride;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Runtime dtypes and precision to the types of a launch. Unknown values are an error, never a
// silent default.

// launch(TypeTag<Acc>{}) with the accumulator of `precision`.
template <typename Launch>
cudaError_t with_accumulator(ReferencePrecision precision, Launch&& launch) {
  switch (precision) {
    case ReferencePrecision::kFloat32:
    case ReferencePrecision::kNaiveLowPrecision:
      return launch(TypeTag<float>{});
    case ReferencePrecision::kFloat64:
      return launch(TypeTag<double>{});
  }
  return cudaErrorInvalidValue;
}

// launch(TypeTag<T>{}) with the 16-bit element type of `dtype`.
template <typename Launch>
cudaError_t with_16bit_element(DType dtype, Launch&& launch) {
  switch (dtype) {
    case DType::kFloat16:
      return launch(TypeTag<__half>{});
    case DType::kBFloat16:
      return launch(TypeTag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// launch(TypeTag<T>{}, TypeTag<Acc>{}) for 16-bit tensors that all share `dtype` (the backward).
template <typename Launch>
cudaError_t dispatch_types(DType dtype, ReferencePrecision precision, Launch&& launch) {
  return with_16bit_element(dtype, [&](auto element) {
    return with_accumulator(precision, [&](auto accumulator) { return launch(element, accumulator); });
  });
}

// launch(TypeTag<T>{}, TypeTag<Out>{}, TypeTag<Acc>{}) for inputs of `dtype` (16-bit or FP8) and
// an output of `out_dtype` (the forward: FP8 inputs write O in bf16 or fp16).
template <typename Launch>
cudaError_t dispatch_forward_types(DType dtype, DType out_dtype, ReferencePrecision precision, Launch&& launch) {
  if (dtype == DType::kFloat8E4M3) {
    return with_16bit_element(out_dtype, [&](auto output) {
      return with_accumulator(precision,
                              [&](auto accumulator) { return launch(TypeTag<Float8>{}, output, accumulator); });
    });
  }
  if (out_dtype != dtype) return cudaErrorInvalidValue;
  return dispatch_types(dtype, precision, [&](auto element, auto accumulator) {
    return launch(element, element, accumulator);
  });
}

inline int grid_for(long long warps) {
  const long long blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace hopattn::reference_detail
