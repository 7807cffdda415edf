// Tensors of more than 2^31 elements (64-bit offsets everywhere; FlashAttention-3 users hit illegal
// memory accesses there): Q, O, dO and dQ hold 2^31 + 16M elements, so the rows at the end sit
// past any 32-bit offset. Q and dO repeat one random block of rows, so the rows at both ends are
// known on the host and checked against the float64 CPU reference on just those rows: without a
// mask a query row's O and dQ depend only on that row and on K and V.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "reference/cpu_reference.hpp"
#include "testing/attention_case.hpp"
#include "testing/random_inputs.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {
namespace {

constexpr int kHeads = 16, kHeadDim = 128, kSeqlenK = 96, kChecked = 256;
constexpr DType kDType = DType::kBFloat16;

class LargeTensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status device = check_current_device();
    if (!device.ok()) GTEST_SKIP() << "needs an sm_90 GPU: " << device.message();
    if (!built_for(kDType, kHeadDim)) GTEST_SKIP() << "no bf16 d128 kernel in this build";
  }

  const int64_t seqlen_q = (int64_t{1} << 31) / (kHeads * kHeadDim) + 1000;
  const int64_t row = int64_t{kHeads} * kHeadDim;  // elements per token
  const int64_t elems = seqlen_q * row;

  std::vector<uint16_t> random_rows(int64_t rows, uint64_t seed) const {
    return random_normal_bits(kDType, static_cast<size_t>(rows * row), seed);
  }
  // A (1, seqlen_q, heads, d) tensor repeating `block` (kChecked rows).
  DeviceBuffer repeated(const std::vector<uint16_t>& block) const {
    DeviceBuffer b(elems * 2);
    for (int64_t r = 0; r < seqlen_q; r += kChecked) {
      const int64_t rows = std::min<int64_t>(kChecked, seqlen_q - r);
      check_cuda(cudaMemcpy(static_cast<uint16_t*>(b.data()) + r * row, block.data(), rows * row * 2,
                            cudaMemcpyHostToDevice),
                 "upload rows");
    }
    return b;
  }
  Tensor queries(const DeviceBuffer& b) const { return make_tensor(b.data(), kDType, {1, seqlen_q, kHeads, kHeadDim}); }
  Tensor keys(const DeviceBuffer& b) const {
    return make_tensor(b.data(), kDType, {1, kSeqlenK, 1, kHeadDim}, {kSeqlenK * row, row, row, 1});
  }
  std::vector<double> to_double(const std::vector<uint16_t>& bits, int64_t used) const {
    std::vector<double> out;
    for (int64_t r = 0; r < int64_t(bits.size()) / row; ++r) {
      for (int64_t e = 0; e < used; ++e) out.push_back(bits_value(kDType, bits[r * row + e]));
    }
    return out;
  }
  // The checked rows of a (1, seqlen_q, heads, d) output at each end, each compared with `exact`
  // under the bound from `naive`; both ends sit at a whole multiple of kChecked rows.
  void check_ends(const char* name, const DeviceBuffer& out, const std::vector<double>& exact,
                  const std::vector<double>& naive) const {
    const int64_t last_block = (seqlen_q - kChecked) / kChecked * kChecked;
    EXPECT_GT(last_block * row, int64_t{1} << 31) << "the checked rows must sit past 2^31 elements";
    for (int64_t first : {int64_t{0}, last_block}) {
      std::vector<uint16_t> bits(kChecked * row);
      check_cuda(cudaMemcpy(bits.data(), static_cast<const uint16_t*>(out.data()) + first * row, bits.size() * 2,
                            cudaMemcpyDeviceToHost),
                 "download rows");
      Downloaded got;
      got.values = to_double(bits, row);
      got.untouched.assign(got.values.size(), false);
      const ErrorReport r =
          check_against_reference(std::string(name) + " rows from " + std::to_string(first), got, exact, naive, kDType);
      std::cout << "    " << r.str() << "\n";
      EXPECT_TRUE(r.ok) << r.str();
    }
  }
};

TEST_F(LargeTensors, ForwardAndBackwardPast2To31Elements) {
  ASSERT_GT(elems, int64_t{1} << 31);
  const std::vector<uint16_t> q_block = random_rows(kChecked, 31), dout_block = random_rows(kChecked, 34);
  const std::vector<uint16_t> k_bits = random_rows(kSeqlenK, 32), v_bits = random_rows(kSeqlenK, 33);
  DeviceBuffer q = repeated(q_block), dout = repeated(dout_block);
  DeviceBuffer k(k_bits.size() * 2), v(v_bits.size() * 2), o(elems * 2), dq(elems * 2), dk(k.bytes()), dv(k.bytes());
  DeviceBuffer lse(size_t(seqlen_q) * kHeads * sizeof(float));
  k.upload(k_bits.data(), k.bytes());
  v.upload(v_bits.data(), v.bytes());
  for (DeviceBuffer* b : {&o, &dq, &dk, &dv}) b->fill_bytes(0xFF);

  ForwardArgs fwd;
  fwd.q = queries(q);
  fwd.k = keys(k);
  fwd.v = keys(v);
  fwd.o = queries(o);
  fwd.lse = make_tensor(lse.data(), DType::kFloat32, {1, kHeads, seqlen_q});
  Status s = forward(fwd, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();

  BackwardArgs bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.o = fwd.o;
  bwd.lse = fwd.lse;
  bwd.dout = queries(dout);
  bwd.dq = queries(dq);
  bwd.dk = keys(dk);
  bwd.dv = keys(dv);
  size_t bytes = 0;
  ASSERT_TRUE(backward_workspace_size(bwd, &bytes).ok());
  DeviceBuffer workspace(bytes);
  s = backward(bwd, Workspace{workspace.data(), bytes}, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward and backward");

  const cpu_reference::HostProblem hp = cpu_reference::fixed_length_problem(
      1, kChecked, kSeqlenK, kHeads, 1, kHeadDim, 1.0 / std::sqrt(double(kHeadDim)), BandMask{});
  const std::vector<double> qd = to_double(q_block, row), doutd = to_double(dout_block, row);
  const std::vector<double> kd = to_double(k_bits, kHeadDim), vd = to_double(v_bits, kHeadDim);
  const auto exact = cpu_reference::backward(hp, qd, kd, vd, doutd);
  const auto naive = cpu_reference::backward(hp, qd, kd, vd, doutd, cpu_reference::Rounding::kBFloat16);
  check_ends("o", o, cpu_reference::forward(hp, qd, kd, vd).o,
             cpu_reference::forward(hp, qd, kd, vd, cpu_reference::Rounding::kBFloat16).o);
  check_ends("dq", dq, exact.dq, naive.dq);

  // dK and dV sum over all 2^31 / 2048 query rows: not checked against a reference, but they
  // must be written and finite.
  for (const DeviceBuffer* b : {&dk, &dv}) {
    std::vector<uint16_t> bits(b->bytes() / 2);
    b->download(bits.data(), b->bytes());
    for (size_t i = 0; i < bits.size(); ++i) {
      if (i % row >= kHeadDim) continue;  // the rows' padding is not part of the tensor
      ASSERT_TRUE(std::isfinite(bits_value(kDType, bits[i]))) << (b == &dk ? "dk" : "dv") << " element " << i;
    }
  }
}

}  // namespace
}  // namespace hopattn::testing
