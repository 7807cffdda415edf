// The kernels' approximate math on the GPU against double precision: emulated_exp2 (the FMA-pipe
// exp2 that the FP8 forward uses for a quarter of its probabilities) over the softmax's range.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/fast_exp2.cuh"
#include "kernel_cases.hpp"

namespace hopattn {
namespace {

__global__ void emulated_exp2_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = emulated_exp2(x[i]);
}

std::vector<float> emulated_exp2_on_gpu(const std::vector<float>& x) {
  const int n = static_cast<int>(x.size());
  float *x_d = nullptr, *y_d = nullptr;
  EXPECT_EQ(cudaMalloc(&x_d, n * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&y_d, n * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(x_d, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  emulated_exp2_kernel<<<(n + 255) / 256, 256>>>(x_d, y_d, n);
  std::vector<float> y(n);
  EXPECT_EQ(cudaMemcpy(y.data(), y_d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(x_d);
  cudaFree(y_d);
  return y;
}

using FastMath = testing::HopperTest;

TEST_F(FastMath, EmulatedExp2IsWithinItsBoundOverTheSoftmaxRange) {
  std::vector<float> x;
  for (float v = 0.f; v >= -126.f; v -= 1.f / 1024) x.push_back(v);
  for (float v : {1e-7f, 0.f, -0.f, -1e-30f}) x.push_back(v);
  const std::vector<float> y = emulated_exp2_on_gpu(x);
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] / want - 1.0));
  }
  EXPECT_LT(worst, 7.6e-5);  // the polynomial's 7.5e-5 (fast_exp2.cuh), fp32 rounding on top
}

TEST_F(FastMath, EmulatedExp2OfMaskedScoresIsZeroAndNaNStaysNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  // Below -126 the result would be denormal: 0, as ex2.approx.ftz gives (one case failed on the
  // H100 when -126.99 was in the range above).
  const std::vector<float> y = emulated_exp2_on_gpu({-inf, -1000.f, -127.5f, -126.99f, std::nanf("")});
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[3], 0.f);
  EXPECT_TRUE(std::isnan(y[4]));
}

}  // namespace
}  // namespace hopattn
