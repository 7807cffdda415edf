// Random normal inputs in fp16/bf16 bit patterns, generated in parallel: a benchmark sweep draws
// hundreds of millions of values, which one thread needs minutes for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hopattn/hopattn.hpp"

namespace hopattn::testing {

// n values from N(0, 1) rounded to `dtype` (kFloat16 or kBFloat16). The values depend only on
// (seed, n), not on how many threads draw them: fixed chunks each get their own generator.
std::vector<uint16_t> random_normal_bits(DType dtype, size_t n, uint64_t seed);

}  // namespace hopattn::testing
