#include "kernel_cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "api/device.hpp"
#include "testing/device_buffer.hpp"

namespace hopattn::testing {
namespace {

constexpr MaskChoice kMasks[] = {{"none", false, -1, -1},  {"causal", true, -1, -1},     {"local37_11", false, 37, 11},
                                 {"local0_0", false, 0, 0}, {"causal_left100", true, 100, -1}, {"right50", false, -1, 50}};

}  // namespace

// dtype x head dim x (seqlen_q, seqlen_k), with the mask and head mode rotating so that every
// combination of neighbours appears without a full cross product.
std::vector<NamedCase> sweep_cases() {
  const int head_dims[] = {64, 96, 128, 192, 256, 8, 40, 72, 80, 104, 160, 248};
  const std::pair<int, int> seqlens[] = {{1, 1},     {1, 300},   {113, 203}, {799, 3},
                                         {3, 799},   {128, 128}, {257, 1000}, {1000, 257}};
  SeededCases cases(5000);
  int rotation = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int d : head_dims) {
      for (const auto& [sq, sk] : seqlens) {
        CaseSpec s;
        s.dtype = dtype;
        s.head_dim = d;
        s.batch = 2;
        s.seqlen_q = sq;
        s.seqlen_k = sk;
        const std::string mask_and_heads = rotate_mask_and_heads(rotation++, kMasks, s);
        cases.add(dtype_tag(dtype) + "_d" + std::to_string(d) + "_" + std::to_string(sq) + "x" + std::to_string(sk) +
                      "_" + mask_and_heads,
                  s);
      }
    }
  }
  return cases.take();
}

namespace {

// Multi-head attention of `seqlen` queries and keys, named `prefix` + head dim (+ "_causal").
void add_square_cases(SeededCases& cases, const std::string& prefix, std::initializer_list<int> head_dims, int batch,
                      int heads, int seqlen) {
  for (int d : head_dims) {
    for (bool causal : {false, true}) {
      CaseSpec s;
      s.head_dim = d;
      s.batch = batch;
      s.heads = s.heads_kv = heads;
      s.seqlen_q = s.seqlen_k = seqlen;
      s.causal = causal;
      cases.add(prefix + std::to_string(d) + (causal ? "_causal" : ""), s);
    }
  }
}

}  // namespace

// Larger and special problems: long sequences, strides, scales, varlen corner cases.
std::vector<NamedCase> special_cases() {
  SeededCases cases(9000);
  add_square_cases(cases, "long_4224_d", {64, 128, 256}, /*batch=*/1, /*heads=*/2, /*seqlen=*/4224);
  // More backward tiles than an H100/H200 has SMs, so that persistent CTAs (problems of at most
  // 16 query blocks: 1k queries, 2k at d64) take several each from the tile counter: K and V
  // reloaded under the previous tile's epilogue (at d192/d256 with the tile's first Q/dO stages),
  // the Q/dO ring running on, a partial last key block, tiles of unequal length (causal), GQA with
  // fewer queries than keys, and varlen with empty and short sequences (tiles without queries or
  // past their keys). The forward runs them too: many tiles a CTA through its publisher's slots.
  add_square_cases(cases, "many_tiles_d", {64, 96, 128, 192, 256}, /*batch=*/4, /*heads=*/8, /*seqlen=*/1000);
  CaseSpec many_gqa;
  many_gqa.head_dim = 128;
  many_gqa.batch = 8;
  many_gqa.heads = 16;
  many_gqa.heads_kv = 4;
  many_gqa.seqlen_q = 700;
  many_gqa.seqlen_k = 1100;
  cases.add("many_tiles_gqa", many_gqa);
  CaseSpec many_varlen;
  many_varlen.head_dim = 128;
  many_varlen.heads = 8;
  many_varlen.heads_kv = 2;
  many_varlen.varlen_seqlens_q = {700, 0, 129, 1000, 5, 640, 1000, 3, 900, 1000, 77, 512};
  many_varlen.varlen_seqlens_k = {650, 40, 0, 1100, 130, 640, 1024, 3, 1000, 900, 300, 512};
  many_varlen.causal = true;
  cases.add("many_tiles_varlen_gqa_causal", many_varlen);
  many_varlen.head_dim = 256;
  cases.add("many_tiles_varlen_gqa_causal_d256", many_varlen);

  CaseSpec s;
  s.batch = 3;
  s.heads = 4;
  s.heads_kv = 2;
  s.head_dim = 128;
  s.seqlen_q = 300;
  s.seqlen_k = 517;
  s.row_padding = 24;  // rows 24 elements apart: batch, row and head strides all distinct
  cases.add("strided_batch3_gqa", s);
  s.causal = true;
  s.dtype = DType::kFloat16;
  cases.add("strided_batch3_gqa_causal_fp16", s);

  s = CaseSpec{};
  s.head_dim = 128;
  s.seqlen_q = s.seqlen_k = 333;
  s.softmax_scale = -0.3f;  // a negative scale turns the max into a min: the softmax must not care
  cases.add("negative_scale", s);
  s.softmax_scale = 2.0f;
  s.causal = true;
  cases.add("large_scale_causal", s);

  // Windows as large as an int allows ("unbounded" spelled as INT_MAX): the band's edges must not
  // overflow in the boundary blocks' element mask (the partial last key block here).
  s = CaseSpec{};
  s.head_dim = 128;
  s.seqlen_q = 300;
  s.seqlen_k = 203;
  s.window_left = s.window_right = std::numeric_limits<int>::max();
  cases.add("int_max_windows_more_queries", s);
  std::swap(s.seqlen_q, s.seqlen_k);
  cases.add("int_max_windows_more_keys", s);
  s.window_right = -1;
  cases.add("int_max_window_left_more_keys", s);

  s = CaseSpec{};
  s.head_dim = 128;
  s.heads = 4;
  s.heads_kv = 2;
  s.varlen_seqlens_q = {0, 0, 300};  // leading empty sequences
  s.varlen_seqlens_k = {0, 0, 411};
  cases.add("varlen_leading_empty", s);
  s.varlen_seqlens_q = {0, 0, 0};
  s.varlen_seqlens_k = {5, 0, 7};
  cases.add("varlen_all_queries_empty", s);
  s.varlen_seqlens_q = {17, 0, 9};
  s.varlen_seqlens_k = {0, 0, 0};
  cases.add("varlen_all_keys_empty", s);
  s.varlen_seqlens_q = {130, 1, 257, 64, 0, 700};
  s.varlen_seqlens_k = {200, 9, 129, 0, 33, 650};
  s.causal = true;
  cases.add("varlen_causal_gqa", s);
  s.causal = false;
  s.window_left = 60;
  s.window_right = 3;
  s.seqused_q = {100, 1, 0, 64, 0, 511};
  s.seqused_k = {200, 4, 100, 0, 10, 649};
  cases.add("varlen_local_seqused", s);
  s.window_left = s.window_right = -1;
  s.head_dim = 192;
  s.dtype = DType::kFloat16;
  s.seqused_q.clear();
  s.seqused_k.clear();
  cases.add("varlen_d192_fp16", s);
  s.head_dim = 72;
  s.row_padding = 16;
  cases.add("varlen_d72_strided", s);

  // Attention sinks (one logit per query head): with a 128-token window (gpt-oss), causal GQA
  // with more queries than keys (rows that see only the sink), varlen with empty sequences.
  auto sinks_for = [](int heads) {
    std::vector<float> sinks;
    for (int h = 0; h < heads; ++h) sinks.push_back(static_cast<float>((h * 7) % 11) * 0.5f - 2.f);
    return sinks;
  };
  for (int d : {64, 128}) {
    s = CaseSpec{};
    s.head_dim = d;
    s.heads = 8;
    s.heads_kv = 2;
    s.seqlen_q = s.seqlen_k = 1000;
    s.causal = true;
    s.window_left = 128;
    s.sinks = sinks_for(s.heads);
    cases.add("sinks_window128_gqa_d" + std::to_string(d), s);
    s.window_left = -1;
    s.seqlen_q = 1300;
    cases.add("sinks_causal_more_queries_gqa_d" + std::to_string(d), s);
  }
  s = CaseSpec{};
  s.head_dim = 128;
  s.heads = 4;
  s.varlen_seqlens_q = {130, 0, 257, 1};
  s.varlen_seqlens_k = {200, 9, 0, 650};
  s.sinks = sinks_for(s.heads);
  cases.add("sinks_varlen", s);
  // Unmasked and fixed-length: the split tail's owners add the sink after their merge; and the
  // wider unmasked key blocks.
  s = CaseSpec{};
  s.head_dim = 128;
  s.batch = 1;
  s.heads = s.heads_kv = 4;
  s.seqlen_q = s.seqlen_k = 4224;
  s.sinks = sinks_for(s.heads);
  cases.add("sinks_unmasked_long_d128", s);

  // Softcap (Gemma 2 uses 50, 30 is common, a small cap saturates most scores), every kernel head
  // dim and one that runs zero-padded, masks, GQA, varlen, with sinks.
  const float caps[] = {30.f, 50.f, 2.f};
  int i = 0;
  for (int d : {64, 96, 128, 192, 256, 72}) {
    for (bool causal : {false, true}) {
      s = CaseSpec{};
      s.head_dim = d;
      s.heads = 4;
      s.heads_kv = d == 128 ? 1 : 2;
      s.seqlen_q = causal ? 700 : 530;
      s.seqlen_k = 530;
      s.causal = causal;
      s.softcap = caps[i++ % 3];
      s.softmax_scale = d == 72 ? 0.5f : kDefaultSoftmaxScale;  // a large scale: the cap matters
      cases.add("softcap" + std::to_string(static_cast<int>(s.softcap)) + "_d" + std::to_string(d) +
                    (causal ? "_causal" : ""),
                s);
    }
  }
  s = CaseSpec{};
  s.head_dim = 128;
  s.heads = 4;
  s.heads_kv = 2;
  s.varlen_seqlens_q = {130, 0, 257, 1};
  s.varlen_seqlens_k = {200, 9, 0, 650};
  s.window_left = 100;
  s.softcap = 30.f;
  s.sinks = sinks_for(s.heads);
  cases.add("softcap30_varlen_local_sinks", s);

  // V with a head dim of its own (head_dim_v): the (192, 128) kernel, pairs that run zero-padded on
  // a larger kernel (V narrower or wider than Q/K), masks, GQA with head slices, varlen, sinks.
  struct DimsChoice {
    int qk, v;
  };
  const DimsChoice pairs[] = {{192, 128}, {128, 64}, {256, 128}, {72, 40}, {160, 96}, {64, 128}};
  i = 0;
  for (const DimsChoice& dims : pairs) {
    for (bool causal : {false, true}) {
      s = CaseSpec{};
      s.head_dim = dims.qk;
      s.head_dim_v = dims.v;
      s.heads = 4;
      s.heads_kv = i % 3 == 0 ? 4 : i % 3 == 1 ? 2 : 1;
      s.seqlen_q = causal ? 700 : 530;
      s.seqlen_k = 530;
      s.causal = causal;
      s.window_left = i % 4 == 3 ? 64 : -1;
      ++i;
      cases.add("hdimv_" + std::to_string(dims.qk) + "x" + std::to_string(dims.v) + (causal ? "_causal" : "") +
                    (s.window_left >= 0 ? "_local" : "") + "_kv" + std::to_string(s.heads_kv),
                s);
    }
  }
  s = CaseSpec{};
  s.head_dim = 192;
  s.head_dim_v = 128;
  s.batch = 1;
  s.heads = s.heads_kv = 2;
  s.seqlen_q = s.seqlen_k = 4224;
  cases.add("hdimv_192x128_long_4224", s);
  s.causal = true;
  cases.add("hdimv_192x128_long_4224_causal", s);
  s = CaseSpec{};
  s.head_dim = 192;
  s.head_dim_v = 128;
  s.heads = 8;
  s.heads_kv = 1;  // a group of 8 over short keys: head slices, dK/dV summed in the workspace
  s.seqlen_q = 1000;
  s.seqlen_k = 200;
  cases.add("hdimv_192x128_mqa_slices", s);
  s = CaseSpec{};
  s.head_dim = 192;
  s.head_dim_v = 128;
  s.heads = 4;
  s.heads_kv = 2;
  s.varlen_seqlens_q = {130, 0, 257, 1};
  s.varlen_seqlens_k = {200, 9, 0, 650};
  s.causal = true;
  s.sinks = sinks_for(s.heads);
  s.dtype = DType::kFloat16;
  cases.add("hdimv_192x128_varlen_causal_sinks_fp16", s);
  s.head_dim = 128;
  s.head_dim_v = 64;
  s.row_padding = 16;
  s.dtype = DType::kBFloat16;
  cases.add("hdimv_128x64_varlen_strided", s);
  return cases.take();
}

void HopperTest::SetUp() {
  const Status device = check_current_device();
  if (!device.ok()) GTEST_SKIP() << "needs an sm_90 GPU: " << device.message();
}

void expect_ok(const ErrorReport& r) {
  std::cout << "    " << r.str() << "\n";
  EXPECT_TRUE(r.ok) << r.str();
}

// Whether this build compiled a kernel that runs head_dim (and head_dim_v; 0: head_dim) in dtype
// with the softcap variant where softcap > 0 (see HOPATTN_HEADDIMS/DTYPES/SOFTCAP).
bool built_for(DType dtype, int head_dim, int head_dim_v, float softcap) {
  const BuildInfo info = build_info();
  const int value_dim = head_dim_v > 0 ? head_dim_v : head_dim;
  const bool dtype_built = std::find(info.dtypes.begin(), info.dtypes.end(), dtype) != info.dtypes.end();
  const bool dims_built = std::any_of(info.kernel_head_dims.begin(), info.kernel_head_dims.end(),
                                      [&](HeadDimPair k) { return k.qk >= head_dim && k.v >= value_dim; });
  return dtype_built && dims_built && (softcap == 0.f || info.softcap);
}

bool built_for(const CaseSpec& spec) {
  return built_for(spec.dtype, spec.head_dim, spec.head_dim_v, spec.softcap);
}

namespace {

// A workspace of `bytes` from `buffer`, which is kept for the whole run (a captured graph refers to
// it) and never freed, so that no CUDA call runs after the runtime has shut down at exit. Poisoned
// first when not capturing (stream == nullptr): whatever a previous call left there must not
// matter (the calls reset their semaphores, flags and accumulators).
Workspace poisoned_workspace(DeviceBuffer* buffer, size_t bytes, cudaStream_t stream) {
  if (buffer->bytes() < bytes) *buffer = DeviceBuffer(bytes);
  if (stream == nullptr && buffer->bytes() > 0) buffer->fill_bytes(0x7F);
  return Workspace{buffer->data(), bytes};
}

}  // namespace

Status call_forward(const AttentionCase& c, const Outputs& out, bool with_workspace) {
  const ForwardArgs args = c.forward_args(out);
  if (!with_workspace) return forward(args, nullptr);
  size_t bytes = 0;
  if (Status s = forward_workspace_size(args, &bytes); !s.ok()) return s;
  static DeviceBuffer* workspace = new DeviceBuffer();
  return forward(args, poisoned_workspace(workspace, bytes, nullptr), nullptr);
}

Status call_backward(const AttentionCase& c, const Outputs& fwd, const Outputs& grads, bool deterministic,
                     cudaStream_t stream) {
  BackwardArgs args = c.backward_args(fwd, grads);
  args.deterministic = deterministic;
  size_t bytes = 0;
  if (Status s = backward_workspace_size(args, &bytes); !s.ok()) return s;
  static DeviceBuffer* workspace = new DeviceBuffer();
  return backward(args, poisoned_workspace(workspace, bytes, stream), stream);
}

void expect_bitwise_equal(const AttentionCase& c, const Outputs& a, const Outputs& b, std::initializer_list<Field> fields) {
  for (Field f : fields) {
    const Downloaded x = c.download(a, f), y = c.download(b, f);
    EXPECT_EQ(0, std::memcmp(x.values.data(), y.values.data(), x.values.size() * sizeof(double)))
        << "field " << static_cast<int>(f);
  }
}

Status capture_and_replay(const std::function<Status(cudaStream_t)>& call, int replays) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  // A throwing call must not leave the capture open: every later CUDA call of this thread would fail.
  auto end_capture = [&] { return cudaStreamEndCapture(stream, &graph); };
  Status s;
  try {
    s = call(stream);
  } catch (...) {
    if (end_capture() == cudaSuccess) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    throw;
  }
  check_cuda(end_capture(), "end capture");
  if (s.ok()) {
    cudaGraphExec_t exec;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int i = 0; i < replays; ++i) check_cuda(cudaGraphLaunch(exec, stream), "replay");
    check_cuda(cudaStreamSynchronize(stream), "replay");
    cudaGraphExecDestroy(exec);
  }
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return s;
}

}  // namespace hopattn::testing
