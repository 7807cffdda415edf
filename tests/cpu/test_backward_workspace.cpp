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

#include "kernels/bwd/bwd_workspace.hpp"

namespace hopattn {
namespace {

constexpr int kHeadDim = 128;

Problem varlen_problem(const std::vector<int32_t>& cu_seqlens, const std::vector<int32_t>* seqused, int heads) {
  Problem p;
  p.batch = static_cast<int>(cu_seqlens.size()) - 1;
  p.heads = p.heads_kv = heads;
  p.head_dim = kHeadDim;
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
  p.head_dim = kHeadDim;
  p.max_seqlen_q = p.max_seqlen_k = length;
  p.queries.fixed_length = length;
  p.queries.total_tokens = static_cast<long long>(batch) * length;
  p.keys = p.queries;
  return p;
}

// Walks every query block of `block_m` rows of every sequence and head as the kernels do.
void check_blocks(const Problem& p, int block_m) {
  SCOPED_TRACE("block_m " + std::to_string(block_m) + ", batch " + std::to_string(p.batch));
  const size_t bytes = BackwardWorkspace::bytes_for(p, kHeadDim);
  // carve() only does address arithmetic: a made-up aligned base is enough to check the bounds.
  const uintptr_t base = uintptr_t{1} << 30;
  const BackwardWorkspace w = BackwardWorkspace::carve(reinterpret_cast<void*>(base), p, kHeadDim);
  const long long rows = static_cast<long long>(p.heads) * w.padded_rows;
  const uintptr_t end = base + bytes;
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.dq_accum + rows * kHeadDim), end);
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.semaphores + rows / BackwardWorkspace::kSemaphoreRows), end);
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.dpsum + rows), reinterpret_cast<uintptr_t>(w.dq_accum));

  std::set<long long> rows_taken;
  std::set<const int32_t*> semaphores_taken;
  for (int head : std::set<int>{0, p.heads - 1}) {
    for (int b = 0; b < p.batch; ++b) {
      const long long start = w.sequence_row(p.queries, b);
      EXPECT_EQ(start % BackwardWorkspace::kRowBlock, 0) << "sequence " << b;
      const int length = p.queries.sequence(b).length;
      for (int m = 0; m * block_m < length; ++m) {
        const long long first = w.row_index(head, start + static_cast<long long>(m) * block_m);
        EXPECT_TRUE(semaphores_taken.insert(w.semaphore(first)).second) << "sequence " << b << " block " << m;
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

}  // namespace
}  // namespace hopattn
