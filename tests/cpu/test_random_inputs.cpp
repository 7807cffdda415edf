// The random inputs of tests and the benchmark: reproducible from the seed whatever the thread
// count, distinct across seeds, and standard normal.
#include <gtest/gtest.h>

#include <cmath>

#include "testing/random_inputs.hpp"

namespace hopattn::testing {
namespace {

TEST(RandomInputs, ReproducibleAndDistinctAcrossSeeds) {
  const size_t n = (size_t{3} << 20) + 12345;  // several generator chunks and a partial one
  const auto a = random_normal_bits(DType::kBFloat16, n, 42), b = random_normal_bits(DType::kBFloat16, n, 42);
  const auto c = random_normal_bits(DType::kBFloat16, n, 43);
  EXPECT_EQ(a, b);
  size_t same = 0;
  for (size_t i = 0; i < n; ++i) same += a[i] == c[i];
  EXPECT_LT(same, n / 50);  // bf16 values collide by chance, rarely
  EXPECT_TRUE(random_normal_bits(DType::kFloat16, 0, 1).empty());
}

TEST(RandomInputs, StandardNormalInBothDtypes) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const auto bits = random_normal_bits(dtype, size_t{1} << 21, 7);
    double sum = 0, sum_sq = 0;
    for (uint16_t b : bits) {
      const double x = bits_value(dtype, b);
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / bits.size(), var = sum_sq / bits.size() - mean * mean;
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(var, 1.0, 0.01);
  }
}

}  // namespace
}  // namespace hopattn::testing
