// The Hopper forward kernel behind forward(): a sweep of dtypes, head dims (kernel dims and the
// ones that run zero-padded on the next kernel dim up), masks, GQA/MQA, varlen and odd sizes
// against the float64 GPU oracle with FA3's rule and poisoned outputs; broadcast K/V; CUDA-graph
// capture; concurrent calls from several host threads; the workspace's split tail and dynamic
// schedule. Decode shapes, key splits and packed heads: test_forward_decode.cpp. Tensors past
// 2^31 elements: test_large_tensors.cpp.
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
#include "testing/attention_case.hpp"
#include "testing/device_buffer.hpp"
#include "testing/gpu_oracle.hpp"
#include "testing/tolerance.hpp"
#include "kernel_cases.hpp"

namespace hopattn::testing {
namespace {

using ForwardKernel = HopperTest;

// forward() on fresh random inputs into poisoned outputs, checked against the float64 GPU oracle:
// with the workspace it asks for (a poisoned one) and, where it asks for one (a split tail or the
// dynamic schedule), without it too. A configuration the build left out must say so (kNotSupported naming the CMake
// option).
void check_forward(const CaseSpec& spec) {
  AttentionCase c(spec);
  const Outputs out = c.new_outputs();
  const Status s = call_forward(c, out, /*with_workspace=*/true);
  if (!built_for(spec)) {
    EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
    EXPECT_NE(s.message().find("HOPATTN_"), std::string::npos) << s.message();
    return;
  }
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, out, nullptr).forward) expect_ok(r);

  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(c.forward_args(out), &bytes).ok());
  if (bytes == 0) return;
  std::cout << "    without workspace:\n";
  const Outputs plain = c.new_outputs();
  ASSERT_TRUE(call_forward(c, plain, /*with_workspace=*/false).ok());
  check_cuda(cudaDeviceSynchronize(), "forward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, plain, nullptr).forward) expect_ok(r);
}

class ForwardSweep : public ForwardKernel, public ::testing::WithParamInterface<NamedCase> {};
TEST_P(ForwardSweep, MatchesFloat64Oracle) { check_forward(GetParam().spec); }
INSTANTIATE_TEST_SUITE_P(Sweep, ForwardSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Special, ForwardSweep, ::testing::ValuesIn(special_cases()),
                         [](const auto& info) { return info.param.name; });

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

// forward() of `c` into `out` with the workspace it asks for (*bytes of it, allocated before the
// capture, as a graph's user must), captured into a CUDA graph on a side stream and replayed.
Status forward_in_graph(const AttentionCase& c, const Outputs& out, size_t* bytes) {
  const ForwardArgs args = c.forward_args(out);
  if (Status s = forward_workspace_size(args, bytes); !s.ok()) return s;
  const DeviceBuffer workspace(*bytes);
  return capture_and_replay(
      [&](cudaStream_t stream) { return forward(args, Workspace{workspace.data(), *bytes}, stream); }, 3);
}

// The same forward, captured into a CUDA graph on a side stream and replayed, gives bitwise the
// direct result: nothing in forward() synchronizes, allocates or copies to the host. The direct
// call runs the static schedule, the graph the dynamic one (its counter reset on every replay),
// which takes more tiles than CTAs: 64 heads of 4 query blocks.
TEST_F(ForwardKernel, CapturedInCudaGraphMatchesDirectCall) {
  CaseSpec spec;
  spec.heads = spec.heads_kv = 64;
  spec.head_dim = 128;
  spec.causal = true;
  spec.varlen_seqlens_q = {100, 0, 300};
  spec.varlen_seqlens_k = {90, 10, 333};
  spec.seed = 77;
  spec.num_splits = 1;  // the graph's workspace would split the keys: not bitwise the direct call's rounding
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs direct = c.new_outputs(), graphed = c.new_outputs();
  ASSERT_TRUE(forward(c.forward_args(direct), nullptr).ok());
  check_cuda(cudaDeviceSynchronize(), "direct forward");

  size_t bytes = 0;
  const Status s = forward_in_graph(c, graphed, &bytes);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(bytes, 0u) << "no dynamic schedule: the graph no longer tests it";
  expect_bitwise_equal(c, direct, graphed, {Field::kO, Field::kLse});
}

// Where tile lengths vary (here a causal mask over 192 tiles, more than one round on the H200),
// the workspace holds the dynamic schedule's tile counter: which CTA computes a tile changes, the
// result does not, bitwise, and it holds on a repeat with the same workspace.
TEST_F(ForwardKernel, DynamicScheduleMatchesStaticBitwise) {
  CaseSpec spec;
  spec.batch = 2;
  spec.heads = spec.heads_kv = 8;
  spec.head_dim = 128;
  spec.seqlen_q = spec.seqlen_k = 1500;
  spec.causal = true;
  spec.seed = 31;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs fixed = c.new_outputs(), dynamic = c.new_outputs(), again = c.new_outputs();
  const ForwardArgs args = c.forward_args(dynamic);
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(args, &bytes).ok());
  EXPECT_GT(bytes, 0u) << "no dynamic schedule: this test no longer tests it";
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(forward(c.forward_args(fixed), nullptr).ok());
  ASSERT_TRUE(forward(args, Workspace{workspace.data(), bytes}, nullptr).ok());
  ASSERT_TRUE(forward(c.forward_args(again), Workspace{workspace.data(), bytes}, nullptr).ok());
  check_cuda(cudaDeviceSynchronize(), "forward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, dynamic, nullptr).forward) expect_ok(r);
  expect_bitwise_equal(c, fixed, dynamic, {Field::kO, Field::kLse});
  expect_bitwise_equal(c, fixed, again, {Field::kO, Field::kLse});
}

// The split tail after a full round: 200 tiles of 32 key blocks, 68 of them in the last round on
// the H200's 132 SMs, each split over two or three CTAs. Checked like the sweep, and bitwise equal
// on a second run.
TEST_F(ForwardKernel, SplitTailAfterAFullRound) {
  CaseSpec spec;
  spec.heads = spec.heads_kv = 8;
  spec.head_dim = 128;
  spec.seqlen_q = 25 * 128;
  spec.seqlen_k = 4096;
  spec.seed = 21;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  size_t bytes = 0;
  const Outputs first = c.new_outputs(), second = c.new_outputs();
  ASSERT_TRUE(forward_workspace_size(c.forward_args(first), &bytes).ok());
  EXPECT_GT(bytes, 0u) << "no split tail: this test no longer tests it";
  ASSERT_TRUE(call_forward(c, first, /*with_workspace=*/true).ok());
  ASSERT_TRUE(call_forward(c, second, /*with_workspace=*/true).ok());
  check_cuda(cudaDeviceSynchronize(), "forward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, first, nullptr).forward) expect_ok(r);
  expect_bitwise_equal(c, first, second, {Field::kO, Field::kLse});
}

// A workspace smaller than forward_workspace_size() is an error, named; none at all is not.
TEST_F(ForwardKernel, WorkspaceTooSmallIsRejected) {
  CaseSpec spec;
  spec.head_dim = 128;
  spec.seqlen_q = 300;
  spec.seqlen_k = 3000;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs out = c.new_outputs();
  const ForwardArgs args = c.forward_args(out);
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(args, &bytes).ok());
  ASSERT_GT(bytes, 0u);
  DeviceBuffer workspace(bytes);
  const Status s = forward(args, Workspace{workspace.data(), bytes - 1}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("workspace.bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(forward(args, Workspace{nullptr, 0}, nullptr).ok());
  check_cuda(cudaDeviceSynchronize(), "forward");
}

// The split tail (the counters' reset kernel and the forward) captured into a CUDA graph and
// replayed gives bitwise the direct result.
TEST_F(ForwardKernel, SplitTailCapturedInCudaGraphMatchesDirectCall) {
  CaseSpec spec;
  spec.head_dim = 128;
  spec.batch = 3;
  spec.seqlen_q = 700;
  spec.seqlen_k = 4100;
  spec.seed = 78;
  spec.num_splits = 1;  // 72 tiles: key splits would take the place of the split tail
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs direct = c.new_outputs(), graphed = c.new_outputs();
  ASSERT_TRUE(call_forward(c, direct, /*with_workspace=*/true).ok());
  check_cuda(cudaDeviceSynchronize(), "direct forward");
  size_t bytes = 0;
  const Status s = forward_in_graph(c, graphed, &bytes);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_bitwise_equal(c, direct, graphed, {Field::kO, Field::kLse});
}

// Several host threads calling forward() at once on their own streams get the single-threaded
// results bitwise.
TEST_F(ForwardKernel, ConcurrentCallsFromHostThreads) {
  constexpr int kThreads = 4, kCallsPerThread = 5;
  std::vector<CaseSpec> specs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    specs[t].head_dim = 128;
    specs[t].seqlen_q = 200 + 50 * t;
    specs[t].seqlen_k = 3000;  // 24 key blocks: the non-causal ones split
    specs[t].causal = t % 2 == 1;
    specs[t].seed = 400 + t;
  }
  if (!built_for(specs[0].dtype, 128)) GTEST_SKIP() << "no kernel for this case in this build";
  std::vector<AttentionCase> cases(specs.begin(), specs.end());
  std::vector<Outputs> expected, got;
  for (const AttentionCase& c : cases) {
    expected.push_back(c.new_outputs());
    got.push_back(c.new_outputs());
    ASSERT_TRUE(call_forward(c, expected.back(), /*with_workspace=*/true).ok());
  }
  check_cuda(cudaDeviceSynchronize(), "single-threaded forward");

  std::vector<std::thread> threads;
  std::vector<Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      const ForwardArgs args = cases[t].forward_args(got[t]);
      size_t bytes = 0;
      failures[t] = forward_workspace_size(args, &bytes);
      const DeviceBuffer workspace(bytes);  // each its own: split tail (non-causal), tile counter (causal)
      for (int i = 0; i < kCallsPerThread && failures[t].ok(); ++i) {
        const Status s = forward(args, Workspace{workspace.data(), bytes}, stream);
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

// A host thread whose only CUDA calls are the library's has no context current until one of them
// makes one so; PyTorch's autograd worker thread runs our backward so. The library makes the
// device's primary context current there: its TMA descriptors are encoded through the driver,
// which without a context failed (CUDA_ERROR_INVALID_CONTEXT) and left them garbage, and the
// kernel stopped with an illegal instruction. Forward and backward, each from a fresh thread,
// give the main thread's results bitwise.
TEST_F(ForwardKernel, CallsFromThreadsWithoutACurrentContext) {
  CaseSpec spec;
  spec.head_dim = 128;
  spec.seqlen_q = 300;
  spec.seqlen_k = 700;
  spec.causal = true;
  spec.seed = 420;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  const AttentionCase c(spec);
  const Outputs expected = c.new_outputs(), got = c.new_outputs();
  ASSERT_TRUE(call_forward(c, expected, /*with_workspace=*/false).ok());
  ASSERT_TRUE(call_backward(c, expected, expected, /*deterministic=*/true).ok());
  // The backward's inputs are the main thread's forward outputs; its gradients go to `got`.
  const BackwardArgs backward_args = c.backward_args(expected, got);
  size_t bytes = 0;
  ASSERT_TRUE(backward_workspace_size(backward_args, &bytes).ok());
  const DeviceBuffer workspace(bytes);
  const ForwardArgs forward_args = c.forward_args(got);
  check_cuda(cudaDeviceSynchronize(), "the main thread's calls");

  Status forward_status, backward_status;
  std::thread([&] { forward_status = forward(forward_args, nullptr); }).join();
  std::thread([&] {
    BackwardArgs args = backward_args;
    args.deterministic = true;
    backward_status = backward(args, Workspace{workspace.data(), bytes}, nullptr);
  }).join();
  ASSERT_TRUE(forward_status.ok()) << forward_status.message();
  ASSERT_TRUE(backward_status.ok()) << backward_status.message();
  check_cuda(cudaDeviceSynchronize(), "the calls from fresh threads");
  expect_bitwise_equal(c, expected, got, {Field::kO, Field::kLse, Field::kDq, Field::kDk, Field::kDv});
}

}  // namespace
}  // namespace hopattn::testing
