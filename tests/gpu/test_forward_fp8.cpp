// FP8 inputs (float8_e4m3 q, k, v with per-(batch, KV head) descale factors, O in bf16 or fp16)
// through forward(): fresh random inputs, poisoned outputs and FA3's rule, whose bound is the
// error of the naive FP8 computation (docs/semantics.md, "FP8"). Small problems are checked against
// the float64 CPU reference on the dequantized inputs, which knows nothing of descales (so it
// checks how the GPU side applies them); the sweep against the float64 GPU oracle. forward() runs
// them on the Hopper FP8 kernel where it takes the problem and on the simple reference kernel
// otherwise (docs/semantics.md, "FP8"); the tests hold for both.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "reference/cpu_reference.hpp"
#include "testing/attention_case.hpp"
#include "testing/gpu_oracle.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {
namespace {

using ForwardFp8 = HopperTest;

// Head dim pairs (Q/K, V), each a multiple of 16: the kernel head dims, ones a kernel would run
// zero-padded, the smallest, and V narrower than Q/K.
struct DimsChoice {
  int qk, v;
};
constexpr DimsChoice kDims[] = {{64, 64}, {128, 128}, {256, 256}, {96, 96}, {80, 80}, {16, 16}, {192, 128}, {128, 64}};
constexpr std::pair<int, int> kSeqlens[] = {{1, 1}, {113, 203}, {128, 128}, {257, 1000}, {799, 3}};
constexpr MaskChoice kMasks[] = {{"none", false, -1, -1}, {"causal", true, -1, -1}, {"local37_11", false, 37, 11},
                                 {"causal_left100", true, 100, -1}};
CaseSpec fp8_spec(int head_dim, int head_dim_v, DType out_dtype) {
  CaseSpec s;
  s.dtype = DType::kFloat8E4M3;
  s.fp8_out_dtype = out_dtype;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v;
  return s;
}

// Head dims x seqlen pairs, the mask, head mode, O's dtype and the descales rotating.
std::vector<NamedCase> fp8_sweep_cases() {
  SeededCases cases(30000);
  int rotation = 0;
  for (const DimsChoice& dims : kDims) {
    for (const auto& [sq, sk] : kSeqlens) {
      const DType out = rotation % 3 == 2 ? DType::kFloat16 : DType::kBFloat16;
      const bool descales = rotation % 4 != 3;
      CaseSpec s = fp8_spec(dims.qk, dims.v, out);
      s.seqlen_q = sq;
      s.seqlen_k = sk;
      const std::string mask_and_heads = rotate_mask_and_heads(rotation++, kMasks, s);
      s.fp8_descales = descales;
      cases.add("e4m3_" + dtype_tag(out) + "_d" + std::to_string(dims.qk) + "x" + std::to_string(dims.v) + "_" +
                    std::to_string(sq) + "x" + std::to_string(sk) + "_" + mask_and_heads +
                    (descales ? "" : "_nodescale"),
                s);
    }
  }
  return cases.take();
}

// Varlen (with seqused and empty sequences), strided rows, sinks, softcap, a long causal problem.
std::vector<NamedCase> fp8_special_cases() {
  SeededCases cases(31000);
  CaseSpec s = fp8_spec(128, 128, DType::kBFloat16);
  s.heads = 4;
  s.heads_kv = 2;
  s.varlen_seqlens_q = {130, 0, 257, 64, 700};
  s.varlen_seqlens_k = {200, 9, 129, 0, 650};
  s.causal = true;
  cases.add("e4m3_varlen_causal_gqa", s);
  // The Python suite's varlen case (test_gpu_fp8.py): short sequences in one key block each, the
  // last with more queries than keys (it once left NaN there, when V^T came from the workspace).
  CaseSpec short_sequences = s;
  short_sequences.varlen_seqlens_q = {30, 0, 77};
  short_sequences.varlen_seqlens_k = {50, 9, 64};
  cases.add("e4m3_varlen_short_sequences_causal_gqa", short_sequences);
  s.causal = false;
  s.window_left = 60;
  s.window_right = 3;
  s.seqused_q = {100, 0, 0, 64, 511};
  s.seqused_k = {200, 4, 100, 0, 649};
  s.fp8_out_dtype = DType::kFloat16;
  cases.add("e4m3_varlen_local_seqused_fp16", s);

  s = fp8_spec(128, 128, DType::kBFloat16);
  s.batch = 3;
  s.heads = 4;
  s.heads_kv = 2;
  s.seqlen_q = 300;
  s.seqlen_k = 517;
  s.row_padding = 48;  // rows 48 elements apart: batch, row and head strides all distinct
  cases.add("e4m3_strided_batch3_gqa", s);

  s = fp8_spec(128, 128, DType::kBFloat16);
  s.heads = 8;
  s.heads_kv = 2;
  s.seqlen_q = 1300;
  s.seqlen_k = 1000;
  s.causal = true;
  for (int h = 0; h < s.heads; ++h) s.sinks.push_back(static_cast<float>((h * 7) % 11) * 0.5f - 2.f);
  cases.add("e4m3_sinks_causal_more_queries_gqa", s);
  s.sinks.clear();
  s.softcap = 30.f;
  s.softmax_scale = 0.5f;  // a large scale: the cap matters
  cases.add("e4m3_softcap30_causal_gqa", s);

  // Decode shapes: the plan packs the GQA group's heads into one tile (the packed FP8 kernel).
  s = fp8_spec(128, 128, DType::kBFloat16);
  s.batch = 2;
  s.heads = 8;
  s.heads_kv = 2;
  s.seqlen_q = 1;
  s.seqlen_k = 1500;
  s.causal = true;
  cases.add("e4m3_decode_gqa_packed", s);
  s.seqlen_q = 4;
  s.heads_kv = 1;
  s.seqlen_k = 300;
  cases.add("e4m3_decode4_mqa_packed", s);

  s = fp8_spec(128, 128, DType::kBFloat16);
  s.batch = 1;
  s.heads = s.heads_kv = 2;
  s.seqlen_q = s.seqlen_k = 4224;
  s.causal = true;
  cases.add("e4m3_long_4224_causal", s);
  s = fp8_spec(256, 256, DType::kFloat16);
  s.batch = 1;
  s.heads = s.heads_kv = 2;
  s.seqlen_q = s.seqlen_k = 4224;
  cases.add("e4m3_long_4224_d256_fp16", s);
  return cases.take();
}

// forward() of the case into poisoned outputs (with the workspace it asks for).
Outputs run_forward(const AttentionCase& c) {
  Outputs out = c.new_outputs();
  const Status s = call_forward(c, out, /*with_workspace=*/true);
  EXPECT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward");
  return out;
}

class ForwardFp8Sweep : public ForwardFp8, public ::testing::WithParamInterface<NamedCase> {};
TEST_P(ForwardFp8Sweep, MatchesFloat64Oracle) {
  const AttentionCase c(GetParam().spec);
  const Outputs out = run_forward(c);
  if (HasFailure()) return;
  for (const ErrorReport& r : check_with_gpu_oracle(c, out, nullptr).forward) expect_ok(r);
}
// The FP8 kernel needs no workspace (V is transposed in shared memory): without one it runs too,
// on the plan the bf16 forward has without one.
TEST_P(ForwardFp8Sweep, WithoutWorkspaceMatchesFloat64Oracle) {
  const AttentionCase c(GetParam().spec);
  Outputs out = c.new_outputs();
  const Status s = call_forward(c, out, /*with_workspace=*/false);
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward");
  for (const ErrorReport& r : check_with_gpu_oracle(c, out, nullptr).forward) expect_ok(r);
}
INSTANTIATE_TEST_SUITE_P(Sweep, ForwardFp8Sweep, ::testing::ValuesIn(fp8_sweep_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Special, ForwardFp8Sweep, ::testing::ValuesIn(fp8_special_cases()),
                         [](const auto& info) { return info.param.name; });

// Against the CPU: exact is the float64 attention of the dequantized inputs, the bound the naive
// FP8 computation's error.
void check_against_cpu(const CaseSpec& spec) {
  const AttentionCase c(spec);
  const Outputs out = run_forward(c);
  if (::testing::Test::HasFailure()) return;
  const auto& hp = c.host_problem();
  const auto q = c.input(Field::kQ), k = c.input(Field::kK), v = c.input(Field::kV);
  const auto exact = cpu_reference::forward(hp, q, k, v);
  const auto naive = cpu_reference::forward(hp, q, k, v, cpu_reference::naive_fp8_forward(spec.out_dtype()));
  expect_ok(check_against_reference("o", c.download(out, Field::kO), exact.o, naive.o, spec.out_dtype()));
  expect_ok(check_against_reference("lse", c.download(out, Field::kLse), exact.lse, naive.lse, DType::kFloat32));
}

TEST_F(ForwardFp8, MatchesCpuReferenceOnDequantizedInputs) {
  CaseSpec s = fp8_spec(64, 64, DType::kBFloat16);
  s.heads = 6;
  s.heads_kv = 2;  // q's descale is its KV head's
  s.seqlen_q = 77;
  s.seqlen_k = 150;
  s.causal = true;
  s.seed = 1;
  check_against_cpu(s);
  s = fp8_spec(192, 128, DType::kFloat16);
  s.seqlen_q = 65;
  s.seqlen_k = 90;
  s.window_left = 20;
  s.seed = 2;
  check_against_cpu(s);
  s = fp8_spec(128, 128, DType::kBFloat16);
  s.heads = 4;
  s.heads_kv = 1;
  s.varlen_seqlens_q = {30, 0, 41};  // each sequence its own row of descales
  s.varlen_seqlens_k = {50, 7, 33};
  s.sinks = {-1.f, 0.5f, 2.f, -INFINITY};
  s.softcap = 20.f;
  s.seed = 3;
  check_against_cpu(s);
}

// The descales are the inputs' scale: with them the result is the one of the dequantized inputs,
// so a factor of 2 on v doubles O (exactly: powers of two scale fp32 and, away from their
// subnormals, bf16 values exactly).
TEST_F(ForwardFp8, VDescaleScalesTheOutput) {
  CaseSpec s = fp8_spec(128, 128, DType::kBFloat16);
  s.fp8_descales = false;
  s.seqlen_q = 100;
  s.seqlen_k = 300;
  s.seed = 4;
  const AttentionCase c(s);
  DeviceBuffer twos(size_t(s.batch) * s.heads_kv * sizeof(float));
  const std::vector<float> factors(size_t(s.batch) * s.heads_kv, 2.0f);
  twos.upload(factors.data(), twos.bytes());
  // Both calls with the workspace they ask for: a split tail sums its pieces in another order than
  // the tail-free call.
  auto run = [&](const Outputs& out, bool with_descale) {
    ForwardArgs args = c.forward_args(out);
    if (with_descale) args.v_descale = make_tensor(twos.data(), DType::kFloat32, {s.batch, s.heads_kv});
    size_t bytes = 0;
    ASSERT_TRUE(forward_workspace_size(args, &bytes).ok());
    DeviceBuffer workspace(bytes);
    ASSERT_TRUE(forward(args, Workspace{workspace.data(), bytes}, nullptr).ok());
    check_cuda(cudaDeviceSynchronize(), "forward");
  };
  const Outputs plain = c.new_outputs(), doubled = c.new_outputs();
  run(plain, false);
  run(doubled, true);
  if (HasFatalFailure()) return;
  const Downloaded a = c.download(plain, Field::kO), b = c.download(doubled, Field::kO);
  for (size_t i = 0; i < a.values.size(); ++i) ASSERT_EQ(2 * a.values[i], b.values[i]) << "element " << i;
  expect_bitwise_equal(c, plain, doubled, {Field::kLse});
}

// FP8 has a forward only: the backward says so before touching the GPU. (FP8 KV caches are
// tested from Python, tests/python/test_gpu_fp8.py, against the float64 reference.)
TEST_F(ForwardFp8, BackwardIsNotSupported) {
  const AttentionCase c(fp8_spec(128, 128, DType::kBFloat16));
  const Outputs out = c.new_outputs();
  ForwardArgs f = c.forward_args(out);
  BackwardArgs b;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  size_t bytes = 0;
  EXPECT_EQ(backward_workspace_size(b, &bytes).code(), StatusCode::kNotSupported);
  EXPECT_EQ(backward(b, Workspace{}, nullptr).code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace hopattn::testing
