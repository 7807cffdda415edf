// The e4m3 rounding of the CPU reference (the naive FP8 computation's P, the test inputs): round to
// nearest even, subnormals, saturation at 448, checked by hand and against CUDA's own conversion,
// which the GPU reference and FP8 kernels use; and the naive FP8 forward's roundings.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reference/cpu_reference.hpp"

namespace hopattn::cpu_reference {
namespace {

double e4m3(double x) { return round_to(Rounding::kFloat8E4M3, x); }

TEST(Fp8Rounding, RepresentableValuesStay) {
  for (double x : {0.0, 1.0, -1.0, 1.125, 1.875, 2.0, 0.3125, 240.0, 256.0, 448.0, -448.0}) EXPECT_EQ(e4m3(x), x) << x;
  EXPECT_EQ(e4m3(std::ldexp(1.0, -6)), std::ldexp(1.0, -6));  // the smallest normal
  EXPECT_EQ(e4m3(std::ldexp(7.0, -9)), std::ldexp(7.0, -9));  // the largest subnormal
  EXPECT_EQ(e4m3(std::ldexp(1.0, -9)), std::ldexp(1.0, -9));  // the smallest subnormal
}

TEST(Fp8Rounding, RoundsToNearestEven) {
  EXPECT_EQ(e4m3(1.06), 1.0);     // step 2^-3 in [1, 2)
  EXPECT_EQ(e4m3(1.07), 1.125);
  EXPECT_EQ(e4m3(1.0625), 1.0);   // a tie: to the even mantissa 000
  EXPECT_EQ(e4m3(1.1875), 1.25);  // a tie between 001 and 010: up to the even one
  EXPECT_EQ(e4m3(0.3), 0.3125);   // 1.2 * 2^-2, step 2^-5
  EXPECT_EQ(e4m3(-0.3), -0.3125);
  EXPECT_EQ(e4m3(1.9375), 2.0);   // a tie at the top of a binade carries into the next exponent
  EXPECT_EQ(e4m3(0.999), 1.0);
}

TEST(Fp8Rounding, SubnormalsRoundInStepsOfTwoToTheMinusNine) {
  const double step = std::ldexp(1.0, -9);
  EXPECT_EQ(e4m3(0.4 * step), 0.0);
  EXPECT_EQ(e4m3(0.5 * step), 0.0);         // a tie: to 0, the even one
  EXPECT_EQ(e4m3(0.6 * step), step);
  EXPECT_EQ(e4m3(1.5 * step), 2 * step);    // a tie between 1 and 2 steps: 2
  EXPECT_EQ(e4m3(2.5 * step), 2 * step);    // a tie between 2 and 3 steps: 2
  EXPECT_EQ(e4m3(7.6 * step), 8 * step);    // up into the normals (2^-6)
  EXPECT_TRUE(std::signbit(e4m3(-0.1 * step)));  // the sign survives an underflow
}

TEST(Fp8Rounding, SaturatesAtTheLargestFiniteValue) {
  EXPECT_EQ(e4m3(460.0), 448.0);  // step 32 above 256: 464 would be the tie, 480 does not exist
  EXPECT_EQ(e4m3(470.0), 448.0);
  EXPECT_EQ(e4m3(1e6), 448.0);
  EXPECT_EQ(e4m3(-1e6), -448.0);
  EXPECT_EQ(e4m3(std::numeric_limits<double>::infinity()), 448.0);
  EXPECT_TRUE(std::isnan(e4m3(std::numeric_limits<double>::quiet_NaN())));
}

// What the GPU side (the reference kernel, FP8 kernels) computes: CUDA's float -> e4m3 conversion,
// round to nearest even with saturation to the largest finite value.
double cuda_e4m3(float x) { return static_cast<double>(static_cast<float>(__nv_fp8_e4m3(x))); }

TEST(Fp8Rounding, AgreesWithCudasConversion) {
  std::mt19937_64 rng(30);
  std::uniform_real_distribution<double> exponent(-12.0, 10.0);
  std::vector<float> values;
  for (int i = 0; i < 100000; ++i) {
    const double magnitude = std::exp2(exponent(rng));
    values.push_back(static_cast<float>(i % 2 ? magnitude : -magnitude));
  }
  // Every tie and every representable value of the format, and their neighbours.
  for (int bits = 0; bits < 256; ++bits) {
    __nv_fp8_e4m3 f;
    f.__x = static_cast<__nv_fp8_storage_t>(bits);
    const float x = static_cast<float>(f);
    if (std::isnan(x)) continue;
    for (float neighbour : {x, std::nextafter(x, 0.f), std::nextafter(x, 1000.f), x * 1.0625f, x * 0.96875f}) {
      values.push_back(neighbour);
    }
  }
  for (float x : values) ASSERT_EQ(e4m3(x), cuda_e4m3(x)) << "x = " << x;
}

// The naive FP8 forward rounds S to O's dtype, P to e4m3 and O to its dtype: with two keys of
// probabilities 1/3 and 2/3 (near enough after S's rounding) and one-hot values, O is P rounded to
// e4m3 and then to bf16.
TEST(Fp8Rounding, NaiveForwardRoundsTheProbabilitiesToE4m3) {
  HostProblem p = fixed_length_problem(1, 1, 2, 1, 1, 16, 1.0, BandMask{});
  std::vector<double> q(16, 0.0), k(32, 0.0), v(32, 0.0);
  q[0] = 1;
  k[16] = std::log(2.0);  // scores 0 and log 2
  v[0] = 1;
  v[16 + 1] = 1;
  const ForwardResult exact = forward(p, q, k, v);
  const ForwardResult naive = forward(p, q, k, v, naive_fp8_forward(DType::kBFloat16));
  EXPECT_NEAR(exact.o[0], 1.0 / 3, 1e-15);
  EXPECT_NEAR(exact.o[1], 2.0 / 3, 1e-15);
  EXPECT_EQ(naive.o[0], 0.34375);  // 1/3 in e4m3: 1.375 * 2^-2 (bf16 holds it)
  EXPECT_EQ(naive.o[1], 0.6875);   // 2/3 in e4m3: 1.375 * 2^-1
  EXPECT_NEAR(naive.lse[0], std::log(1 + std::exp(0.69140625)), 1e-14);  // log 2 in bf16; LSE unrounded
}

}  // namespace
}  // namespace hopattn::cpu_reference
