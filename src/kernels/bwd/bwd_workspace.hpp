// The backward's device workspace, caller-allocated and sized by backward_workspace_size():
//   lse_log2  (heads, padded_rows) fp32  the forward's LSE in log2 units (+inf on padding rows)
//   dpsum     (heads, padded_rows) fp32  D = rowsum(dO * O) (0 on padding rows)
//   dq_accum  (heads, padded_rows, head_dim) fp32  dQ accumulated by the key blocks; each block of
//             kRowBlock rows is one contiguous chunk in the order the main kernel's registers hold it
//   semaphores (heads, padded_rows / kSemaphoreRows) int32  per dQ share of a query block (the
//             rows of one MMA warpgroup): how many key blocks have added it (deterministic mode);
//             a query block of more rows uses its first ones (dq_share_semaphore).
//             Without determinism the first one of each (sequence, KV head) counts the key blocks
//             that have finished instead (finished_key_blocks)
//   sink_partials (heads, padded_rows / kRowBlock) fp64  with attention sinks, per block of kRowBlock
//             rows: -sum over its rows of exp(sink - LSE) * D (the preprocess's), which the dQ
//             postprocess adds up per head into dsinks (sink_partial)
//   tile_counter  int32  the tiles persistent main-kernel CTAs have taken (bwd_tile_stream.cuh);
//             the preprocess zeroes it
// With GQA (heads_kv < heads) also, for the head slices (backward_head_slices below):
//   dk_accum, dv_accum (heads_kv, padded_key_rows, head_dim / head_dim_v) fp32, row-major: dK
//             (times the softmax scale) and dV summed over the slices of a key block
// Row lengths are the kernel's head dims (HeadDimPair: Q/K's, V's), not the problem's.
//   kv_semaphores (heads_kv, padded_key_rows / kSemaphoreRows) int32: per key block, how many slices
//             have added (deterministic mode adds them in slice order)
//   The main kernel adds into these only when it runs more than one slice; the launch clears them
//   then (they come last, one contiguous range).
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
#include "kernels/common/seqlen.hpp"

namespace hopattn {

struct BackwardWorkspace {
  static constexpr int kRowBlock = 128;      // the tallest query block of any main kernel
  // Two semaphores for the shortest query block (64 rows), one per MMA warpgroup's dQ share.
  static constexpr int kDqShares = 2;
  static constexpr int kSemaphoreRows = 64 / kDqShares;
  static constexpr size_t kAlignment = 256;

  float* lse_log2 = nullptr;
  float* dpsum = nullptr;
  float* dq_accum = nullptr;
  int32_t* semaphores = nullptr;
  double* sink_partials = nullptr;
  int32_t* tile_counter = nullptr;
  float* dk_accum = nullptr;  // null without GQA
  float* dv_accum = nullptr;
  int32_t* kv_semaphores = nullptr;
  long long padded_rows = 0;      // per head
  long long padded_key_rows = 0;  // per KV head (0 without GQA)
  int head_dim = 0;               // the kernel's Q/K head dim (dq_accum's and dk_accum's row length)
  int head_dim_v = 0;             // its V head dim (dv_accum's row length)

  HOPATTN_HOST_DEVICE static long long round_up(long long x, long long to) { return (x + to - 1) / to * to; }

  // Rows of one head's arrays for the tokens of `side` (queries or keys), each sequence padded.
  HOPATTN_HOST_DEVICE static long long padded_rows_for(const SequenceLayout& side, int batch) {
    if (side.varlen()) return round_up(side.total_tokens + static_cast<long long>(batch) * kRowBlock, kRowBlock);
    return static_cast<long long>(batch) * round_up(side.fixed_length, kRowBlock);
  }
  HOPATTN_HOST_DEVICE static long long padded_rows_for(const Problem& p) { return padded_rows_for(p.queries, p.batch); }
  HOPATTN_HOST_DEVICE static long long padded_key_rows_for(const Problem& p) {
    return p.heads_kv < p.heads ? padded_rows_for(p.keys, p.batch) : 0;
  }

  // The dK/dV accumulators and their semaphores, which a sliced launch clears.
  static size_t kv_bytes_for(const Problem& p, HeadDimPair kernel) {
    const long long rows = static_cast<long long>(p.heads_kv) * padded_key_rows_for(p);
    if (rows == 0) return 0;
    return static_cast<size_t>(rows) * sizeof(float) * static_cast<size_t>(kernel.qk + kernel.v) + 2 * kAlignment +
           static_cast<size_t>(rows / kSemaphoreRows) * sizeof(int32_t);
  }

  static size_t bytes_for(const Problem& p, HeadDimPair kernel) {
    const long long rows = static_cast<long long>(p.heads) * padded_rows_for(p);
    const size_t per_row = sizeof(float) * (2 + static_cast<size_t>(kernel.qk));
    return static_cast<size_t>(rows) * per_row + static_cast<size_t>(rows / kSemaphoreRows) * sizeof(int32_t) +
           static_cast<size_t>(rows / kRowBlock) * sizeof(double) + sizeof(int32_t) + 6 * kAlignment +
           kv_bytes_for(p, kernel);
  }

  // Carves the arrays out of `base` (16-byte aligned, at least bytes_for() bytes).
  static BackwardWorkspace carve(void* base, const Problem& p, HeadDimPair kernel) {
    BackwardWorkspace w;
    w.padded_rows = padded_rows_for(p);
    w.head_dim = kernel.qk;
    w.head_dim_v = kernel.v;
    const long long rows = static_cast<long long>(p.heads) * w.padded_rows;
    auto aligned = [](uintptr_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; };
    uintptr_t at = aligned(reinterpret_cast<uintptr_t>(base));
    w.lse_log2 = reinterpret_cast<float*>(at);
    at = aligned(at + rows * sizeof(float));
    w.dpsum = reinterpret_cast<float*>(at);
    at = aligned(at + rows * sizeof(float));
    w.dq_accum = reinterpret_cast<float*>(at);
    at = aligned(at + rows * static_cast<size_t>(kernel.qk) * sizeof(float));
    w.semaphores = reinterpret_cast<int32_t*>(at);
    at = aligned(at + (rows / kSemaphoreRows) * sizeof(int32_t));
    w.sink_partials = reinterpret_cast<double*>(at);
    at = aligned(at + (rows / kRowBlock) * sizeof(double));
    w.tile_counter = reinterpret_cast<int32_t*>(at);
    w.padded_key_rows = padded_key_rows_for(p);
    if (w.padded_key_rows > 0) {
      const long long key_rows = static_cast<long long>(p.heads_kv) * w.padded_key_rows;
      at = aligned(at + sizeof(int32_t));
      w.dk_accum = reinterpret_cast<float*>(at);
      at = aligned(at + key_rows * static_cast<size_t>(kernel.qk) * sizeof(float));
      w.dv_accum = reinterpret_cast<float*>(at);
      at = at + key_rows * static_cast<size_t>(kernel.v) * sizeof(float);
      w.kv_semaphores = reinterpret_cast<int32_t*>(at);
    }
    return w;
  }
  // The range a sliced launch clears: from dk_accum to the end of kv_semaphores.
  size_t kv_clear_bytes(int heads_kv) const {
    const long long key_rows = static_cast<long long>(heads_kv) * padded_key_rows;
    return static_cast<size_t>(reinterpret_cast<char*>(kv_semaphores + key_rows / kSemaphoreRows) -
                               reinterpret_cast<char*>(dk_accum));
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
  // The sink partial of the block of kRowBlock rows that starts at row_index `row`.
  HOPATTN_HOST_DEVICE double* sink_partial(long long row) const { return sink_partials + row / kRowBlock; }
  // The first semaphore of the query block that starts at row_index `row`.
  HOPATTN_HOST_DEVICE int32_t* semaphore(long long row) const { return semaphores + row / kSemaphoreRows; }
  // The semaphore of dQ share `share` (< kDqShares) of that query block.
  HOPATTN_HOST_DEVICE int32_t* dq_share_semaphore(long long row, int share) const { return semaphore(row) + share; }
  // Index of (KV head, padded key row) into dk_accum / dv_accum rows.
  HOPATTN_HOST_DEVICE long long key_row_index(int head_kv, long long padded_key_row) const {
    return head_kv * padded_key_rows + padded_key_row;
  }
  // The semaphore of the key block that starts at key_row_index `row`.
  HOPATTN_HOST_DEVICE int32_t* kv_semaphore(long long row) const { return kv_semaphores + row / kSemaphoreRows; }
  // Without determinism: how many CTAs (key blocks times head slices) of KV head `head_kv` of the
  // sequence starting at `sequence_row` have added all their dQ (the first semaphore of the
  // group's first head).
  HOPATTN_HOST_DEVICE int32_t* finished_key_blocks(int head_kv, int group, long long sequence_row) const {
    return semaphore(row_index(head_kv * group, sequence_row));
  }
};

}  // namespace hopattn
