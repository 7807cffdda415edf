// fp16/bf16 and FP8 (e4m3) inputs as bit patterns: random normal values, generated in parallel (a
// benchmark sweep draws hundreds of millions of values, which one thread needs minutes for), and
// their values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hopattn/hopattn.hpp"

namespace hopattn::testing {

// n values from N(0, 1) rounded to `dtype` (kFloat16 or kBFloat16). The values depend only on
// (seed, n), not on how many threads draw them: fixed chunks each get their own generator.
std::vector<uint16_t> random_normal_bits(DType dtype, size_t n, uint64_t seed);

// The value of an fp16 or bf16 bit pattern.
double bits_value(DType dtype, uint16_t bits);

// n values from N(0, 1) rounded to e4m3 (round to nearest even, saturating at 448), as bytes; like
// random_normal_bits, they depend only on (seed, n).
std::vector<uint8_t> random_normal_fp8(size_t n, uint64_t seed);

// The value of an e4m3 bit pattern.
double fp8_value(uint8_t bits);

}  // namespace hopattn::testing
