// The backward workspace pads each sequence's query rows so that every query block of every
// backward kernel (64 or 128 rows) is one whole chunk of its own sequence: blocks of different
// sequences never share rows, all of them fit the arrays that bytes_for() sized, and each block
// has a semaphore of its own. A block that overlapped the next sequence would let the main kernel
// add one sequence's dQ into another's.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kernels/bwd/bwd_head_slices.hpp"
#include "kernels/bwd/bwd_workspace.hpp"

namespace hopattn {
namespace {

// Different Q/K and V head dims, so that each array is checked against its own row length.
constexpr HeadDimPair kKernel{192, 128};

Problem varlen_problem(const std::vector<int32_t>& cu_seqlens, const std::vector<int32_t>* seqused, int heads) {
  Problem p;
  p.batch = static_cast<int>(cu_seqlens.size()) - 1;
  p.heads = p.heads_kv = heads;
  p.head_dim = kKernel.qk;
  p.head_dim_v = kKernel.v;
  p.queries.cu_seqlens = cu_seqlens.data();
  p.queries.seqused = seqused != nullptr ? seqused->data() : nullptr;
  p.queries.total_tokens = cu_seqlens.back();
  p.keys = p.queries;
  for (int b = 0; b < p.batch; ++b) {
    p.max_seqlen_q = std::max(p.max_seqlen_q, cu_seqlens[b + 1] - cu_seqlens[b]);
  }
  p.max_seqlen_k = p.max_seqlen_q;
  return p;
}

Problem fixed_problem(int batch, int length, int heads) {
  Problem p;
  p.batch = batch;
  p.heads = p.heads_kv = heads;
  p.head_dim = kKernel.qk;
  p.head_dim_v = kKernel.v;
  p.max_seqlen_q = p.max_seqlen_k = length;
  p.queries.fixed_length = length;
  p.queries.total_tokens = static_cast<long long>(batch) * length;
  p.keys = p.queries;
  return p;
}

// Walks every query block of `block_m` rows of every sequence and head as the kernels do.
void check_blocks(const Problem& p, int block_m) {
  SCOPED_TRACE("block_m " + std::to_string(block_m) + ", batch " + std::to_string(p.batch));
  const size_t bytes = BackwardWorkspace::bytes_for(p, kKernel);
  // carve() only does address arithmetic: a made-up aligned base is enough to check the bounds.
  const uintptr_t base = uintptr_t{1} << 30;
  const BackwardWorkspace w = BackwardWorkspace::carve(reinterpret_cast<void*>(base), p, kKernel);
  const long long rows = static_cast<long long>(p.heads) * w.padded_rows;
  const uintptr_t end = base + bytes;
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.dq_accum + rows * kKernel.qk), end);
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.semaphores + rows / BackwardWorkspace::kSemaphoreRows), end);
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.dpsum + rows), reinterpret_cast<uintptr_t>(w.dq_accum));
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.semaphores + rows / BackwardWorkspace::kSemaphoreRows),
            reinterpret_cast<uintptr_t>(w.sink_partials));
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.sink_partials + rows / BackwardWorkspace::kRowBlock),
            reinterpret_cast<uintptr_t>(w.tile_counter));
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.tile_counter + 1), end);
  if (w.dk_accum != nullptr) {
    EXPECT_LE(reinterpret_cast<uintptr_t>(w.tile_counter + 1), reinterpret_cast<uintptr_t>(w.dk_accum));
  }

  std::set<long long> rows_taken;
  std::set<const int32_t*> semaphores_taken;
  std::set<const double*> sink_partials_taken;
  for (int head : std::set<int>{0, p.heads - 1}) {
    for (int b = 0; b < p.batch; ++b) {
      const long long start = w.sequence_row(p.queries, b);
      EXPECT_EQ(start % BackwardWorkspace::kRowBlock, 0) << "sequence " << b;
      const int length = p.queries.sequence(b).length;
      for (int m = 0; m * block_m < length; ++m) {
        const long long first = w.row_index(head, start + static_cast<long long>(m) * block_m);
        for (int share = 0; share < BackwardWorkspace::kDqShares; ++share) {  // deterministic mode's turns
          const int32_t* semaphore = w.dq_share_semaphore(first, share);
          EXPECT_TRUE(semaphores_taken.insert(semaphore).second) << "sequence " << b << " block " << m << " share " << share;
          EXPECT_LT(semaphore - w.semaphores, rows / BackwardWorkspace::kSemaphoreRows);
        }
        EXPECT_EQ(w.semaphore(first), w.dq_share_semaphore(first, 0));
        if (block_m == BackwardWorkspace::kRowBlock) {  // the preprocess's blocks, one sink partial each
          EXPECT_TRUE(sink_partials_taken.insert(w.sink_partial(first)).second) << "sequence " << b << " block " << m;
          EXPECT_LT(w.sink_partial(first) - w.sink_partials, rows / BackwardWorkspace::kRowBlock);
        }
        EXPECT_LT(w.semaphore(first) - w.semaphores, rows / BackwardWorkspace::kSemaphoreRows);
        for (long long r = first; r < first + block_m; ++r) {
          ASSERT_TRUE(rows_taken.insert(r).second) << "row " << r << " of sequence " << b << " block " << m;
          ASSERT_LT(r, (head + 1LL) * w.padded_rows) << "sequence " << b << " block " << m;
        }
      }
    }
  }
}

TEST(BackwardWorkspace, VarlenBlocksStayInsideTheirSequence) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 12);
    std::vector<int32_t> cu{0};
    for (int b = 0; b < batch; ++b) {
      // Empty, short, just over a block boundary, and long sequences.
      const int kinds[] = {0, 1 + static_cast<int>(rng() % 64), 127 + static_cast<int>(rng() % 3),
                           static_cast<int>(rng() % 1000)};
      cu.push_back(cu.back() + kinds[rng() % 4]);
    }
    std::vector<int32_t> seqused;
    for (int b = 0; b < batch; ++b) seqused.push_back(static_cast<int32_t>(rng() % 300));
    const bool with_seqused = trial % 3 == 0;
    const Problem p = varlen_problem(cu, with_seqused ? &seqused : nullptr, 1 + static_cast<int>(rng() % 3));
    for (int block_m : {64, 128}) check_blocks(p, block_m);
  }
}

TEST(BackwardWorkspace, FixedLengthBlocksStayInsideTheirSequence) {
  for (int length : {1, 63, 64, 65, 127, 128, 129, 300, 1000}) {
    for (int batch : {1, 3}) {
      for (int block_m : {64, 128}) check_blocks(fixed_problem(batch, length, 2), block_m);
    }
  }
}

// With GQA the dK/dV sums of every key block (64 or 128 rows) of every KV head are whole chunks
// of their own sequence inside the range the launch clears, each with a semaphore of its own.
void check_key_blocks(const Problem& p, int block_n) {
  SCOPED_TRACE("block_n " + std::to_string(block_n) + ", batch " + std::to_string(p.batch));
  const uintptr_t base = uintptr_t{1} << 30;
  const BackwardWorkspace w = BackwardWorkspace::carve(reinterpret_cast<void*>(base), p, kKernel);
  ASSERT_GT(w.padded_key_rows, 0);
  const uintptr_t end = base + BackwardWorkspace::bytes_for(p, kKernel);
  const long long key_rows = static_cast<long long>(p.heads_kv) * w.padded_key_rows;
  const uintptr_t clear_begin = reinterpret_cast<uintptr_t>(w.dk_accum);
  const uintptr_t clear_end = clear_begin + w.kv_clear_bytes(p.heads_kv);
  EXPECT_LE(clear_end, end);
  EXPECT_GE(clear_begin, reinterpret_cast<uintptr_t>(w.semaphores + static_cast<long long>(p.heads) * w.padded_rows /
                                                                     BackwardWorkspace::kSemaphoreRows));
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.dk_accum + key_rows * kKernel.qk), reinterpret_cast<uintptr_t>(w.dv_accum));
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.dv_accum + key_rows * kKernel.v), reinterpret_cast<uintptr_t>(w.kv_semaphores));
  std::set<long long> rows_taken;
  std::set<const int32_t*> semaphores_taken;
  std::set<const double*> sink_partials_taken;
  for (int head_kv : std::set<int>{0, p.heads_kv - 1}) {
    for (int b = 0; b < p.batch; ++b) {
      const long long start = w.sequence_row(p.keys, b);
      const int length = p.keys.sequence(b).length;
      for (int n = 0; n * block_n < length; ++n) {
        const long long first = w.key_row_index(head_kv, start + static_cast<long long>(n) * block_n);
        const int32_t* semaphore = w.kv_semaphore(first);
        EXPECT_TRUE(semaphores_taken.insert(semaphore).second) << "sequence " << b << " block " << n;
        EXPECT_LT(reinterpret_cast<uintptr_t>(semaphore), clear_end);
        for (long long r = first; r < first + block_n; ++r) {
          ASSERT_TRUE(rows_taken.insert(r).second) << "row " << r << " of sequence " << b << " block " << n;
          ASSERT_LT(r, (head_kv + 1LL) * w.padded_key_rows) << "sequence " << b << " block " << n;
        }
      }
    }
  }
}

Problem with_gqa(Problem p, int heads_kv) {
  p.heads *= heads_kv;  // groups of the old head count
  p.heads_kv = heads_kv;
  return p;
}

TEST(BackwardWorkspace, GqaKeyBlocksStayInsideTheirSequence) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 6);
    std::vector<int32_t> cu{0};
    for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + static_cast<int>(rng() % 400));
    const Problem p = with_gqa(varlen_problem(cu, nullptr, 2 + static_cast<int>(rng() % 3)), 1 + static_cast<int>(rng() % 2));
    for (int block_n : {64, 128}) check_key_blocks(p, block_n);
  }
  for (int length : {1, 64, 129, 1000}) {
    for (int block_n : {64, 128}) check_key_blocks(with_gqa(fixed_problem(2, length, 4), 2), block_n);
  }
}

TEST(BackwardWorkspace, NoKeySumsWithoutGqa) {
  const Problem p = fixed_problem(2, 300, 4);
  const BackwardWorkspace w = BackwardWorkspace::carve(reinterpret_cast<void*>(uintptr_t{1} << 30), p, kKernel);
  EXPECT_EQ(w.padded_key_rows, 0);
  EXPECT_EQ(w.dk_accum, nullptr);
  EXPECT_EQ(BackwardWorkspace::kv_bytes_for(p, kKernel), 0u);
}

// The default mode's grid at 2k (d128: 32 query blocks of 64 rows).
BackwardGridShape grid(int key_blocks, int sms) { return {key_blocks, 32, sms, false}; }

TEST(BackwardHeadSlices, UnderAMaskWidenTheGridUpToTheTargetAndDivideTheGroup) {
  Problem p = fixed_problem(8, 2048, 32);
  p.mask = BandMask::from_args(true, -1, -1);
  p.heads_kv = 1;  // MQA 32/1: 16 key blocks x 8 sequences = 128 CTAs without slices
  const int slices = backward_head_slices(p, grid(16, 132));
  EXPECT_EQ(32 % slices, 0);
  EXPECT_GE(128LL * slices, kTargetWaves * 132LL);
  EXPECT_LT(128LL * slices / 2, kTargetWaves * 132LL) << "the smallest such divisor";
  p.heads_kv = 8;  // 4 heads a group, 1024 CTAs
  EXPECT_EQ(backward_head_slices(p, grid(16, 132)), 2);
  p.heads_kv = 32;  // no GQA
  EXPECT_EQ(backward_head_slices(p, grid(16, 132)), 1);
  p.heads_kv = 4;  // 8 a group, already a wide grid: still at most two heads a CTA
  EXPECT_EQ(backward_head_slices(p, grid(1024, 132)), 4);
  p.heads = 12;
  p.heads_kv = 4;  // 3 a group (odd): the wave rule alone
  EXPECT_EQ(backward_head_slices(p, grid(1024, 132)), 1);
  p.heads = 32;
  EXPECT_EQ(backward_head_slices(p, grid(1, 132)), 8) << "never more slices than heads";
  EXPECT_EQ(backward_head_slices(p, grid(16, 0)), 1) << "unknown SM count: one slice";
}

TEST(BackwardHeadSlices, UnderAMaskAtMostTwoHeadsACta) {
  Problem p = fixed_problem(8, 2048, 64);
  p.mask = BandMask::from_args(true, -1, -1);
  p.heads_kv = 8;  // 64/8: 1024 CTAs; the wave rule alone would take two slices of four heads
  EXPECT_EQ(backward_head_slices(p, grid(16, 132)), 4);
  p.heads_kv = 32;  // two heads a group: one slice
  EXPECT_EQ(backward_head_slices(p, grid(1024, 132)), 1);
}

TEST(BackwardHeadSlices, WithoutAMaskOnlyWhereTheyShortenTheWaves) {
  Problem p = fixed_problem(8, 2048, 32);
  p.heads_kv = 1;  // 128 CTAs fill one wave: two slices would still take one
  EXPECT_EQ(backward_head_slices(p, grid(16, 132)), 1);
  p.heads_kv = 8;  // 1024 CTAs, 7.8 waves
  EXPECT_EQ(backward_head_slices(p, grid(16, 132)), 1);
  p = fixed_problem(1, 2048, 32);
  p.heads_kv = 1;  // one sequence: 16 CTAs; 8 slices make 128, one wave of 8 times shorter CTAs
  EXPECT_EQ(backward_head_slices(p, grid(16, 132)), 8);
}

TEST(BackwardHeadSlices, DeterministicUnderAMaskBoundTheLongestCta) {
  Problem p = fixed_problem(1, 16384, 64);
  p.mask = BandMask::from_args(true, -1, -1);
  p.heads_kv = 8;  // 8 heads a group, 128 key blocks: the wave rule takes two slices, the head bound four
  const BackwardGridShape default_mode{128, 256, 132, false};
  EXPECT_EQ(backward_head_slices(p, default_mode), 4);
  BackwardGridShape deterministic = default_mode;
  deterministic.deterministic = true;
  EXPECT_EQ(backward_head_slices(p, deterministic), 8) << "256 query blocks: one head a CTA";
  deterministic.query_blocks = 64;  // 4k: two heads of 64 blocks
  EXPECT_EQ(backward_head_slices(p, deterministic), 4);
  deterministic.query_blocks = 32;  // 2k: two heads of 32 blocks (the head bound, not the block bound)
  p.batch = 8;
  deterministic.key_blocks = 16;
  EXPECT_EQ(backward_head_slices(p, deterministic), 4);
  p.mask = BandMask{};  // without a mask the CTAs of a head are alike: the wave rule alone
  deterministic.query_blocks = 256;
  EXPECT_EQ(backward_head_slices(p, deterministic), backward_head_slices(p, BackwardGridShape{16, 256, 132, false}));
}

}  // namespace
}  // namespace hopattn
