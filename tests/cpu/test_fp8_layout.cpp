// The FP8 forward's operand order (fwd_fp8.cuh, fwd_fp8_layout.hpp): V^T's keys within each 32 are
// the permutation under which every value of P's register A operand is one its thread already
// holds as the accumulator of S, and the in-kernel transposition puts V's bytes there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>

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

TEST(Fp8Layout, BytePermuteTakesTheSelectedBytes) {
  const uint32_t a = 0x33221100u, b = 0x77665544u;
  EXPECT_EQ(byte_permute(a, b, 0x6420u), 0x66442200u);
  EXPECT_EQ(byte_permute(a, b, 0x7531u), 0x77553311u);
  EXPECT_EQ(byte_permute(a, b, 0x3210u), a);
  EXPECT_EQ(byte_permute(a, b, 0x7654u), b);
}

// One transposition step (Fp8VTransposeStep) on a model of the two instructions, as PTX defines
// them: ldmatrix.x4.trans hands thread t, of matrix m (rows addressed by lanes 8m..8m+7), the
// 16-bit elements (row 2 (t % 4), column t / 4) and (row 2 (t % 4) + 1, column t / 4), the first in
// the low half; stmatrix.x4 writes thread t's word i to row t / 4, 16-bit columns 2 (t % 4) and
// 2 (t % 4) + 1 of matrix i (rows addressed by lanes 8i..8i+7). Every V^T byte of the step's 16
// columns x 32 positions must be written once, with V's byte of its column and of the key that
// fp8_key_order puts at its position: checked with V's bytes set to their key, then to their column.
TEST(Fp8Layout, TransposeStepWritesVtInKeyOrder) {
  using Step = Fp8VTransposeStep;
  for (int pass = 0; pass < 2; ++pass) {
    uint8_t v[32][16];  // (key, column)
    for (int k = 0; k < 32; ++k) {
      for (int d = 0; d < 16; ++d) v[k][d] = static_cast<uint8_t>(pass == 0 ? k : d);
    }
    int vt[16][32];  // (column, position); -1: not written
    for (auto& row : vt) std::fill(std::begin(row), std::end(row), -1);
    uint32_t words[32][4];  // each thread's stmatrix words
    for (int t = 0; t < 32; ++t) {
      uint32_t in[4];
      for (int m = 0; m < 4; ++m) {
        const int j = t % 4, c = t / 4;
        const uint8_t* even = v[Step::source_key(8 * m + 2 * j)];  // the rows lanes 8m + 2j, 8m + 2j + 1 address
        const uint8_t* odd = v[Step::source_key(8 * m + 2 * j + 1)];
        in[m] = uint32_t(even[2 * c]) | uint32_t(even[2 * c + 1]) << 8 | uint32_t(odd[2 * c]) << 16 |
                uint32_t(odd[2 * c + 1]) << 24;
      }
      for (int i = 0; i < 4; ++i) words[t][i] = byte_permute(in[i / 2 * 2], in[i / 2 * 2 + 1], Step::selector(i));
    }
    for (int i = 0; i < 4; ++i) {
      for (int t = 0; t < 32; ++t) {
        const int lane = 8 * i + t / 4;  // the lane that addresses the row thread t's word goes to
        const int column = Step::target_column(lane);
        for (int b = 0; b < 4; ++b) {
          const int position = Step::target_position(lane) + 4 * (t % 4) + b;
          ASSERT_EQ(vt[column][position], -1) << "written twice: column " << column << " position " << position;
          vt[column][position] = static_cast<int>(words[t][i] >> (8 * b) & 0xffu);
        }
      }
    }
    for (int d = 0; d < 16; ++d) {
      for (int p = 0; p < 32; ++p) {
        const int expected = pass == 0 ? fp8_key_order(p) : d;
        EXPECT_EQ(vt[d][p], expected) << (pass == 0 ? "key" : "column") << " at column " << d << " position " << p;
      }
    }
  }
}

}  // namespace
}  // namespace hopattn
