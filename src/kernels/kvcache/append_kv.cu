// The append + rotary kernel (append_kv.hpp). Grid (sequence, CTAs of that sequence): each thread
// owns one 8-element chunk (16 bytes) of a head row and loops over the sequence's rows, first
// the (new token, KV head) rows, whose K and V it writes into the cache, then the (query row,
// head) rows of q. K and q rows have head_dim entries, V rows head_dim_v: a row's threads cover
// the wider of the two, and a thread whose chunk lies past a row's end skips that row. A CTA
// first decides with its threads whether the sequence's append fits, so a sequence is appended
// whole or not at all.
#include "kernels/kvcache/append_kv.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/common/grid_dependency.cuh"

namespace hopattn {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 8;                   // elements of one 16-byte access
constexpr int kMaxCtasPerSequence = 65535;  // gridDim.y's limit; the CTAs loop over rows beyond it

// The threads of one (token, head) row: one per chunk of the wider of the K and V head rows.
__host__ __device__ int chunks_per_row(const AppendKVParams& p) {
  return (p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v) / kChunk;
}

// Eight fp16/bf16 elements as raw bits, so that entries copied unchanged keep their exact bits.
struct Chunk {
  uint32_t word[4];

  __device__ uint16_t bits(int e) const { return static_cast<uint16_t>(word[e / 2] >> (16 * (e % 2))); }
  // Sets entries in order: an even one starts its word, the odd one after it completes it.
  __device__ void set(int e, uint16_t bits) {
    word[e / 2] = e % 2 == 0 ? uint32_t{bits} : (word[e / 2] | uint32_t{bits} << 16);
  }
};

__device__ Chunk load_chunk(const uint16_t* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return Chunk{{v.x, v.y, v.z, v.w}};
}

__device__ void store_chunk(uint16_t* p, const Chunk& c) {
  *reinterpret_cast<uint4*>(p) = make_uint4(c.word[0], c.word[1], c.word[2], c.word[3]);
}

template <typename T>
__device__ float to_float(uint16_t bits);
template <>
__device__ float to_float<__half>(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
template <>
__device__ float to_float<__nv_bfloat16>(uint16_t bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}

template <typename T>
__device__ uint16_t to_bits(float x);
template <>
__device__ uint16_t to_bits<__half>(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
template <>
__device__ uint16_t to_bits<__nv_bfloat16>(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// Copies entries [d, d + 8) of a head row from src to dst, rotated to `position` when `rotate` and
// the chunk lies in the rotary part. Entry j's partner in its pair is j ^ 1 (interleaved) or
// j +- half (half = rotary_dim / 2, a multiple of 8: the chunk lies in one half, and its partners
// are the chunk half away); the first of a pair becomes x cos - partner sin, the second
// x cos + partner sin. The fp32 operations are spelled out with _rn intrinsics, which the compiler
// never fuses or reorders: reference/kvcache_reference.cpp does the same ones, so the results
// agree bitwise.
template <typename T>
__device__ void copy_chunk(const AppendKVParams& p, const uint16_t* src, uint16_t* dst, int d, long long position,
                           bool rotate) {
  Chunk x = load_chunk(src + d);
  if (rotate && d < p.rotary_dim) {
    const int half = p.rotary_dim / 2;
    const bool first_half = d < half;
    Chunk partner;
    if (p.rotary_interleaved) {
#pragma unroll
      for (int w = 0; w < 4; ++w) partner.word[w] = __funnelshift_l(x.word[w], x.word[w], 16);  // swaps the pairs
    } else {
      partner = load_chunk(src + (first_half ? d + half : d - half));
    }
    // The cos/sin entries of the chunk's pairs: 4 from d / 2 (interleaved), or 8 from d mod half.
    const long long at = position * p.rotary_row_stride + (p.rotary_interleaved ? d / 2 : (first_half ? d : d - half));
    const uint16_t* cosines = static_cast<const uint16_t*>(p.rotary_cos) + at;
    const uint16_t* sines = static_cast<const uint16_t*>(p.rotary_sin) + at;
    Chunk out;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const bool first = p.rotary_interleaved ? e % 2 == 0 : first_half;
      const int k = p.rotary_interleaved ? e / 2 : e;
      const float partner_sin = __fmul_rn(to_float<T>(partner.bits(e)), to_float<T>(sines[k]));
      out.set(e, to_bits<T>(
                     __fmaf_rn(to_float<T>(x.bits(e)), to_float<T>(cosines[k]), first ? -partner_sin : partner_sin)));
    }
    x = out;
  }
  store_chunk(dst + d, x);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) append_kv_kernel(const __grid_constant__ AppendKVParams p) {
  // The forward behind it may launch at once: it waits for this kernel before reading anything
  // it writes (Problem::after_append).
  allow_next_kernel_to_start();
  const int b = blockIdx.x;
  // append_fits, with the pages of a long append shared out among the CTA's threads.
  const bool fits =
      __syncthreads_and(append_fits_except_pages(p, b) && append_pages_exist(p, b, threadIdx.x, kThreads));
  const Sequence keys = new_tokens(p, b);
  const long long filled = p.cache_seqlens[b];
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    p.key_end[b] = fits ? static_cast<int32_t>(filled + keys.length) : kAppendFault;
  }

  const int chunks = chunks_per_row(p);
  const int rows_per_cta = kThreads / chunks;
  const int row_in_cta = threadIdx.x / chunks;
  if (row_in_cta >= rows_per_cta) return;  // the threads past the CTA's last whole row
  const int d = threadIdx.x % chunks * kChunk;

  const long long start = rotary_first_position(p, b);
  const bool rotary = p.rotary_dim > 0;
  const long long kv_rows = fits ? static_cast<long long>(keys.length) * p.heads_kv : 0;
  const Sequence queries = p.q_rotated.data != nullptr ? query_rows(p, b) : Sequence{};
  const long long rows = kv_rows + static_cast<long long>(queries.length) * p.heads;
  const int cache_row = p.cache.row(b);
  for (long long row = static_cast<long long>(blockIdx.y) * rows_per_cta + row_in_cta; row < rows;
       row += static_cast<long long>(gridDim.y) * rows_per_cta) {
    if (row < kv_rows) {
      const long long t = row / p.heads_kv;
      const int h = static_cast<int>(row % p.heads_kv);
      const long long position = filled + t;
      long long batch = cache_row;
      long long token = position;
      if (p.cache.paged()) {
        batch = p.cache.page(cache_row, static_cast<int>(position));  // below the capacity: fits
        token = p.cache.page_size.remainder(static_cast<int>(position));
      }
      if (d < p.head_dim) {
        copy_chunk<T>(p, p.k_new.at<const uint16_t>(b, keys.offset + t, h), p.k_cache.at<uint16_t>(batch, token, h), d,
                      start + t, rotary);
      }
      if (d < p.head_dim_v) {
        copy_chunk<T>(p, p.v_new.at<const uint16_t>(b, keys.offset + t, h), p.v_cache.at<uint16_t>(batch, token, h), d,
                      0, false);
      }
    } else if (d < p.head_dim) {
      const long long q_row = row - kv_rows;
      const long long i = q_row / p.heads;
      const int h = static_cast<int>(q_row % p.heads);
      // A sequence that does not fit is copied unrotated: its positions may lie outside cos/sin.
      copy_chunk<T>(p, p.q.at<const uint16_t>(b, queries.offset + i, h),
                    p.q_rotated.at<uint16_t>(b, queries.offset + i, h), d, start + (p.q_positions_per_row ? i : 0),
                    rotary && fits);
    }
  }
}

// FP8 rows as pairs of bytes, which the 16-bit kernel copies unchanged: FP8 appends have no
// rotary embedding (validate.cpp), and their head dims and strides are multiples of 16 elements.
AppendKVParams as_byte_pairs(AppendKVParams p) {
  p.head_dim /= 2;
  p.head_dim_v /= 2;
  for (RowTensor* t : {&p.k_new, &p.v_new, &p.k_cache, &p.v_cache}) {
    t->batch_stride /= 2;
    t->row_stride /= 2;
    t->head_stride /= 2;
  }
  return p;
}

}  // namespace

cudaError_t launch_append_kv(const AppendKVParams& given, cudaStream_t stream) {
  const bool fp8 = given.dtype == DType::kFloat8E4M3;
  if (fp8 && (given.rotary_dim > 0 || given.q_rotated.data != nullptr)) return cudaErrorInvalidValue;
  const AppendKVParams params = fp8 ? as_byte_pairs(given) : given;
  // 16-byte chunks, one head row within a CTA, and pairs of whole chunks.
  auto row_fits = [](int dim) { return dim > 0 && dim % kChunk == 0 && dim / kChunk <= kThreads; };
  if (!row_fits(params.head_dim) || !row_fits(params.head_dim_v) || params.rotary_dim % (2 * kChunk) != 0 ||
      params.rotary_dim > params.head_dim) {
    return cudaErrorInvalidValue;
  }
  if (params.batch == 0) return cudaSuccess;
  // Enough CTAs for the longest sequence's rows (seqlen_new and seqlen_q are the maxima); a
  // sequence with more rows than that is still covered by the CTAs' loop.
  const long long rows =
      (params.k_new.data != nullptr ? static_cast<long long>(params.seqlen_new) * params.heads_kv : 0) +
      (params.q_rotated.data != nullptr ? static_cast<long long>(params.seqlen_q) * params.heads : 0);
  const int rows_per_cta = kThreads / chunks_per_row(params);
  const long long ctas = std::clamp<long long>((rows + rows_per_cta - 1) / rows_per_cta, 1, kMaxCtasPerSequence);
  const dim3 grid(static_cast<unsigned>(params.batch), static_cast<unsigned>(ctas));
  switch (params.dtype) {
    case DType::kFloat16:
      append_kv_kernel<__half><<<grid, kThreads, 0, stream>>>(params);
      break;
    case DType::kBFloat16:
    case DType::kFloat8E4M3:  // as byte pairs
      append_kv_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(params);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace hopattn
