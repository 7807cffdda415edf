// Where the FP8 forward's operands sit (fwd_fp8.cuh explains why): the key order of V^T within
// each 32 keys, and how one transposition step moves V's bytes there. Host and device.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace hopattn {

HOPATTN_HOST_DEVICE constexpr int fp8_key_order(int k) {
  const int h = k / 16, q = k % 16 / 4, i = k % 4;
  return 2 * q + i % 2 + 8 * (i / 2 + 2 * h);
}

// One step of the in-kernel transposition (transpose_v_block): a warp moves 32 keys x 16 head-dim
// columns of V (keys as rows, 512 bytes) into V^T (head-dim columns as rows, keys in
// fp8_key_order) with one ldmatrix.x4.trans, four byte permutes and one stmatrix.x4.
// ldmatrix reads four 8 x 8 matrices of 16-bit elements, lane L addressing row L % 8 of matrix
// L / 8; .trans gives thread t, of matrix m, the element pair (rows 2 (t % 4) and 2 (t % 4) + 1,
// column t / 4): for e4m3 bytes, two keys' byte pairs of head-dim columns 2 (t / 4) and
// 2 (t / 4) + 1. Matrix m holding keys 8m..8m+7, the permutes pair matrices (0, 1) and (2, 3)
// into words of four keys of one column: (2j, 2j + 1, 8 + 2j, 9 + 2j) (+ 16), j = t % 4, which
// are exactly positions 4j..4j+3 of fp8_key_order. stmatrix writes thread t's word i to row
// t / 4, bytes 4 (t % 4).. of matrix i, lane L addressing row L % 8 of matrix L / 8.
struct Fp8VTransposeStep {
  // The key (within the 32) of the V row whose 16 bytes lane `lane` addresses for ldmatrix.
  HOPATTN_HOST_DEVICE static constexpr int source_key(int lane) { return lane; }
  // The V^T row (head-dim column within the 16) and its first position (within the 32) whose 16
  // bytes lane `lane` addresses for stmatrix: matrices 0 and 2 take the even columns (the
  // permutes' first words), 1 and 3 the odd ones; 0 and 1 the first 16 positions.
  HOPATTN_HOST_DEVICE static constexpr int target_column(int lane) { return 2 * (lane % 8) + lane / 8 % 2; }
  HOPATTN_HOST_DEVICE static constexpr int target_position(int lane) { return 16 * (lane / 16); }
  // stmatrix word i = byte permute (PRMT) of ldmatrix words 2 (i / 2) and 2 (i / 2) + 1: bytes
  // 0 and 2 of each (column 2c) for even i, bytes 1 and 3 (column 2c + 1) for odd i.
  HOPATTN_HOST_DEVICE static constexpr uint32_t selector(int i) { return i % 2 == 0 ? 0x6420u : 0x7531u; }
};

// PRMT (__byte_perm): byte i of the result is byte (selector >> 4 i) & 7 of the eight bytes of
// (a, b), a's first.
HOPATTN_HOST_DEVICE uint32_t byte_permute(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, selector);
#else
  const uint64_t bytes = static_cast<uint64_t>(b) << 32 | a;
  uint32_t result = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t byte = static_cast<uint32_t>(bytes >> (8 * ((selector >> (4 * i)) & 7))) & 0xffu;
    result |= byte << (8 * i);
  }
  return result;
#endif
}

}  // namespace hopattn
