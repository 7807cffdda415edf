// The validated, normalised description of one attention call: what the API layer hands the
// launchers. Lives beside the kernels so that the dependency runs one way (api -> kernels).
#pragma once

#include <cstdint>

#include "hopattn/hopattn.hpp"
#include "kernels/common/fast_divisor.hpp"
#include "kernels/common/host_device.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/seqlen.hpp"

namespace hopattn {

// A (batch, row, head, dim) or varlen (row, head, dim) tensor as base pointer plus element strides;
// the last dimension is contiguous. In varlen mode batch_stride is 0 and rows are packed tokens.
// LSE uses the same form with head_dim 1 ((batch, head, row) or (head, row)).
struct RowTensor {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;

  // The element at (batch, token, head, 0); token counts along the packed axis in varlen mode.
  template <typename T>
  HOPATTN_HOST_DEVICE T* at(long long batch, long long token, long long head) const {
    return static_cast<T*>(data) + batch * batch_stride + token * row_stride + head * head_stride;
  }
};

// Where the keys and values live when they are a KV cache's (forward only): K/V rows are the
// cache's, and sequence b reads cache row `row(b)` (cache_batch_idx). Paged, that row is the page
// table's and K/V are (page, row in page, head); contiguous, it is the batch index of K/V.
// Indices read from device memory are checked where they are used: a row or page outside the
// cache is never followed, and the sequence's query rows come out NaN.
struct KeyCache {
  const int32_t* page_table = nullptr;  // null: contiguous
  int64_t page_table_stride = 0;        // elements between the table's rows
  // Keys per page, as a divisor: the producer warp divides positions by it for every key block
  // (a 32-bit division is about 25 dependent instructions, this a multiply-high and a shift).
  FastDivisor page_size{0};
  int num_pages = 0;
  int max_pages = 0;                    // pages a sequence can own (the table's columns)
  int rows = 0;                         // the cache's batch rows (page table rows when paged)
  const int32_t* batch_index = nullptr; // optional: cache row of sequence b; default b
  // How the forward's producer loads a paged cache's key blocks (choose_paged_loads, at launch):
  // by default one TMA copy a block (pages of whole blocks); `page_box_rows` > 0: one TMA copy per
  // box of that many keys, each from its own page (pages of whole boxes); `gather`: row by row
  // (any other page size, or left padding inside pages).
  int page_box_rows = 0;
  bool gather = false;
  // Whether K's and V's pages follow one another as runs of rows (page stride = page_size x row
  // stride, as in one (num_pages, page_size, heads, d) allocation): then every cache row is one
  // axis of rows, which the key-group-major forward's TMA copies address (fwd_page_rows_tma.hpp).
  bool consecutive_pages = false;

  HOPATTN_HOST_DEVICE bool enabled() const { return rows > 0; }
  HOPATTN_HOST_DEVICE bool paged() const { return page_table != nullptr; }
  // The cache row of sequence b, or -1 where batch_index names none.
  HOPATTN_HOST_DEVICE int row(int b) const {
    const int r = batch_index != nullptr ? batch_index[b] : b;
    return r >= 0 && r < rows ? r : -1;
  }
  // The page holding position `position` (< max_pages * page_size, which fits in int) of cache
  // row `r`, or -1 where the table names none. 32-bit division: the producer warp gathers rows
  // with it in 24 registers, where a 64-bit one spilled.
  HOPATTN_HOST_DEVICE int page(int r, int position) const {
    const int p = page_table[r * page_table_stride + page_size.divide(position)];
    return p >= 0 && p < num_pages ? p : -1;
  }
};

// The FP8 forward's key block (ForwardFp8TileConfig, every head dim): it loads a paged FP8 cache
// one TMA copy a block, so the pages must hold whole blocks (validate.cpp).
inline constexpr int kFp8KeyBlock = 128;

struct Problem {
  DType dtype = DType::kBFloat16;  // Q and K's and V's
  // O's: dtype for fp16/bf16 inputs; for FP8 inputs (which have no FP8 output) the caller's o,
  // bf16 or fp16.
  DType out_dtype = DType::kBFloat16;
  int batch = 0;
  int heads = 0;
  int heads_kv = 0;
  int head_dim = 0;    // Q and K's last dimension
  int head_dim_v = 0;  // V, O, dO and dV's (head_dim unless the caller's V has its own)
  // Fixed-length mode: the sequence lengths, and total_tokens = batch * length.
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  SequenceLayout queries;
  SequenceLayout keys;
  float softmax_scale = 0.0f;  // resolved: never 0
  float softcap = 0.0f;        // > 0: scores are capped, softcap * tanh(softmax_scale * q.k / softcap)
  BandMask mask;
  // Forward only: ForwardArgs::num_splits (>= 0) and pack_gqa, as the caller gave them.
  int num_splits = 0;
  PackGqa pack_gqa = PackGqa::kAuto;
  // Forward only: K/V are a KV cache's (rows of it per sequence, pages); keys.fixed_length is then
  // the cache's capacity per sequence.
  KeyCache key_cache;
  // Forward only: the call's previous kernel is the KV cache's append, which writes the cache,
  // the key counts and the rotated q. The forward (and the counters' reset ahead of it) launch
  // overlapping it (grid_dependency.cuh) and wait for it before reading any of those.
  bool after_append = false;

  HOPATTN_HOST_DEVICE bool varlen() const { return queries.varlen(); }
  // Whether every sequence has max_seqlen_q queries and max_seqlen_k keys (tiles then all have
  // the same key blocks). Never for a KV cache, whose lengths are read on the device.
  HOPATTN_HOST_DEVICE bool uniform_lengths() const {
    return !queries.varlen() && !keys.varlen() && queries.seqused == nullptr && keys.seqused == nullptr &&
           !key_cache.enabled();
  }
  HOPATTN_HOST_DEVICE int64_t total_q() const { return queries.total_tokens; }
  HOPATTN_HOST_DEVICE int64_t total_k() const { return keys.total_tokens; }
};

// FP8 inputs' descale factors: fp32 (batch, heads_kv), the heads contiguous. An element of batch b
// and KV head g stands for element * at(b, g); no tensor (data null) means 1.
struct DescaleTensor {
  const float* data = nullptr;
  int64_t batch_stride = 0;

  HOPATTN_HOST_DEVICE float at(long long batch, int head_kv) const {
    return data != nullptr ? data[batch * batch_stride + head_kv] : 1.0f;
  }
};

struct ForwardTensors {
  RowTensor q, k, v, o, lse;     // lse.data may be null
  const float* sinks = nullptr;  // optional: one logit per query head
  DescaleTensor q_descale, k_descale, v_descale;  // FP8 inputs only; q's indexed by KV head too
};

struct BackwardTensors {
  RowTensor q, k, v, o, lse, dout, dq, dk, dv;
  const float* sinks = nullptr;  // optional, with dsinks: one logit per query head
  float* dsinks = nullptr;
};

}  // namespace hopattn
