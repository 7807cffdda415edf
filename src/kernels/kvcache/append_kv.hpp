// The first step of forward_kvcache (hopattn.hpp, KVCacheArgs): the new keys and values written
// into the cache at each sequence's end, rotary embedding applied to them and to q, and each
// sequence's key count after the append, which the attention kernel then reads as its seqused_k.
// A plain CUDA kernel: one pass over the new tokens and q, memory bound and small next to the
// attention that follows.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/common/host_device.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/common/seqlen.hpp"

namespace hopattn {

// key_end of a sequence whose append does not fit: negative, which the forward's key layout
// (SequenceLayout::capacity_faults) turns into NaN rows, like any count outside the cache.
inline constexpr int32_t kAppendFault = -1;

struct AppendKVParams {
  DType dtype = DType::kBFloat16;
  int batch = 0;
  int heads = 0;
  int heads_kv = 0;
  int head_dim = 0;    // of q and the keys (k_new, k_cache)
  int head_dim_v = 0;  // of the values (v_new, v_cache); always set, head_dim where they have the same

  // New keys/values: (batch, token, head) rows, or in varlen form (batch_stride 0, tokens along
  // the packed axis from cu_seqlens_new[b]). Null data: nothing to append.
  RowTensor k_new;
  RowTensor v_new;
  const int32_t* cu_seqlens_new = nullptr;  // null: every sequence has seqlen_new tokens
  int seqlen_new = 0;                       // fixed mode; with cu_seqlens_new its maximum
  // With cu_seqlens_new: the packed rows of k_new/v_new. Prefix sums are clamped to them (as
  // SequenceLayout does), so that sums read from device memory never lead outside the tensors.
  int64_t total_new = 0;

  // The cache (RowTensor batch = cache row, or page when paged) and where sequences live in it.
  RowTensor k_cache;
  RowTensor v_cache;
  KeyCache cache;  // page table, cache_batch_idx, rows
  int capacity = 0;  // positions a sequence can hold (contiguous: the cache's length; paged: max_pages * page_size)
  const int32_t* cache_seqlens = nullptr;  // (batch): positions filled before this call

  // Rotary embedding (rotary_dim == 0: none). cos/sin rows are positions, rotary_dim / 2 entries
  // each, row_stride apart.
  int rotary_dim = 0;  // a multiple of 16 (FlashAttention's rule), at most head_dim
  bool rotary_interleaved = false;
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_row_stride = 0;
  int rotary_positions = 0;                   // rows of cos/sin
  const int32_t* rotary_start = nullptr;      // optional (batch): position of new token 0; default cache_seqlens
  // q, rotated into q_rotated (fixed: (batch, seqlen_q, heads, head_dim) contiguous; varlen: (total_q,
  // heads, head_dim)); null q_rotated: q is not rotated. Query i of sequence b takes position
  // start + i where the mask is causal or local, and start for every row otherwise (FlashAttention's rule).
  RowTensor q;
  RowTensor q_rotated;
  const int32_t* cu_seqlens_q = nullptr;
  int seqlen_q = 0;     // fixed mode; with cu_seqlens_q its maximum
  int64_t total_q = 0;  // with cu_seqlens_q: the packed rows of q and q_rotated (clamped likewise)
  bool q_positions_per_row = false;

  // Written: key_end[b] = cache_seqlens[b] + new tokens of b, what the attention reads as its
  // seqused_k. A sequence whose append does not fit (append_fits) gets key_end = kAppendFault and
  // none of its tokens is written: the attention then marks its rows NaN.
  int32_t* key_end = nullptr;
};

// Sequence b's new tokens along k_new's token axis; none without k_new.
HOPATTN_HOST_DEVICE Sequence new_tokens(const AppendKVParams& p, int b) {
  if (p.k_new.data == nullptr) return Sequence{};
  return SequenceLayout{p.cu_seqlens_new, nullptr, p.seqlen_new, p.total_new}.sequence(b);
}

// Sequence b's rows along q's token axis.
HOPATTN_HOST_DEVICE Sequence query_rows(const AppendKVParams& p, int b) {
  return SequenceLayout{p.cu_seqlens_q, nullptr, p.seqlen_q, p.total_q}.sequence(b);
}

// The rotary position of sequence b's first new key, and of its first query row.
HOPATTN_HOST_DEVICE long long rotary_first_position(const AppendKVParams& p, int b) {
  return p.rotary_start != nullptr ? p.rotary_start[b] : p.cache_seqlens[b];
}

// append_fits without its page check: lengths, cache row and rotary positions. Sums are 64-bit,
// so that no int32 value read from device memory can wrap around into range.
HOPATTN_HOST_DEVICE bool append_fits_except_pages(const AppendKVParams& p, int b) {
  const long long filled = p.cache_seqlens[b];
  const long long keys = new_tokens(p, b).length;
  if (filled < 0 || p.cache.row(b) < 0 || filled + keys > p.capacity) return false;
  if (p.rotary_dim == 0) return true;
  const long long queries = p.q_rotated.data != nullptr ? query_rows(p, b).length : 0;
  const long long query_positions = p.q_positions_per_row ? queries : (queries > 0 ? 1 : 0);
  const long long first = rotary_first_position(p, b);
  auto in_table = [&](long long count) { return count == 0 || (first >= 0 && first + count <= p.rotary_positions); };
  return in_table(keys) && in_table(query_positions);
}

// Whether the pages first, first + step, ... of those sequence b's new tokens land on (counted
// from the page of its first new token) are inside the cache. Reads the page table only where
// append_fits_except_pages holds, which keeps every entry it reads inside the table. Split this
// way so that the threads of a CTA can share the pages of a long append (step = threads).
HOPATTN_HOST_DEVICE bool append_pages_exist(const AppendKVParams& p, int b, int first, int step) {
  const long long keys = new_tokens(p, b).length;
  if (!p.cache.paged() || keys == 0) return true;
  const int row = p.cache.row(b);
  const long long filled = p.cache_seqlens[b];
  const int page_size = p.cache.page_size.divisor();
  const long long last_page = (filled + keys - 1) / page_size;
  for (long long page = filled / page_size + first; page <= last_page; page += step) {
    // Called after append_fits_except_pages: the positions are below the capacity, within int.
    if (p.cache.page(row, static_cast<int>(page * page_size)) < 0) return false;
  }
  return true;
}

// Whether sequence b's append fits: cache_seqlens[b] >= 0, its cache row exists, its new tokens
// end within capacity, every page they land on is inside the cache, and (with rotary) every
// position its keys and queries take is a row of cos/sin. Host/device: every thread that writes
// for b checks it, so that a sequence is appended whole or not at all.
HOPATTN_HOST_DEVICE bool append_fits(const AppendKVParams& p, int b) {
  return append_fits_except_pages(p, b) && append_pages_exist(p, b, 0, 1);
}

// Launches the append (and rotary) kernel on `stream` for params.dtype.
cudaError_t launch_append_kv(const AppendKVParams& params, cudaStream_t stream);

}  // namespace hopattn
