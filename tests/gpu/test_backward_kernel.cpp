// The Hopper backward behind backward(): the kernel suites' sweep (dtypes, head dims, masks,
// GQA/MQA, varlen, odd sizes) against the float64 GPU oracle with FA3's rule and poisoned
// gradients; bitwise determinism over repeated calls in deterministic mode; CUDA-graph capture.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "testing/attention_case.hpp"
#include "testing/gpu_oracle.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {
namespace {

using BackwardKernel = HopperTest;

void check_backward(const CaseSpec& spec, bool deterministic) {
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs(), grads = c.new_outputs();
  if (!built_for(spec)) {
    // Validation does not look at the data: the unbuilt kernel is reported before anything runs
    // (problems without queries or keys take the simple kernels in every build).
    const Status s = call_backward(c, fwd, grads, deterministic);
    if (c.host_problem().total_q() > 0 && c.host_problem().total_k() > 0) {
      EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
      EXPECT_NE(s.message().find("HOPATTN_"), std::string::npos) << s.message();
    }
    return;
  }
  ASSERT_TRUE(forward(c.forward_args(fwd), nullptr).ok());
  const Status s = call_backward(c, fwd, grads, deterministic);
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "backward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, fwd, &grads).backward) {
    std::cout << "    " << r.str() << "\n";
    EXPECT_TRUE(r.ok) << r.str();
  }
}

class BackwardSweep : public BackwardKernel, public ::testing::WithParamInterface<NamedCase> {};
TEST_P(BackwardSweep, MatchesFloat64Oracle) { check_backward(GetParam().spec, /*deterministic=*/false); }
TEST_P(BackwardSweep, DeterministicModeMatchesFloat64Oracle) {
  check_backward(GetParam().spec, /*deterministic=*/true);
}
INSTANTIATE_TEST_SUITE_P(Sweep, BackwardSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Special, BackwardSweep, ::testing::ValuesIn(special_cases()),
                         [](const auto& info) { return info.param.name; });

// Deterministic mode: 100 calls give bitwise the same dQ, dK, dV (the semaphores that order the
// dQ additions are reset by every call, so no call inherits a previous one's state).
class BackwardDeterminism : public BackwardKernel, public ::testing::WithParamInterface<NamedCase> {};
TEST_P(BackwardDeterminism, HundredCallsBitwiseEqual) {
  const CaseSpec& spec = GetParam().spec;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs();
  ASSERT_TRUE(forward(c.forward_args(fwd), nullptr).ok());
  const Outputs first = c.new_outputs(), again = c.new_outputs();
  ASSERT_TRUE(call_backward(c, fwd, first, true).ok());
  check_cuda(cudaDeviceSynchronize(), "backward");
  for (int call = 0; call < 100; ++call) {
    ASSERT_TRUE(call_backward(c, fwd, again, true).ok());
    check_cuda(cudaDeviceSynchronize(), "backward");
    for (Field f : {Field::kDq, Field::kDk, Field::kDv, Field::kDsinks}) {
      if (f == Field::kDsinks && spec.sinks.empty()) continue;
      const Downloaded a = c.download(first, f), b = c.download(again, f);
      ASSERT_EQ(0, std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(double)))
          << "call " << call << " differs in field " << static_cast<int>(f);
    }
  }
}
std::vector<NamedCase> determinism_cases() {
  std::vector<NamedCase> all;
  CaseSpec s;
  s.head_dim = 128;
  s.seqlen_q = s.seqlen_k = 700;
  s.causal = true;
  s.seed = 71;
  all.push_back({"d128_causal", s});
  s.causal = false;
  s.heads = 8;
  s.heads_kv = 2;
  s.head_dim = 64;
  all.push_back({"d64_gqa", s});
  s.head_dim = 96;
  s.dtype = DType::kFloat16;
  s.varlen_seqlens_q = {0, 300, 517, 1};
  s.varlen_seqlens_k = {10, 0, 600, 130};
  all.push_back({"d96_varlen_gqa_fp16", s});
  s = CaseSpec{};
  s.head_dim = 256;
  s.seqlen_q = 200;
  s.seqlen_k = 333;
  s.heads_kv = 1;
  all.push_back({"d256_mqa", s});
  s = CaseSpec{};
  s.head_dim = 128;
  s.heads = 4;
  s.heads_kv = 2;
  s.seqlen_q = s.seqlen_k = 900;
  s.causal = true;
  s.window_left = 128;
  s.sinks = {0.5f, -1.f, 2.f, 1.f};
  all.push_back({"d128_sinks_window", s});
  s.softcap = 30.f;
  all.push_back({"d128_sinks_window_softcap", s});
  s = CaseSpec{};
  s.head_dim = 192;
  s.head_dim_v = 128;
  s.heads = 8;
  s.heads_kv = 1;  // head slices: dK and dV summed in slice order
  s.seqlen_q = 600;
  s.seqlen_k = 200;
  s.causal = true;
  all.push_back({"d192x128_mqa_causal", s});
  return all;
}
INSTANTIATE_TEST_SUITE_P(Cases, BackwardDeterminism, ::testing::ValuesIn(determinism_cases()),
                         [](const auto& info) { return info.param.name; });

// The backward captured into a CUDA graph on a side stream and replayed gives bitwise the direct
// deterministic result: nothing in backward() synchronizes, allocates or copies to the host.
TEST_F(BackwardKernel, CapturedInCudaGraphMatchesDirectCall) {
  CaseSpec spec;
  spec.head_dim = 128;
  spec.causal = true;
  spec.varlen_seqlens_q = {100, 0, 300};
  spec.varlen_seqlens_k = {90, 10, 333};
  spec.seed = 78;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs(), direct = c.new_outputs(), graphed = c.new_outputs();
  ASSERT_TRUE(forward(c.forward_args(fwd), nullptr).ok());
  ASSERT_TRUE(call_backward(c, fwd, direct, true).ok());
  check_cuda(cudaDeviceSynchronize(), "direct backward");

  const Status s = capture_and_replay([&](cudaStream_t stream) { return call_backward(c, fwd, graphed, true, stream); }, 3);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_bitwise_equal(c, direct, graphed, {Field::kDq, Field::kDk, Field::kDv});
}

// The default mode replayed from a graph, with the workspace of the previous replay left as it
// was: the postprocess converts a head once the counter of its finished key blocks says so, and
// that counter must never be read before this call's preprocess has cleared it.
TEST_F(BackwardKernel, DefaultModeReplayedFromAGraphMatchesOracle) {
  CaseSpec spec;
  spec.head_dim = 128;
  spec.heads = 4;
  spec.heads_kv = 2;
  spec.varlen_seqlens_q = {300, 0, 517};
  spec.varlen_seqlens_k = {257, 40, 600};
  spec.seed = 79;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs(), graphed = c.new_outputs();
  ASSERT_TRUE(forward(c.forward_args(fwd), nullptr).ok());
  // A direct call first: it sizes the shared workspace (nothing may allocate during the capture)
  // and poisons it, so the first replay starts from garbage counters.
  ASSERT_TRUE(call_backward(c, fwd, graphed, false).ok());
  check_cuda(cudaDeviceSynchronize(), "direct backward");
  const Status s = capture_and_replay([&](cudaStream_t stream) { return call_backward(c, fwd, graphed, false, stream); }, 5);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const ErrorReport& r : check_with_gpu_oracle(c, fwd, &graphed).backward) EXPECT_TRUE(r.ok) << r.str();
}

}  // namespace
}  // namespace hopattn::testing
