// The FP8 (e4m3) forward's two pieces that bf16 does not need.
//
// FP8 WGMMA reads both operands K-major, so O += P V needs V^T with the keys contiguous, and P,
// an fp32 accumulator, must become the e4m3 register A operand. Per 32 keys (one WGMMA K step) a
// thread holds, as A, keys 4q..4q+3 and 16+4q..16+4q+3 (q: its lane in its quad), but, as the
// accumulator of S, columns 2q, 2q+1 (+ 8j, j = 0..3). Rather than exchange values between
// threads, the keys of V^T are stored permuted within each 32: A's key position
// k = 4q + i + 16h holds key fp8_key_order(k) = 2q + i % 2 + 8 (i / 2 + 2h), which is a column the
// thread holds. Both V^T and P are then permuted alike, and their product sums the same pairs.
//
// V^T is written before the forward into the workspace (transpose_v_for_fp8), zero past each
// sequence's keys (a zero P times a NaN there would be NaN), each sequence's keys starting at a
// multiple of 128 so that every key block starts at a multiple of 32:
//   fixed length: (batch, heads_kv, head_dim_v, pitch), pitch = seqlen_k rounded up to 128;
//   varlen: (1, heads_kv, head_dim_v, pitch), sequence b from (cu_seqlens_k[b] + 128 b) / 128 * 128,
//   pitch = total_k + 128 batch rounded up to 128.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/problem.hpp"
#include "kernels/fwd/fwd_fp8_layout.hpp"

namespace hopattn {

// P, the fp32 accumulator of S ((2, 2, V), 1, 1) of one warpgroup's 64 rows, into the e4m3 A
// operand of the P V WGMMA ((4, 2, 2), 1, V / 4), contiguous: A value (i, r, h) of K step s is
// accumulator value (i % 2, r, 4 s + 2 h + i / 2) (see fp8_key_order). cvt.rn.satfinite.e4m3x2
// puts its first operand in the upper byte.
template <class Acc, class OperandA>
CUTE_DEVICE void convert_p_to_fp8_operand(Acc const& acc, OperandA& a) {
  constexpr int kGroups = decltype(cute::size<0, 2>(acc))::value;  // of 8 columns
  static_assert(kGroups % 4 == 0, "P V steps over 32 keys");
  static_assert(decltype(cute::size(a))::value == 4 * kGroups, "one e4m3 value per probability");
  uint32_t* regs = reinterpret_cast<uint32_t*>(cute::raw_pointer_cast(a.data()));
  auto pair = [&](int r, int j) {
    uint16_t packed;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(acc(1 + 2 * r + 4 * j)), "f"(acc(2 * r + 4 * j)));
    return static_cast<uint32_t>(packed);
  };
  CUTE_UNROLL
  for (int s = 0; s < kGroups / 4; ++s) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int j = 4 * s + 2 * h;
        regs[4 * s + r + 2 * h] = pair(r, j) | pair(r, j + 1) << 16;
      }
    }
  }
}

inline constexpr int kTransposeThreads = 128;

// One CTA per (block of 128 keys, KV head, sequence): the block's rows of V through shared memory
// into V^T's rows of head_dim_v (kHeadDimV at most), keys in fp8_key_order per 32, zeros past the
// sequence's keys.
template <int kHeadDimV>
__global__ void __launch_bounds__(kTransposeThreads)
    transpose_v_for_fp8_kernel(const Problem problem, const RowTensor v, uint8_t* vt) {
  constexpr int kKeys = kFp8KeyAlignment;
  __shared__ alignas(16) uint8_t tile[kKeys][kHeadDimV + 16];
  const int block = blockIdx.x, head_kv = blockIdx.y, batch = blockIdx.z;
  const Sequence seq = problem.keys.sequence(batch);
  if (block * kKeys >= seq.length && block > 0) return;  // past this sequence (its first block writes zeros)
  const int columns = problem.head_dim_v;  // a multiple of 16 (validate.cpp)
  const int keys = min(kKeys, max(0, seq.length - block * kKeys));
  const long long batch_index = problem.keys.varlen() ? 0 : batch;
  for (int i = threadIdx.x; i < kKeys * (columns / 16); i += kTransposeThreads) {
    const int key = i / (columns / 16), chunk = i % (columns / 16);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (key < keys) {
      value = *reinterpret_cast<const uint4*>(
          v.at<const uint8_t>(batch_index, seq.offset + static_cast<long long>(block) * kKeys + key, head_kv) +
          16 * chunk);
    }
    *reinterpret_cast<uint4*>(&tile[key][16 * chunk]) = value;
  }
  __syncthreads();
  const long long pitch = Fp8TransposedV::pitch_for(problem);
  uint8_t* out = vt + ((batch_index * problem.heads_kv + head_kv) * columns) * pitch +
                 Fp8TransposedV::first_token(problem, batch) + static_cast<long long>(block) * kKeys;
  for (int i = threadIdx.x; i < columns * (kKeys / 16); i += kTransposeThreads) {
    const int d = i / (kKeys / 16), chunk = i % (kKeys / 16);
    alignas(16) uint8_t bytes[16];
    CUTE_UNROLL
    for (int e = 0; e < 16; ++e) {
      const int position = 16 * chunk + e;
      bytes[e] = tile[position / 32 * 32 + fp8_key_order(position % 32)][d];
    }
    *reinterpret_cast<uint4*>(out + d * pitch + 16 * chunk) = *reinterpret_cast<const uint4*>(bytes);
  }
}

}  // namespace hopattn
