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
// V arrives by TMA as it sits in memory (head dim contiguous) in a ring of its own (v_rows), and
// two warps of the producer warpgroup, idle otherwise, transpose each block into the V^T stage the
// consumers read (fp8_v_transposer), keys in fp8_key_order: no pass over V before the forward and
// no workspace, which a decode step over an FP8 cache could not afford (V read three times).
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

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

inline constexpr int kFp8TransposerWarps = 2;  // warps 2 and 3 of the producer warpgroup
inline constexpr int kFp8TransposerThreads = kFp8TransposerWarps * cutlass::NumThreadsPerWarp;

// One V block into V^T, split by steps of 32 keys x 16 head-dim columns between the transposer
// warps (Fp8VTransposeStep). `from`: the shared memory address of this lane's ldmatrix row of the
// first step, V's (column 0, key source_key(lane)) in its v_rows stage; `to`: its stmatrix row's,
// V^T's (column target_column(lane), position target_position(lane)) in its stage. Both layouts
// swizzle the 16-byte chunk of a row by XOR with the row's own address bits, so the other steps'
// addresses follow from these two without the layouts' arithmetic (which, with each step's
// addresses kept, spilled the producer warpgroup's 24 registers):
// - V (head dim contiguous, keys as rows of kVRowBytes = 64 (d64) or 128 bytes): 16 columns
//   further is an XOR of 16 c on the chunk bits within an atom's row, the next atom column
//   kVAtomColumnBytes further; 32 keys further is kV32KeyBytes further (whole atoms);
// - V^T (keys contiguous, head-dim columns as rows of kBlockN = 128 bytes): 32 positions further
//   is bits 5-6 XOR 32 g; 16 columns further is 16 rows (2 atoms) further, kVt16ColumnBytes.
// The distances come from the layouts' unswizzled offsets.
template <class Traits>
CUTE_DEVICE void transpose_v_block(uint32_t from, uint32_t to, int warp) {
  using Step = Fp8VTransposeStep;
  using VRows = typename Traits::SmemLayoutVRows;  // (head dim, keys, stages)
  using Vt = typename Traits::SmemLayoutVt;        // (head dim, positions, stages)
  using VRowsSwizzle = decltype(VRows{}.layout_a());
  constexpr int kVRowBytes = VRows{}.layout_b()(0, 1, 0);  // a key's row within its atom: 64 or 128
  constexpr int kVChunks = kVRowBytes / 16;
  static_assert((1 << VRowsSwizzle::num_bits) == kVChunks && VRowsSwizzle::num_base == 4 &&
                    VRowsSwizzle::num_shft == 3 && std::is_same_v<decltype(Vt{}.layout_a()), cute::Swizzle<3, 4, 3>>,
                "swizzles that XOR the 16-byte chunk of a row with the row's bits (V's 64 or 128 bytes, V^T's 128)");
  static_assert(VRows{}.layout_b()(16, 0, 0) == 16 && Vt{}.layout_b()(1, 0, 0) == 128 &&
                    Vt{}.layout_b()(0, 32, 0) == 32 && Traits::kBlockN == 128 && kVChunks % 2 == 0,
                "V's columns contiguous; V^T's head-dim columns rows of the whole block's 128 keys");
  constexpr uint32_t kV32KeyBytes = VRows{}.layout_b()(0, 32, 0);
  constexpr uint32_t kVAtomColumnBytes = Traits::kHeadDimV > kVRowBytes ? VRows{}.layout_b()(kVRowBytes, 0, 0) : 0;
  constexpr uint32_t kVt16ColumnBytes = Vt{}.layout_b()(16, 0, 0);
  constexpr int kKeyGroups = Traits::kBlockN / 32;
  constexpr int kColumnBlocks = Traits::kHeadDimV / 16;
  static_assert(kFp8TransposerWarps == 2 && kColumnBlocks % 2 == 0, "each warp takes every other column block");
  // Warp w takes column blocks c = 2 j + w, all key groups g of each: with w the only runtime
  // part, and c's bit 0, it enters the two bases once (kVChunks being even, c % kVChunks and
  // c / kVChunks are (2 j) % kVChunks + w and (2 j) / kVChunks), and every step's offsets are
  // constants. (A runtime step index put every step's
  // offsets in registers, which spilled.)
  from ^= 16 * warp;
  to += warp * kVt16ColumnBytes;
  CUTE_UNROLL
  for (int i = 0; i < kKeyGroups * kColumnBlocks / 2; ++i) {
    const uint32_t g = i % kKeyGroups, c = 2 * (i / kKeyGroups);  // c: the column block less w
    const uint32_t row_address = (from ^ (16 * (c % kVChunks))) + g * kV32KeyBytes + c / kVChunks * kVAtomColumnBytes;
    uint32_t in[4];
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(in[0]), "=r"(in[1]), "=r"(in[2]), "=r"(in[3])
                 : "r"(row_address));
    uint32_t out[4];
    CUTE_UNROLL
    for (int w = 0; w < 4; ++w) out[w] = byte_permute(in[w / 2 * 2], in[w / 2 * 2 + 1], Step::selector(w));
    const uint32_t vt_address = (to + c * kVt16ColumnBytes) ^ (32 * g);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(vt_address), "r"(out[0]),
                 "r"(out[1]), "r"(out[2]), "r"(out[3])
                 : "memory");
  }
}

}  // namespace hopattn
