// The GPU path (the kernels behind forward()/backward()) against the float64 CPU
// reference with FA3's tolerance rule, fresh random inputs and poisoned outputs; the float64 GPU
// oracle on a larger problem; zero-size problems; determinism; the C ABI on the device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "hopattn/hopattn.h"
#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "reference/cpu_reference.hpp"
#include "testing/attention_case.hpp"
#include "testing/gpu_oracle.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {
namespace {

using Gpu = HopperTest;

void sync() { check_cuda(cudaDeviceSynchronize(), "kernel"); }

void run_forward(const AttentionCase& c, const Outputs& out) {
  const Status s = forward(c.forward_args(out), nullptr);
  if (s.code() == StatusCode::kNotSupported) GTEST_SKIP() << s.message();  // a kernel this build left out
  ASSERT_TRUE(s.ok()) << s.message();
  sync();
}

void run_backward(const AttentionCase& c, const Outputs& fwd, const Outputs& grads, bool deterministic = false) {
  const Status s = call_backward(c, fwd, grads, deterministic);
  ASSERT_TRUE(s.ok()) << s.message();
  sync();
}

// Forward and backward of one case against the CPU float64 reference.
void check_against_cpu(const CaseSpec& spec) {
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs();
  run_forward(c, fwd);
  if (::testing::Test::IsSkipped()) return;
  const Outputs grads = c.new_outputs();
  run_backward(c, fwd, grads);
  if (::testing::Test::HasFatalFailure()) return;

  using cpu_reference::Rounding;
  const auto& hp = c.host_problem();
  const auto q = c.input(Field::kQ), k = c.input(Field::kK), v = c.input(Field::kV), dout = c.input(Field::kDout);
  const Rounding low = cpu_reference::rounding_for(spec.dtype);
  const auto exact = cpu_reference::forward(hp, q, k, v);
  const auto naive = cpu_reference::forward(hp, q, k, v, low);
  expect_ok(check_against_reference("o", c.download(fwd, Field::kO), exact.o, naive.o, spec.dtype));
  expect_ok(check_against_reference("lse", c.download(fwd, Field::kLse), exact.lse, naive.lse, DType::kFloat32));
  const auto exact_grads = cpu_reference::backward(hp, q, k, v, dout);
  const auto naive_grads = cpu_reference::backward(hp, q, k, v, dout, low);
  expect_ok(check_against_reference("dq", c.download(grads, Field::kDq), exact_grads.dq, naive_grads.dq, spec.dtype));
  expect_ok(check_against_reference("dk", c.download(grads, Field::kDk), exact_grads.dk, naive_grads.dk, spec.dtype));
  expect_ok(check_against_reference("dv", c.download(grads, Field::kDv), exact_grads.dv, naive_grads.dv, spec.dtype));
  if (!spec.sinks.empty()) {
    expect_ok(check_float32_sum_against_reference("dsinks", c.download(grads, Field::kDsinks), exact_grads.dsink,
                                                  naive_grads.dsink));
  }
}

struct NamedCase {
  std::string name;
  CaseSpec spec;
};

void PrintTo(const NamedCase& c, std::ostream* os) { *os << c.name; }

std::vector<NamedCase> cases() {
  std::vector<NamedCase> all;
  uint64_t seed = 1000;
  auto add = [&](std::string name, CaseSpec s) {
    s.seed = seed++;
    all.push_back({std::move(name), s});
  };
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const std::string t = dtype == DType::kBFloat16 ? "bf16" : "fp16";
    for (int d : {64, 96, 128, 192, 256}) {
      CaseSpec s;
      s.dtype = dtype;
      s.head_dim = d;
      s.batch = 2;
      s.heads = s.heads_kv = 2;
      s.seqlen_q = s.seqlen_k = 150;
      add(t + "_d" + std::to_string(d), s);
      s.causal = true;
      s.seqlen_q = 120;
      s.seqlen_k = 200;
      add(t + "_d" + std::to_string(d) + "_causal", s);
    }
  }
  CaseSpec s;
  s.head_dim = 40;  // any multiple of 8 up to 256
  add("bf16_d40", s);

  s = CaseSpec{};
  s.head_dim = 128;
  s.heads = 8;
  s.heads_kv = 2;
  s.causal = true;
  s.window_left = 40;
  add("gqa_causal_local", s);

  s = CaseSpec{};
  s.heads = 4;
  s.heads_kv = 1;
  s.window_left = 30;
  s.window_right = 20;
  s.seqlen_q = 100;
  s.seqlen_k = 170;
  add("mqa_two_sided_window", s);

  s = CaseSpec{};
  s.causal = true;
  s.seqlen_q = 200;
  s.seqlen_k = 70;  // the first 130 queries see no key
  add("causal_more_queries_than_keys", s);

  s = CaseSpec{};
  s.dtype = DType::kFloat16;
  s.varlen_seqlens_q = {37, 0, 130, 64, 5};
  s.varlen_seqlens_k = {50, 20, 0, 64, 129};
  s.causal = true;
  s.heads = 4;
  s.heads_kv = 2;
  add("varlen_causal_gqa_with_empty_sequences", s);

  s.causal = false;
  s.seqused_q = {30, 0, 100, 64, 1};
  s.seqused_k = {50, 3, 0, 10, 129};
  add("varlen_seqused", s);

  // Attention sinks: rows that see no key (the sink alone: O = 0, LSE = sink), a window, GQA,
  // varlen with empty sequences.
  s = CaseSpec{};
  s.causal = true;
  s.seqlen_q = 200;
  s.seqlen_k = 70;
  s.heads = 4;
  s.sinks = {0.5f, -1.f, 2.f, 4.f};
  add("sinks_causal_more_queries_than_keys", s);
  s = CaseSpec{};
  s.head_dim = 128;
  s.heads = 8;
  s.heads_kv = 2;
  s.seqlen_q = s.seqlen_k = 300;
  s.causal = true;
  s.window_left = 128;
  s.sinks = {1.f, 0.f, -3.f, 2.5f, 0.25f, 3.f, -0.5f, 1.5f};
  add("sinks_gqa_window128", s);
  s = CaseSpec{};
  s.heads = s.heads_kv = 2;
  s.varlen_seqlens_q = {37, 0, 130, 5};
  s.varlen_seqlens_k = {50, 20, 0, 129};
  s.sinks = {-1.f, 3.f};
  add("sinks_varlen_with_empty_sequences", s);
  s = CaseSpec{};
  s.causal = true;
  s.seqlen_q = 150;
  s.seqlen_k = 170;
  s.softmax_scale = 0.8f;  // scores of several units: the cap bends them
  for (float cap : {2.f, 30.f}) {
    s.softcap = cap;
    add("softcap" + std::to_string(static_cast<int>(cap)) + "_causal", s);
  }

  s = CaseSpec{};
  s.row_padding = 24;  // Q/K/V/O... rows 24 elements apart: non-contiguous, as in a packed QKV
  s.softmax_scale = 0.5f;
  s.seqlen_q = s.seqlen_k = 1;
  add("strided_scale_seqlen1", s);
  s.seqlen_q = 77;
  s.seqlen_k = 93;
  add("strided_scale", s);
  return all;
}

class GpuVsCpu : public Gpu, public ::testing::WithParamInterface<NamedCase> {};

TEST_P(GpuVsCpu, ForwardAndBackwardWithinFa3Tolerance) { check_against_cpu(GetParam().spec); }

INSTANTIATE_TEST_SUITE_P(Cases, GpuVsCpu, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST_F(Gpu, ZeroSizeProblems) {
  CaseSpec s;
  s.batch = 0;
  check_against_cpu(s);
  s = CaseSpec{};
  s.seqlen_k = 0;  // O = 0, LSE = -inf, dQ = 0
  check_against_cpu(s);
  s = CaseSpec{};
  s.seqlen_q = 0;  // dK = dV = 0
  check_against_cpu(s);
}

// Larger than the CPU reference can afford: the float32 path against the float64 GPU oracle, with
// the naive low-precision GPU computation as the bound.
TEST_F(Gpu, MatchesFloat64GpuOracleOnALargerProblem) {
  CaseSpec spec;
  spec.batch = 2;
  spec.seqlen_q = spec.seqlen_k = 1024;
  spec.heads = 8;
  spec.heads_kv = 2;
  spec.head_dim = 128;
  spec.causal = true;
  spec.seed = 77;
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs(), grads = c.new_outputs();
  run_forward(c, fwd);
  if (IsSkipped()) return;
  run_backward(c, fwd, grads);

  const OracleReports reports = check_with_gpu_oracle(c, fwd, &grads);
  for (const auto* list : {&reports.forward, &reports.backward}) {
    for (const ErrorReport& r : *list) expect_ok(r);
  }
}

TEST_F(Gpu, BackwardIsBitwiseDeterministic) {
  CaseSpec spec;
  spec.heads = 4;
  spec.heads_kv = 1;
  spec.seqlen_q = spec.seqlen_k = 300;
  spec.seed = 5;
  AttentionCase c(spec);
  const Outputs fwd = c.new_outputs(), first = c.new_outputs(), second = c.new_outputs();
  run_forward(c, fwd);
  if (IsSkipped()) return;
  run_backward(c, fwd, first, /*deterministic=*/true);
  run_backward(c, fwd, second, /*deterministic=*/true);
  for (Field f : {Field::kDq, Field::kDk, Field::kDv}) {
    const Downloaded a = c.download(first, f), b = c.download(second, f);
    ASSERT_EQ(a.values.size(), b.values.size());
    EXPECT_EQ(0, std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(double)));
  }
}

TEST_F(Gpu, CAbiMatchesCppApi) {
  CaseSpec spec;
  spec.causal = true;
  spec.seed = 9;
  AttentionCase c(spec);
  const Outputs cpp = c.new_outputs(), capi = c.new_outputs();
  run_forward(c, cpp);
  if (IsSkipped()) return;
  const ForwardArgs a = c.forward_args(capi);
  hopattn_forward_args ca;
  hopattn_forward_args_init(&ca);
  auto to_c = [](const Tensor& t) {
    hopattn_tensor out{};
    out.data = t.data;
    out.dtype = static_cast<int32_t>(t.dtype);
    out.rank = t.rank;
    std::memcpy(out.shape, t.shape, sizeof out.shape);
    std::memcpy(out.stride, t.stride, sizeof out.stride);
    return out;
  };
  ca.q = to_c(a.q);
  ca.k = to_c(a.k);
  ca.v = to_c(a.v);
  ca.o = to_c(a.o);
  ca.lse = to_c(a.lse);
  ca.causal = 1;
  ASSERT_EQ(hopattn_forward(&ca, nullptr), HOPATTN_OK) << hopattn_last_error();
  sync();
  const Downloaded x = c.download(cpp, Field::kO), y = c.download(capi, Field::kO);
  EXPECT_EQ(0, std::memcmp(x.values.data(), y.values.data(), x.values.size() * sizeof(double)));
}

}  // namespace
}  // namespace hopattn::testing
