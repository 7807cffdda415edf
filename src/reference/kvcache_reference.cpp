#include "reference/kvcache_reference.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace hopattn::cpu_reference {
namespace {

float value(DType dtype, uint16_t bits) {
  return dtype == DType::kFloat16 ? __half2float(__ushort_as_half(bits)) : __bfloat162float(__ushort_as_bfloat16(bits));
}

uint16_t to_bits(DType dtype, float x) {
  return dtype == DType::kFloat16 ? __half_as_ushort(__float2half_rn(x)) : __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// Entry 0 of head `head` of token `token` in batch (cache row, or page) `batch`.
uint16_t* row(const RowTensor& t, long long batch, long long token, long long head) {
  return static_cast<uint16_t*>(t.data) + batch * t.batch_stride + token * t.row_stride + head * t.head_stride;
}

// dst = the `dim` entries of src with the first rotary_dim of them rotated to `position` (when
// `rotate`), pair by pair.
void copy_row(const AppendKVParams& p, const uint16_t* src, uint16_t* dst, int dim, long long position, bool rotate) {
  std::copy(src, src + dim, dst);
  if (!rotate) return;
  const int half = p.rotary_dim / 2;
  const uint16_t* cos_row = static_cast<const uint16_t*>(p.rotary_cos) + position * p.rotary_row_stride;
  const uint16_t* sin_row = static_cast<const uint16_t*>(p.rotary_sin) + position * p.rotary_row_stride;
  for (int i = 0; i < half; ++i) {
    // GPT-J pairs neighbours, GPT-NeoX the two halves of the rotary part.
    const int first = p.rotary_interleaved ? 2 * i : i;
    const int second = p.rotary_interleaved ? 2 * i + 1 : i + half;
    const float x1 = value(p.dtype, src[first]);
    const float x2 = value(p.dtype, src[second]);
    const float c = value(p.dtype, cos_row[i]);
    const float s = value(p.dtype, sin_row[i]);
    const float x2_sin = x2 * s;
    const float x1_sin = x1 * s;
    dst[first] = to_bits(p.dtype, std::fma(x1, c, -x2_sin));
    dst[second] = to_bits(p.dtype, std::fma(x2, c, x1_sin));
  }
}

}  // namespace

void append_kv(const AppendKVParams& p) {
  for (int b = 0; b < p.batch; ++b) {
    // The decision whether b fits is the rule itself, shared with the kernel (and tested on its own
    // in tests/cpu/test_kvcache_append.cpp); where the rows go and what they hold is written out
    // here from the definition.
    const bool fits = append_fits(p, b);
    const long long filled = p.cache_seqlens[b];
    const long long first_new = p.cu_seqlens_new != nullptr ? p.cu_seqlens_new[b] : 0;
    long long new_count = 0;
    if (p.k_new.data != nullptr) {
      new_count = p.cu_seqlens_new != nullptr ? p.cu_seqlens_new[b + 1] - p.cu_seqlens_new[b] : p.seqlen_new;
    }
    const long long start = p.rotary_start != nullptr ? p.rotary_start[b] : filled;
    p.key_end[b] = fits ? static_cast<int32_t>(filled + new_count) : kAppendFault;

    if (fits) {
      const int cache_row = p.cache.batch_index != nullptr ? p.cache.batch_index[b] : b;
      for (long long t = 0; t < new_count; ++t) {
        const long long position = filled + t;
        long long batch = cache_row;
        long long token = position;
        if (p.cache.page_table != nullptr) {
          const int page_size = p.cache.page_size.divisor();
          batch = p.cache.page_table[cache_row * p.cache.page_table_stride + position / page_size];
          token = position % page_size;
        }
        for (int h = 0; h < p.heads_kv; ++h) {
          copy_row(p, row(p.k_new, b, first_new + t, h), row(p.k_cache, batch, token, h), p.head_dim, start + t,
                   p.rotary_dim > 0);
          copy_row(p, row(p.v_new, b, first_new + t, h), row(p.v_cache, batch, token, h), p.head_dim_v, 0, false);
        }
      }
    }

    if (p.q_rotated.data != nullptr) {
      const long long first_q = p.cu_seqlens_q != nullptr ? p.cu_seqlens_q[b] : 0;
      const long long q_count = p.cu_seqlens_q != nullptr ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.seqlen_q;
      for (long long i = 0; i < q_count; ++i) {
        const long long position = start + (p.q_positions_per_row ? i : 0);
        for (int h = 0; h < p.heads; ++h) {
          // A sequence that does not fit keeps q as it is (its rows come out NaN anyway).
          copy_row(p, row(p.q, b, first_q + i, h), row(p.q_rotated, b, first_q + i, h), p.head_dim, position,
                   fits && p.rotary_dim > 0);
        }
      }
    }
  }
}

}  // namespace hopattn::cpu_reference
