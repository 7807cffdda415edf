// The forward on decode shapes (a few query rows against long KV caches) through its key splits
// and packed GQA heads (src/kernels/fwd/fwd_split_plan.hpp), each forced on and off and left to
// the heuristic: query rows 1 to past one tile, caches from 1 key to 128k, GQA ratios 1 to 64,
// causal and local masks, varlen with unequal and zero cache lengths (seqused_k), odd head dims,
// strided rows, num_splits from 1 to more than the key blocks. Every result is checked against the float64 GPU
// oracle with FA3's rule and poisoned outputs (split and unsplit therefore agree within it), split
// results are bitwise the same on a second run, and a captured graph replays correctly after the
// cache lengths change between replays.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "testing/attention_case.hpp"
#include "testing/device_buffer.hpp"
#include "testing/gpu_oracle.hpp"

namespace hopattn::testing {
namespace {

using ForwardDecode = HopperTest;

const char* pack_name(PackGqa p) { return p == PackGqa::kAuto ? "auto" : (p == PackGqa::kOn ? "on" : "off"); }

// Fixed-length decode problems: every (query rows, cache length, heads) triple once, the mask,
// split count, packing, head dim and dtype rotating through their values so that each value
// meets several shapes.
std::vector<NamedCase> decode_cases() {
  struct Heads {
    int q, kv;
  };
  const int seqlens_q[] = {1, 4, 16, 200};
  const int seqlens_k[] = {1, 300, 8192};
  const Heads heads[] = {{32, 8}, {32, 1}, {8, 8}, {64, 1}};
  const int splits[] = {0, 1, 3, 7, 1000};  // 1000: more than any case's key blocks
  const PackGqa packs[] = {PackGqa::kAuto, PackGqa::kOn, PackGqa::kOff};
  const int head_dims[] = {128, 64, 256, 72};
  std::vector<NamedCase> all;
  int i = 0;
  for (int sq : seqlens_q) {
    for (int sk : seqlens_k) {
      for (const Heads& h : heads) {
        CaseSpec s;
        s.batch = 2;
        s.seqlen_q = sq;
        s.seqlen_k = sk;
        s.heads = h.q;
        s.heads_kv = h.kv;
        s.head_dim = head_dims[i % 4];
        s.dtype = i % 5 == 4 ? DType::kFloat16 : DType::kBFloat16;
        s.causal = i % 3 == 1;
        if (i % 3 == 2) s.window_left = 100;
        s.num_splits = splits[i % 5];
        s.pack_gqa = packs[(i / 5) % 3];
        s.row_padding = i % 7 == 3 ? 16 : 0;  // strided rows: packed Q is read through its strides
        s.seed = 900 + i;
        const std::string mask = s.causal ? "causal" : (s.window_left >= 0 ? "local" : "full");
        all.push_back({"q" + std::to_string(sq) + "_k" + std::to_string(sk) + "_h" + std::to_string(h.q) + "x" +
                           std::to_string(h.kv) + "_d" + std::to_string(s.head_dim) + "_" +
                           (s.dtype == DType::kFloat16 ? "fp16" : "bf16") + "_" + mask + "_splits" +
                           std::to_string(s.num_splits) + "_pack" + pack_name(s.pack_gqa) +
                           (s.row_padding ? "_strided" : ""),
                       s});
        ++i;
      }
    }
  }
  // One causal query row per sequence against a contiguous cache.
  auto one_query_row = [](int batch, int seqlen_k, int heads, int heads_kv, int head_dim) {
    CaseSpec s;
    s.batch = batch;
    s.seqlen_q = 1;
    s.seqlen_k = seqlen_k;
    s.heads = heads;
    s.heads_kv = heads_kv;
    s.head_dim = head_dim;
    s.causal = true;
    return s;
  };
  // A long cache with MQA: the automatic choice takes many pieces for one tile.
  CaseSpec mqa = one_query_row(1, 131072, 32, 1, 128);
  mqa.seed = 990;
  all.push_back({"q1_k131072_h32x1_d128_causal_auto", mqa});
  // d192, which the rotation above leaves out: the packed narrow tile with whole key blocks
  // (one query row of 32/8 heads, contiguous cache), split and not.
  CaseSpec d192 = one_query_row(2, 8192, 32, 8, 192);
  for (int n : {0, 1}) {
    d192.num_splits = n;
    d192.seed = 970 + n;
    all.push_back({"q1_k8192_h32x8_d192_causal_splits" + std::to_string(n), d192});
  }
  // Attention sinks through the key splits' combine and the packed heads' epilogue.
  CaseSpec sinks = one_query_row(2, 8192, 32, 8, 128);
  for (int h = 0; h < sinks.heads; ++h) sinks.sinks.push_back(static_cast<float>(h % 9) - 2.f);
  for (int n : {0, 1}) {
    sinks.num_splits = n;
    sinks.seed = 980 + n;
    all.push_back({"q1_k8192_h32x8_sinks_splits" + std::to_string(n), sinks});
  }
  sinks.softcap = 30.f;
  sinks.num_splits = 0;
  all.push_back({"q1_k8192_h32x8_sinks_softcap30", sinks});
  // A varlen decode batch: unequal caches, seqused_k shorter than the cache, zero-length caches.
  CaseSpec v;
  v.varlen_seqlens_q = {1, 1, 1, 1, 3};
  v.varlen_seqlens_k = {5000, 0, 300, 9000, 2000};
  v.seqused_k = {4000, 0, 0, 9000, 1999};
  v.heads = 16;
  v.heads_kv = 4;
  v.head_dim = 128;
  v.causal = true;
  for (int n : {0, 1, 5}) {
    for (PackGqa p : {PackGqa::kOn, PackGqa::kOff}) {
      v.num_splits = n;
      v.pack_gqa = p;
      v.seed = 991 + n + 10 * static_cast<int>(p);
      all.push_back({"varlen_seqused_splits" + std::to_string(n) + "_pack" + pack_name(p), v});
    }
  }
  return all;
}

class DecodeSweep : public ForwardDecode, public ::testing::WithParamInterface<NamedCase> {};

// With the workspace (where splits happen) and without it (never split), both against the oracle;
// with the workspace twice, bitwise.
TEST_P(DecodeSweep, MatchesFloat64OracleAndRepeatsBitwise) {
  const CaseSpec& spec = GetParam().spec;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  AttentionCase c(spec);
  const Outputs split = c.new_outputs(), again = c.new_outputs(), plain = c.new_outputs();
  ASSERT_TRUE(call_forward(c, split, /*with_workspace=*/true).ok());
  ASSERT_TRUE(call_forward(c, again, /*with_workspace=*/true).ok());
  ASSERT_TRUE(call_forward(c, plain, /*with_workspace=*/false).ok());
  check_cuda(cudaDeviceSynchronize(), "forward");
  std::cout << "    with workspace:\n";
  for (const ErrorReport& r : check_with_gpu_oracle(c, split, nullptr).forward) expect_ok(r);
  std::cout << "    without workspace:\n";
  for (const ErrorReport& r : check_with_gpu_oracle(c, plain, nullptr).forward) expect_ok(r);
  expect_bitwise_equal(c, split, again, {Field::kO, Field::kLse});
}
INSTANTIATE_TEST_SUITE_P(Decode, DecodeSweep, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.name; });

// A decode step captured once into a CUDA graph and replayed with other cache lengths written
// into seqused_k between replays (as an engine does at every step): each replay matches the
// oracle of the lengths it ran with. The grid depends only on shapes and maxima, so the captured
// split layout serves every length.
TEST_F(ForwardDecode, GraphReplaysFollowSequsedChanges) {
  CaseSpec spec;
  spec.varlen_seqlens_q = {1, 1, 1};
  spec.varlen_seqlens_k = {8192, 8192, 8192};
  spec.seqused_k = {8192, 100, 5000};
  spec.heads = 32;
  spec.heads_kv = 8;
  spec.head_dim = 128;
  spec.causal = true;
  spec.seed = 1200;
  if (!built_for(spec)) GTEST_SKIP() << "no kernel for this case in this build";
  const std::vector<std::vector<int>> steps = {{8192, 100, 5000}, {0, 8191, 1}, {4097, 4096, 8000}};
  AttentionCase captured(spec);
  const Outputs out = captured.new_outputs();
  const ForwardArgs args = captured.forward_args(out);
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(args, &bytes).ok());
  ASSERT_GT(bytes, 0u);
  const DeviceBuffer workspace(bytes);

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const Status s = forward(args, Workspace{workspace.data(), bytes}, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  ASSERT_TRUE(s.ok()) << s.message();
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (const std::vector<int>& lengths : steps) {
    check_cuda(cudaMemcpyAsync(const_cast<int32_t*>(args.varlen.seqused_k.data), lengths.data(),
                               lengths.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
               "new cache lengths");
    check_cuda(cudaGraphLaunch(exec, stream), "replay");
    check_cuda(cudaStreamSynchronize(stream), "replay");
    // The same inputs (same seed and sizes) with this step's lengths: its oracle.
    CaseSpec step = spec;
    step.seqused_k = lengths;
    const AttentionCase expected(step);
    std::cout << "    seqused_k " << lengths[0] << ", " << lengths[1] << ", " << lengths[2] << ":\n";
    for (const ErrorReport& r : check_with_gpu_oracle(expected, out, nullptr).forward) expect_ok(r);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace hopattn::testing
