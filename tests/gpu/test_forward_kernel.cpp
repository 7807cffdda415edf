// The Hopper forward kernel behind forward(): a sweep of dtypes, head dims (kernel dims and the
// ones that run zero-padded on the next kernel dim up), masks, GQA/MQA, varlen and odd sizes
// against the float64 GPU oracle with FA3's rule and poisoned outputs; a problem whose tensors
// hold more than 2^31 elements; CUDA-graph capture; concurrent calls from several host threads.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "api/device.hpp"
#include "hopattn/hopattn.hpp"
#include "reference/cpu_reference.hpp"
#include "testing/attention_case.hpp"
#include "testing/gpu_oracle.hpp"
#include "testing/random_inputs.hpp"
#include "testing/tolerance.hpp"
#include "kernel_cases.hpp"

namespace hopattn::testing {
namespace {

class ForwardKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status device = check_current_device();
    if (!device.ok()) GTEST_SKIP() << "needs an sm_90 GPU: " << device.message();
  }
};

void expect_ok(const ErrorReport& r) {
  std::cout << "    " << r.str() << "\n";
  EXPECT_TRUE(r.ok) << r.str();
}

// forward() on fresh random inputs into poisoned outputs, checked against the float64 GPU oracle.
// A configuration the build left out must say so (kNotSupported naming the CMake option).
void check_forward(const CaseSpec& spec) {
  AttentionCase c(spec);
  const Outputs out = c.new_outputs();
  const Status s = forward(c.forward_args(out), nullptr);
  if (!built_for(spec.dtype, spec.head_dim)) {
    EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
    EXPECT_NE(s.message().find("HOPATTN_"), std::string::npos) << s.message();
    return;
  }
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, out, nullptr).forward) expect_ok(r);
}

class ForwardSweep : public ForwardKernel, public ::testing::WithParamInterface<NamedCase> {};
TEST_P(ForwardSweep, MatchesFloat64Oracle) { check_forward(GetParam().spec); }
INSTANTIATE_TEST_SUITE_P(Sweep, ForwardSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Special, ForwardSweep, ::testing::ValuesIn(special_cases()),
                         [](const auto& info) { return info.param.name; });

// Q and O hold more than 2^31 elements, so the rows at the end sit past any 32-bit offset. Only
// a few hundred rows at each end are checked (against the float64 CPU reference on just those
// rows: without a mask a query row's output depends only on that row and K/V).
TEST_F(ForwardKernel, TensorsLargerThan2To31Elements) {
  constexpr int kHeads = 16, kHeadDim = 128, kSeqlenK = 96, kChecked = 256;
  if (!built_for(DType::kBFloat16, kHeadDim)) GTEST_SKIP() << "no bf16 d128 kernel in this build";
  const int64_t seqlen_q = (int64_t{1} << 31) / (kHeads * kHeadDim) + 1000;
  const int64_t row = int64_t{kHeads} * kHeadDim;
  const int64_t q_elems = seqlen_q * row;
  ASSERT_GT(q_elems, int64_t{1} << 31);

  auto random_rows = [&](int64_t rows, uint64_t seed) {
    return random_normal_bits(DType::kBFloat16, static_cast<size_t>(rows * row), seed);
  };
  // Q repeats one random block of rows; the checked rows are then known on the host.
  const std::vector<uint16_t> q_block = random_rows(kChecked, 31), k_bits = random_rows(kSeqlenK, 32),
                              v_bits = random_rows(kSeqlenK, 33);
  DeviceBuffer q(q_elems * 2), o(q_elems * 2), k(k_bits.size() * 2), v(v_bits.size() * 2);
  for (int64_t r = 0; r < seqlen_q; r += kChecked) {
    const int64_t rows = std::min<int64_t>(kChecked, seqlen_q - r);
    check_cuda(cudaMemcpy(static_cast<uint16_t*>(q.data()) + r * row, q_block.data(), rows * row * 2,
                          cudaMemcpyHostToDevice),
               "upload q");
  }
  k.upload(k_bits.data(), k.bytes());
  v.upload(v_bits.data(), v.bytes());
  o.fill_bytes(0xFF);

  ForwardArgs args;
  args.q = make_tensor(q.data(), DType::kBFloat16, {1, seqlen_q, kHeads, kHeadDim});
  args.k = make_tensor(k.data(), DType::kBFloat16, {1, kSeqlenK, 1, kHeadDim}, {kSeqlenK * row, row, row, 1});
  args.v = make_tensor(v.data(), DType::kBFloat16, {1, kSeqlenK, 1, kHeadDim}, {kSeqlenK * row, row, row, 1});
  args.o = make_tensor(o.data(), DType::kBFloat16, {1, seqlen_q, kHeads, kHeadDim});
  const Status s = forward(args, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward");

  // The checked rows: q_block's rows at each end of the sequence, in the same (repeating) order.
  const cpu_reference::HostProblem hp = cpu_reference::fixed_length_problem(
      1, kChecked, kSeqlenK, kHeads, 1, kHeadDim, 1.0 / std::sqrt(double(kHeadDim)), BandMask{});
  auto to_double = [](const std::vector<uint16_t>& bits, int64_t stride_elems, int64_t used) {
    std::vector<double> out;
    for (int64_t r = 0; r < int64_t(bits.size()) / stride_elems; ++r) {
      for (int64_t e = 0; e < used; ++e) out.push_back(bits_value(DType::kBFloat16, bits[r * stride_elems + e]));
    }
    return out;
  };
  const std::vector<double> qd = to_double(q_block, row, row);
  const std::vector<double> kd = to_double(k_bits, row, kHeadDim), vd = to_double(v_bits, row, kHeadDim);
  const auto exact = cpu_reference::forward(hp, qd, kd, vd);
  const auto naive = cpu_reference::forward(hp, qd, kd, vd, cpu_reference::Rounding::kBFloat16);
  const int64_t last_block = (seqlen_q - kChecked) / kChecked * kChecked;  // a whole q_block copy
  for (int64_t first : {int64_t{0}, last_block}) {
    std::vector<uint16_t> got_bits(kChecked * row);
    check_cuda(cudaMemcpy(got_bits.data(), static_cast<uint16_t*>(o.data()) + first * row, got_bits.size() * 2,
                          cudaMemcpyDeviceToHost),
               "download o");
    Downloaded got;
    got.values = to_double(got_bits, row, row);
    got.untouched.assign(got.values.size(), false);
    expect_ok(check_against_reference("o rows from " + std::to_string(first), got, exact.o, naive.o,
                                      DType::kBFloat16));
  }
  EXPECT_GT(last_block * row, int64_t{1} << 31) << "the checked rows must sit past 2^31 elements";
}

// K and V given once for the whole batch (batch stride 0) read as if each sequence had its copy.
TEST_F(ForwardKernel, BroadcastKeysAndValuesMatchTheirCopies) {
  CaseSpec spec;
  spec.batch = 2;
  spec.head_dim = 128;
  spec.seqlen_q = 150;
  spec.seqlen_k = 170;
  spec.causal = true;
  spec.seed = 13;
  AttentionCase c(spec);
  const Outputs broadcast = c.new_outputs(), copied = c.new_outputs();
  ForwardArgs args = c.forward_args(broadcast);
  args.k.stride[0] = 0;
  args.v.stride[0] = 0;
  const Status s = forward(args, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  // Now give batch 1 a real copy of batch 0's K and V and run the regular path.
  const ForwardArgs regular = c.forward_args(copied);
  for (const Tensor* t : {&regular.k, &regular.v}) {
    const size_t batch_bytes = size_t(t->stride[0]) * 2;
    check_cuda(cudaMemcpy(static_cast<char*>(t->data) + batch_bytes, t->data, batch_bytes, cudaMemcpyDeviceToDevice),
               "copy batch 0");
  }
  const Status r = forward(regular, nullptr);
  if (r.code() == StatusCode::kNotSupported) GTEST_SKIP() << r.message();
  ASSERT_TRUE(r.ok()) << r.message();
  check_cuda(cudaDeviceSynchronize(), "forward");
  const Downloaded a = c.download(broadcast, Field::kO), b = c.download(copied, Field::kO);
  double worst = 0;
  for (size_t i = 0; i < a.values.size(); ++i) worst = std::max(worst, std::abs(a.values[i] - b.values[i]));
  EXPECT_LT(worst, 2e-2) << "broadcast and copied K/V disagree";  // bf16 rounding of O is ~4e-3
}

// The same forward, captured into a CUDA graph on a side stream and replayed, gives bitwise the
// direct result: nothing in forward() synchronizes, allocates or copies to the host.
TEST_F(ForwardKernel, CapturedInCudaGraphMatchesDirectCall) {
  CaseSpec spec;
  spec.head_dim = 128;
  spec.causal = true;
  spec.varlen_seqlens_q = {100, 0, 300};
  spec.varlen_seqlens_k = {90, 10, 333};
  spec.seed = 77;
  if (!built_for(spec.dtype, spec.head_dim)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs direct = c.new_outputs(), graphed = c.new_outputs();
  ASSERT_TRUE(forward(c.forward_args(direct), nullptr).ok());
  check_cuda(cudaDeviceSynchronize(), "direct forward");

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const Status s = forward(c.forward_args(graphed), stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  ASSERT_TRUE(s.ok()) << s.message();
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 3; ++i) check_cuda(cudaGraphLaunch(exec, stream), "replay");
  check_cuda(cudaStreamSynchronize(stream), "replay");
  for (Field f : {Field::kO, Field::kLse}) {
    const Downloaded a = c.download(direct, f), b = c.download(graphed, f);
    EXPECT_EQ(0, std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(double)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Several host threads calling forward() at once on their own streams get the single-threaded
// results bitwise.
TEST_F(ForwardKernel, ConcurrentCallsFromHostThreads) {
  constexpr int kThreads = 4, kCallsPerThread = 5;
  std::vector<CaseSpec> specs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    specs[t].head_dim = 128;
    specs[t].seqlen_q = 200 + 50 * t;
    specs[t].seqlen_k = 300;
    specs[t].causal = t % 2 == 1;
    specs[t].seed = 400 + t;
  }
  if (!built_for(specs[0].dtype, 128)) GTEST_SKIP() << "no kernel for this case in this build";
  std::vector<AttentionCase> cases(specs.begin(), specs.end());
  std::vector<Outputs> expected, got;
  for (const AttentionCase& c : cases) {
    expected.push_back(c.new_outputs());
    got.push_back(c.new_outputs());
    ASSERT_TRUE(forward(c.forward_args(expected.back()), nullptr).ok());
  }
  check_cuda(cudaDeviceSynchronize(), "single-threaded forward");

  std::vector<std::thread> threads;
  std::vector<Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      for (int i = 0; i < kCallsPerThread; ++i) {
        const Status s = forward(cases[t].forward_args(got[t]), stream);
        if (!s.ok()) failures[t] = s;
      }
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(failures[t].ok()) << failures[t].message();
    const Downloaded a = cases[t].download(expected[t], Field::kO), b = cases[t].download(got[t], Field::kO);
    EXPECT_EQ(0, std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(double))) << "thread " << t;
  }
}

}  // namespace
}  // namespace hopattn::testing
