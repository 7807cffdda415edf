// The backward's device workspace, caller-allocated and sized by backward_workspace_size():
//   lse_log2  (heads, padded_rows) fp32  the forward's LSE in log2 units (+inf on padding rows)
//   dpsum     (heads, padded_rows) fp32  D = rowsum(dO * O) (0 on padding rows)
//   dq_accum  (heads, padded_rows, head_dim) fp32  dQ accumulated by the key blocks; each block of
//             kRowBlock rows is one contiguous chunk in the order the main kernel's registers hold it
//   semaphores (heads, padded_rows / kSemaphoreRows) int32  per query block: how many key blocks
//             have added into it (deterministic mode); a block of more rows uses its first one.
//             Without determinism the first one of each (sequence, KV head) counts the key blocks
//             that have finished instead (finished_key_blocks)
// Each sequence's rows start at a multiple of kRowBlock ("padded offsets"), so that every query
// block of every kernel (64 or 128 rows, dividing kRowBlock) is a whole chunk that bulk copies can
// move: sequence b of a varlen batch starts at floor((cu_seqlens[b] + b * kRowBlock) / kRowBlock) *
// kRowBlock, which leaves room for the previous sequence's last partial block; a fixed-length batch
// simply rounds every sequence up.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/problem.hpp"
#include "kernels/common/host_device.hpp"

namespace hopattn {

struct BackwardWorkspace {
  static constexpr int kRowBlock = 128;      // the tallest query block of any main kernel
  static constexpr int kSemaphoreRows = 64;  // the shortest one
  static constexpr size_t kAlignment = 256;

  float* lse_log2 = nullptr;
  float* dpsum = nullptr;
  float* dq_accum = nullptr;
  int32_t* semaphores = nullptr;
  long long padded_rows = 0;  // per head
  int head_dim = 0;           // the kernel's head dim (dq_accum's row length)

  HOPATTN_HOST_DEVICE static long long round_up(long long x, long long to) { return (x + to - 1) / to * to; }

  HOPATTN_HOST_DEVICE static long long padded_rows_for(const Problem& p) {
    if (p.varlen()) return round_up(p.total_q() + static_cast<long long>(p.batch) * kRowBlock, kRowBlock);
    return static_cast<long long>(p.batch) * round_up(p.max_seqlen_q, kRowBlock);
  }

  static size_t bytes_for(const Problem& p, int kernel_head_dim) {
    const long long rows = static_cast<long long>(p.heads) * padded_rows_for(p);
    const size_t per_row = sizeof(float) * (2 + static_cast<size_t>(kernel_head_dim));
    return static_cast<size_t>(rows) * per_row + static_cast<size_t>(rows / kSemaphoreRows) * sizeof(int32_t) +
           4 * kAlignment;
  }

  // Carves the arrays out of `base` (16-byte aligned, at least bytes_for() bytes).
  static BackwardWorkspace carve(void* base, const Problem& p, int kernel_head_dim) {
    BackwardWorkspace w;
    w.padded_rows = padded_rows_for(p);
    w.head_dim = kernel_head_dim;
    const long long rows = static_cast<long long>(p.heads) * w.padded_rows;
    auto aligned = [](uintptr_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; };
    uintptr_t at = aligned(reinterpret_cast<uintptr_t>(base));
    w.lse_log2 = reinterpret_cast<float*>(at);
    at = aligned(at + rows * sizeof(float));
    w.dpsum = reinterpret_cast<float*>(at);
    at = aligned(at + rows * sizeof(float));
    w.dq_accum = reinterpret_cast<float*>(at);
    at = aligned(at + rows * static_cast<size_t>(kernel_head_dim) * sizeof(float));
    w.semaphores = reinterpret_cast<int32_t*>(at);
    return w;
  }

  // First padded row of sequence `batch` (of queries laid out as `queries`).
  HOPATTN_HOST_DEVICE long long sequence_row(const SequenceLayout& queries, int batch) const {
    if (!queries.varlen()) return static_cast<long long>(batch) * round_up(queries.fixed_length, kRowBlock);
    return (queries.sequence(batch).offset + static_cast<long long>(batch) * kRowBlock) / kRowBlock * kRowBlock;
  }
  // Index of (head, padded row) into lse_log2 / dpsum; times head_dim into dq_accum.
  HOPATTN_HOST_DEVICE long long row_index(int head, long long padded_row) const {
    return head * padded_rows + padded_row;
  }
  // The semaphore of the query block that starts at row_index `row`.
  HOPATTN_HOST_DEVICE int32_t* semaphore(long long row) const { return semaphores + row / kSemaphoreRows; }
  // Without determinism: how many key blocks of KV head `head_kv` of the sequence starting at
  // `sequence_row` have added all their dQ (the first semaphore of the group's first head).
  HOPATTN_HOST_DEVICE int32_t* finished_key_blocks(int head_kv, int group, long long sequence_row) const {
    return semaphore(row_index(head_kv * group, sequence_row));
  }
};

}  // namespace hopattn
