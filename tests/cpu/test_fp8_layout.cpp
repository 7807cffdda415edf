// The FP8 forward's operand order (fwd_fp8.cuh, fwd_fp8_layout.hpp): V^T's keys within each 32 are
// the permutation under which every value of P's register A operand is one its thread already
// holds as the accumulator of S, and the transposed V's sequences start aligned and never overlap.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kernels/fwd/fwd_fp8_layout.hpp"

namespace hopattn {
namespace {

TEST(Fp8Layout, KeyOrderIsAPermutationOfEach32Keys) {
  std::set<int> keys;
  for (int k = 0; k < 32; ++k) keys.insert(fp8_key_order(k));
  EXPECT_EQ(keys.size(), 32u);
  EXPECT_EQ(*keys.begin(), 0);
  EXPECT_EQ(*keys.rbegin(), 31);
}

// Thread lane q of its quad: the SM90 8-bit A layout (64 x 32) gives it K positions 4q + i + 16h
// (i < 4, h < 2); the fp32 accumulator layout (64 x N) columns 2q + c + 8j (c < 2). Value (i, r, h)
// of A's K step s is, in convert_p_to_fp8_operand, accumulator value (i % 2, r, 4s + 2h + i / 2).
TEST(Fp8Layout, EveryOperandValueIsTheThreadsOwnAccumulatorColumn) {
  for (int q = 0; q < 4; ++q) {
    std::set<int> held;  // accumulator columns of a 128-key block
    for (int j = 0; j < 16; ++j) {
      for (int c = 0; c < 2; ++c) held.insert(2 * q + c + 8 * j);
    }
    for (int s = 0; s < 4; ++s) {
      for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < 4; ++i) {
          const int position = 32 * s + 4 * q + i + 16 * h;  // A's K position in the block
          const int key = position / 32 * 32 + fp8_key_order(position % 32);
          const int column = 2 * q + i % 2 + 8 * (4 * s + 2 * h + i / 2);  // the value converted there
          EXPECT_EQ(key, column) << "q " << q << " s " << s << " h " << h << " i " << i;
          EXPECT_TRUE(held.count(column)) << "q " << q << " column " << column;
        }
      }
    }
  }
}

TEST(Fp8Layout, TransposedSequencesStartAlignedAndDoNotOverlap) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 6);
    std::vector<int32_t> cu{0};
    for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + static_cast<int32_t>(rng() % 400));
    Problem p;
    p.batch = batch;
    p.heads = p.heads_kv = 2;
    p.head_dim = p.head_dim_v = 64;
    p.keys.cu_seqlens = cu.data();
    p.keys.total_tokens = cu.back();
    const long long pitch = Fp8TransposedV::pitch_for(p);
    EXPECT_EQ(pitch % kFp8KeyAlignment, 0);
    long long end = 0;  // of the previous sequence's last block
    for (int b = 0; b < batch; ++b) {
      const long long first = Fp8TransposedV::first_token(p, b);
      const int length = cu[b + 1] - cu[b];
      const long long blocks = (length + kFp8KeyAlignment - 1) / kFp8KeyAlignment;
      EXPECT_EQ(first % kFp8KeyAlignment, 0) << "sequence " << b;
      EXPECT_GE(first, end) << "sequence " << b;
      end = first + std::max<long long>(blocks, 1) * kFp8KeyAlignment;  // its first block is always written
      EXPECT_LE(end, pitch) << "sequence " << b;
    }
  }
}

}  // namespace
}  // namespace hopattn
