// Where each sequence of a batch lives along the token axis, for fixed-length and varlen batches.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace hopattn {

struct Sequence {
  long long offset = 0;  // first token along the packed token axis (0 in fixed-length mode)
  int length = 0;        // real tokens (seqused if given)
  // A KV cache's lengths broke its capacity (SequenceLayout::capacity_faults): nothing of the
  // sequence is read, and its query rows come out NaN.
  bool faulted = false;
};

// One side (queries or keys) of a batch. In fixed-length mode every sequence has `fixed_length`
// tokens and is reached through the batch stride; in varlen mode sequence b occupies tokens
// [cu_seqlens[b], cu_seqlens[b+1]) of the packed axis. Offsets are clamped to [0, total_tokens] so
// that inconsistent prefix sums can never make a kernel touch memory outside the tensors.
struct SequenceLayout {
  const int32_t* cu_seqlens = nullptr;  // device or host memory, batch + 1 entries; null: fixed
  const int32_t* seqused = nullptr;     // optional, batch entries
  int fixed_length = 0;
  long long total_tokens = 0;
  // Fixed-length mode only, for the keys of a KV cache: optional, batch entries, the first real
  // token of each sequence (left padding, FlashAttention's cache_leftpad); the sequence is
  // [start, seqused). With capacity_faults, a seqused outside [0, fixed_length] or a start outside
  // [0, seqused] marks the sequence faulted instead of being clamped: a cache that a caller overfilled.
  const int32_t* start = nullptr;
  bool capacity_faults = false;

  HOPATTN_HOST_DEVICE bool varlen() const { return cu_seqlens != nullptr; }

  HOPATTN_HOST_DEVICE Sequence sequence(int batch_index) const {
    long long begin = 0;
    long long end = fixed_length;
    if (cu_seqlens != nullptr) {
      begin = clamp(cu_seqlens[batch_index]);
      end = clamp(cu_seqlens[batch_index + 1]);
      if (end < begin) end = begin;
    }
    if (capacity_faults) {
      const long long used = seqused != nullptr ? seqused[batch_index] : end;
      const long long first = start != nullptr ? start[batch_index] : 0;
      if (used < 0 || used > end || first < 0 || first > used) return Sequence{0, 0, true};
      return Sequence{first, static_cast<int>(used - first), false};
    }
    long long length = end - begin;
    if (seqused != nullptr && seqused[batch_index] < length) {
      length = seqused[batch_index] > 0 ? seqused[batch_index] : 0;
    }
    return Sequence{begin, static_cast<int>(length), false};
  }

 private:
  HOPATTN_HOST_DEVICE long long clamp(long long token) const {
    return token < 0 ? 0 : (token > total_tokens ? total_tokens : token);
  }
};

}  // namespace hopattn
