#include "testing/random_inputs.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

namespace hopattn::testing {
namespace {

constexpr size_t kChunk = size_t{1} << 20;  // values per generator

uint16_t to_bits(DType dtype, float x) {
  uint16_t bits;
  if (dtype == DType::kFloat16) {
    const __half h = __float2half_rn(x);
    std::memcpy(&bits, &h, sizeof bits);
  } else {
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    std::memcpy(&bits, &b, sizeof bits);
  }
  return bits;
}

uint8_t to_fp8_bits(float x) { return __nv_fp8_e4m3(x).__x; }

template <typename Bits, typename Convert>
void fill_chunk(uint64_t seed, size_t chunk, Bits* out, size_t n, const Convert& convert) {
  // splitmix64-style mixing keeps the chunks' generators far apart for neighbouring seeds.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (chunk + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  std::mt19937_64 rng(z ^ (z >> 31));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) out[i] = convert(normal(rng));
}

// n normal values converted to bit patterns by `convert`, in fixed chunks spread over the threads.
template <typename Bits, typename Convert>
std::vector<Bits> random_normal(size_t n, uint64_t seed, const Convert& convert) {
  std::vector<Bits> bits(n);
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const size_t threads = std::min<size_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  auto work = [&](size_t first) {
    for (size_t c = first; c < chunks; c += threads) {
      fill_chunk(seed, c, bits.data() + c * kChunk, std::min(kChunk, n - c * kChunk), convert);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  if (chunks > 0) work(0);
  for (std::thread& th : pool) th.join();
  return bits;
}

}  // namespace

double bits_value(DType dtype, uint16_t bits) {
  if (dtype == DType::kFloat16) {
    __half h;
    std::memcpy(&h, &bits, sizeof bits);
    return __half2float(h);
  }
  __nv_bfloat16 b;
  std::memcpy(&b, &bits, sizeof bits);
  return __bfloat162float(b);
}

std::vector<uint16_t> random_normal_bits(DType dtype, size_t n, uint64_t seed) {
  return random_normal<uint16_t>(n, seed, [dtype](float x) { return to_bits(dtype, x); });
}

std::vector<uint8_t> random_normal_fp8(size_t n, uint64_t seed) { return random_normal<uint8_t>(n, seed, to_fp8_bits); }

double fp8_value(uint8_t bits) {
  __nv_fp8_e4m3 f;
  f.__x = bits;
  return static_cast<float>(f);
}

}  // namespace hopattn::testing
