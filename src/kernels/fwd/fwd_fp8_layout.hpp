// Where the FP8 forward's operands sit (fwd_fp8.cuh explains why): the key order of V^T within
// each 32 keys, and the layout of the transposed V in the workspace. Host and device.
#pragma once

#include <cstddef>

#include "kernels/common/host_device.hpp"
#include "kernels/common/problem.hpp"

namespace hopattn {

inline constexpr int kFp8KeyAlignment = 128;

HOPATTN_HOST_DEVICE constexpr int fp8_key_order(int k) {
  const int h = k / 16, q = k % 16 / 4, i = k % 4;
  return 2 * q + i % 2 + 8 * (i / 2 + 2 * h);
}

// Where the transposed V of `p` lives: its token pitch and each sequence's first token.
struct Fp8TransposedV {
  HOPATTN_HOST_DEVICE static long long pitch_for(const Problem& p) {
    const long long a = kFp8KeyAlignment;
    if (p.keys.varlen()) return (p.total_k() + static_cast<long long>(p.batch) * a + a - 1) / a * a;
    return (static_cast<long long>(p.max_seqlen_k) + a - 1) / a * a;
  }
  HOPATTN_HOST_DEVICE static long long first_token(const Problem& p, int batch) {
    if (!p.keys.varlen()) return 0;
    return (p.keys.sequence(batch).offset + static_cast<long long>(batch) * kFp8KeyAlignment) / kFp8KeyAlignment *
           kFp8KeyAlignment;
  }
  static size_t bytes_for(const Problem& p) {
    const long long batches = p.keys.varlen() ? 1 : p.batch;
    return static_cast<size_t>(batches * p.heads_kv * p.head_dim_v * pitch_for(p));
  }
};

}  // namespace hopattn
