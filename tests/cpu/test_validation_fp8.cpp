// FP8 inputs (ForwardArgs with float8_e4m3 q, k, v and optional q/k/v_descale): what validation
// accepts (fixed-length and varlen, GQA, masks, sinks, softcap, descales broadcast over the batch)
// and how it resolves it (O's dtype, the descale views), and every rule it enforces, each with a
// message naming the argument and the rule: no mixed input dtypes, a 16-bit O, descales only with
// FP8 and of fp32 (batch, heads_kv), head dims multiples of 16, strides of 16 bytes; no backward
// and no page table in forward() (kNotSupported). The KV-cache call takes FP8 caches, naming what
// they do not take yet.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "api/device.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"
#include "validation_args.hpp"

namespace hopattn {
namespace {

using namespace validation_args;

constexpr DType kFp8 = DType::kFloat8E4M3;

// valid_forward() with FP8 inputs and a bf16 O, and all three descales.
ForwardArgs fp8_forward() {
  ForwardArgs a = valid_forward();
  a.q.dtype = a.k.dtype = a.v.dtype = kFp8;
  a.q_descale = make_tensor(fake(13), DType::kFloat32, {kBatch, kHeadsKv});
  a.k_descale = make_tensor(fake(14), DType::kFloat32, {kBatch, kHeadsKv});
  a.v_descale = make_tensor(fake(15), DType::kFloat32, {kBatch, kHeadsKv});
  return a;
}

ForwardArgs fp8_varlen_forward() {
  ForwardArgs a = valid_varlen_forward();  // fp16, 3 sequences
  a.q.dtype = a.k.dtype = a.v.dtype = kFp8;
  a.q_descale = make_tensor(fake(13), DType::kFloat32, {3, kHeadsKv});
  return a;
}

// The forward and its workspace query both reject `a` with the error naming `fragment`.
void expect_forward_invalid(const ForwardArgs& a, const std::string& fragment) {
  Problem p;
  ForwardTensors t;
  expect_invalid(validate_forward(a, &p, &t), fragment);
  expect_invalid(forward(a, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(forward_workspace_size(a, &bytes), fragment);
}

void expect_not_supported(const Status& s, const std::string& fragment) {
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message() << "\nexpected: " << fragment;
}

TEST(Fp8Validation, AcceptsFp8InputsAndResolvesTheOutputDtypeAndDescales) {
  Problem p;
  ForwardTensors t;
  ForwardArgs a = fp8_forward();
  ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  EXPECT_EQ(p.dtype, kFp8);
  EXPECT_EQ(p.out_dtype, DType::kBFloat16);
  EXPECT_EQ(t.q_descale.data, a.q_descale.data);
  EXPECT_EQ(t.k_descale.data, a.k_descale.data);
  EXPECT_EQ(t.v_descale.data, a.v_descale.data);
  EXPECT_EQ(t.v_descale.batch_stride, kHeadsKv);

  a.o.dtype = DType::kFloat16;
  a.q_descale = a.k_descale = a.v_descale = Tensor{};  // all optional: 1
  ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  EXPECT_EQ(p.out_dtype, DType::kFloat16);
  EXPECT_EQ(t.q_descale.data, nullptr);
  EXPECT_EQ(t.q_descale.at(1, 1), 1.0f);

  // One factor per KV head for the whole batch: a batch stride of 0.
  a.k_descale = make_tensor(fake(14), DType::kFloat32, {kBatch, kHeadsKv}, {0, 1});
  ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  EXPECT_EQ(t.k_descale.batch_stride, 0);
}

TEST(Fp8Validation, AcceptsEveryFeatureOfTheForward) {
  Problem p;
  ForwardTensors t;
  ForwardArgs a = fp8_varlen_forward();
  a.o.dtype = DType::kBFloat16;
  ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  EXPECT_EQ(p.out_dtype, DType::kBFloat16);
  a = fp8_forward();
  a.mask = Mask{true, 32, -1};
  a.softcap = 30.0f;
  a.sinks = make_tensor(fake(16), DType::kFloat32, {kHeads});
  a.num_splits = 4;
  ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  // A head dim of V's own, each a multiple of 16.
  a = fp8_forward();
  a.q = make_tensor(a.q.data, kFp8, {kBatch, kSeqQ, kHeads, 192});
  a.k = make_tensor(a.k.data, kFp8, {kBatch, kSeqK, kHeadsKv, 192});
  ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  EXPECT_EQ(p.head_dim, 192);
  EXPECT_EQ(p.head_dim_v, kDim);
}

TEST(Fp8Validation, ValidArgumentsReachTheDeviceCheck) {
  if (check_current_device().ok()) GTEST_SKIP() << "an sm_90 GPU is present; this test covers machines without one";
  size_t bytes = 0;
  for (const ForwardArgs& a : {fp8_forward(), fp8_varlen_forward()}) {
    EXPECT_EQ(forward(a, nullptr).code(), StatusCode::kDeviceUnavailable) << forward(a, nullptr).message();
    EXPECT_EQ(forward_workspace_size(a, &bytes).code(), StatusCode::kDeviceUnavailable);
  }
}

TEST(Fp8Validation, InputsShareTheFp8Dtype) {
  ForwardArgs a = fp8_forward();
  a.k.dtype = DType::kBFloat16;
  expect_forward_invalid(a, "k.dtype is bfloat16 but must be float8_e4m3 (the dtype of q)");
  a = fp8_forward();
  a.v.dtype = DType::kFloat16;
  expect_forward_invalid(a, "v.dtype is float16 but must be float8_e4m3 (the dtype of q)");
  a = valid_forward();  // bf16 q
  a.k.dtype = kFp8;
  expect_forward_invalid(a, "k.dtype is float8_e4m3 but must be bfloat16 (the dtype of q)");
}

TEST(Fp8Validation, OutputIsBfloat16OrFloat16) {
  const std::string rule = " but must be bfloat16 or float16: float8_e4m3 inputs give a 16-bit output";
  ForwardArgs a = fp8_forward();
  a.o.dtype = kFp8;
  expect_forward_invalid(a, "o.dtype is float8_e4m3" + rule);
  a.o.dtype = DType::kFloat32;
  expect_forward_invalid(a, "o.dtype is float32" + rule);
  a = valid_forward();  // 16-bit inputs write O in their own dtype
  a.o.dtype = kFp8;
  expect_forward_invalid(a, "o.dtype is float8_e4m3 but must be bfloat16 (the dtype of q)");
}

TEST(Fp8Validation, DescalesBelongToFp8InputsOnly) {
  for (const char* name : {"q_descale", "k_descale", "v_descale"}) {
    SCOPED_TRACE(name);
    for (ForwardArgs a : {valid_forward(), valid_varlen_forward(), valid_paged_forward()}) {
      const int64_t batch = a.varlen.cu_seqlens_q.data ? a.varlen.cu_seqlens_q.size - 1 : kBatch;
      const Tensor descale = make_tensor(fake(13), DType::kFloat32, {batch, kHeadsKv});
      (name[0] == 'q' ? a.q_descale : name[0] == 'k' ? a.k_descale : a.v_descale) = descale;
      expect_forward_invalid(a, std::string(name) + " is given but q.dtype is " + dtype_name(a.q.dtype) +
                                    ": descale factors belong to float8_e4m3 inputs only");
    }
  }
}

TEST(Fp8Validation, DescalesAreFloat32BatchByKvHeads) {
  struct Mistake {
    std::function<void(Tensor&)> mutate;
    std::string fragment;
  };
  const Mistake mistakes[] = {
      {[](Tensor& t) { t.dtype = DType::kBFloat16; }, ".dtype is bfloat16 but must be float32"},
      {[](Tensor& t) { t = make_tensor(t.data, DType::kFloat32, {kBatch * kHeadsKv}); },
       ".rank is 1 but must be 2: (batch, heads_kv)"},
      {[](Tensor& t) { t = make_tensor(t.data, DType::kFloat32, {kBatch, kHeads}); },
       ".shape[1] is 8 but must be 2: expected (batch, heads_kv) = (2, 2)"},
      {[](Tensor& t) { t = make_tensor(t.data, DType::kFloat32, {kBatch + 1, kHeadsKv}); },
       ".shape[0] is 3 but must be 2"},
      {[](Tensor& t) { t.stride[1] = 2; }, ".stride[1] is 2 but the last dimension must be contiguous"},
      {[](Tensor& t) { t.stride[0] = -2; }, ".stride[0] is -2 but must not be negative"},
      {[](Tensor& t) { t.data = nullptr; }, ".data is null"},
  };
  for (const char* name : {"q_descale", "k_descale", "v_descale"}) {
    for (const Mistake& m : mistakes) {
      SCOPED_TRACE(std::string(name) + m.fragment);
      ForwardArgs a = fp8_forward();
      m.mutate(name[0] == 'q' ? a.q_descale : name[0] == 'k' ? a.k_descale : a.v_descale);
      expect_forward_invalid(a, name + m.fragment);
    }
  }
  ForwardArgs a = fp8_forward();
  a.v_descale.data = static_cast<char*>(a.v_descale.data) + 2;
  Problem p;
  ForwardTensors t;
  const Status misaligned = validate_forward(a, &p, &t);
  expect_invalid(misaligned, "v_descale.data = ");
  expect_invalid(misaligned, " is not 4-byte aligned");
  // A batch of none has no factors to point at: given, empty and without data.
  a = fp8_forward();
  a.q = make_tensor(a.q.data, kFp8, {0, kSeqQ, kHeads, kDim});
  a.k = make_tensor(a.k.data, kFp8, {0, kSeqK, kHeadsKv, kDim});
  a.v = make_tensor(a.v.data, kFp8, {0, kSeqK, kHeadsKv, kDim});
  a.o = make_tensor(a.o.data, DType::kBFloat16, {0, kSeqQ, kHeads, kDim});
  a.lse = make_tensor(a.lse.data, DType::kFloat32, {0, kHeads, kSeqQ});
  a.q_descale = make_tensor(nullptr, DType::kFloat32, {0, kHeadsKv});
  a.k_descale = a.v_descale = Tensor{};
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  // Varlen: one row per sequence.
  a = fp8_varlen_forward();
  a.q_descale = make_tensor(fake(13), DType::kFloat32, {100, kHeadsKv});
  expect_forward_invalid(a, "q_descale.shape[0] is 100 but must be 3: expected (batch, heads_kv) = (3, 2)");
}

TEST(Fp8Validation, HeadDimsAreMultiplesOf16) {
  ForwardArgs a = fp8_forward();
  a.q = make_tensor(a.q.data, kFp8, {kBatch, kSeqQ, kHeads, 40});
  a.k = make_tensor(a.k.data, kFp8, {kBatch, kSeqK, kHeadsKv, 40});
  expect_forward_invalid(a, "head_dim (q.shape[3]) is 40 but must be a multiple of 16 in [16, 256] for float8_e4m3 "
                            "inputs");
  a = fp8_forward();
  a.v = make_tensor(a.v.data, kFp8, {kBatch, kSeqK, kHeadsKv, 72});
  a.o = make_tensor(a.o.data, DType::kBFloat16, {kBatch, kSeqQ, kHeads, 72});
  expect_forward_invalid(a, "v.shape[3] (head_dim_v) is 72 but must be a multiple of 16 in [16, 256] for "
                            "float8_e4m3 inputs");
}

TEST(Fp8Validation, StridesAreWhole16ByteRows) {
  ForwardArgs a = fp8_forward();
  // Rows of 8 heads x 128 plus 8 elements: 8 bytes of padding, not a multiple of 16.
  a.q = make_tensor(a.q.data, kFp8, {kBatch, kSeqQ, kHeads, kDim},
                    {kSeqQ * (kHeads * kDim + 8), kHeads * kDim + 8, kDim, 1});
  expect_forward_invalid(a, "q.stride[1] is 1032 but must be a multiple of 16 elements (16 bytes)");
  a.q.stride[0] = kSeqQ * (kHeads * kDim + 16);
  a.q.stride[1] = kHeads * kDim + 16;
  Problem p;
  ForwardTensors t;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  a.k.data = static_cast<char*>(a.k.data) + 8;
  expect_forward_invalid(a, "k.data = ");
}

TEST(Fp8Validation, BackwardIsNotSupported) {
  BackwardArgs b = valid_backward();
  b.q.dtype = b.k.dtype = b.v.dtype = kFp8;
  const std::string fragment = "q.dtype is float8_e4m3, which has a forward only";
  expect_not_supported(backward(b, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
  size_t bytes = 0;
  expect_not_supported(backward_workspace_size(b, &bytes), fragment);
  Problem p;
  BackwardTensors t;
  expect_not_supported(validate_backward(b, &p, &t), fragment);
}

// An FP8 KV cache: q, k_cache and v_cache (and k_new, v_new) in e4m3, o bfloat16, descales
// (batch, heads_kv) as forward() takes them.
KVCacheArgs fp8_kvcache() {
  KVCacheArgs kv = valid_kvcache();
  kv.q.dtype = kv.k_cache.dtype = kv.v_cache.dtype = kFp8;
  return kv;
}

TEST(Fp8Validation, KVCacheCallTakesFp8Caches) {
  KVCacheArgs kv = fp8_kvcache();
  kv.q_descale = make_tensor(fake(30), DType::kFloat32, {kBatch, kHeadsKv});
  kv.v_descale = make_tensor(fake(31), DType::kFloat32, {kBatch, kHeadsKv});
  KVCacheCall call;
  ASSERT_TRUE(validate_kvcache(kv, &call).ok()) << validate_kvcache(kv, &call).message();
  EXPECT_EQ(call.problem.dtype, kFp8);
  EXPECT_EQ(call.problem.out_dtype, DType::kBFloat16);
  EXPECT_EQ(call.tensors.q_descale.data, fake(30));
  EXPECT_EQ(call.tensors.k_descale.data, nullptr);
  EXPECT_EQ(call.tensors.v_descale.data, fake(31));
  // Appended FP8 keys and values, and pages of whole 128-key blocks.
  kv.k_new = make_tensor(fake(32), kFp8, {kBatch, 3, kHeadsKv, kDim});
  kv.v_new = make_tensor(fake(33), kFp8, {kBatch, 3, kHeadsKv, kDim});
  kv.k_cache = make_tensor(fake(2), kFp8, {8, 256, kHeadsKv, kDim});
  kv.v_cache = make_tensor(fake(3), kFp8, {8, 256, kHeadsKv, kDim});
  kv.page_table = PageTable{static_cast<const int32_t*>(fake(7)), kBatch, 4, 0};
  EXPECT_TRUE(validate_kvcache(kv, &call).ok()) << validate_kvcache(kv, &call).message();
  EXPECT_EQ(call.append.dtype, kFp8);
}

TEST(Fp8Validation, KVCacheCallNamesWhatFp8CachesDoNotTakeYet) {
  KVCacheCall call;
  auto expect = [&](const std::function<void(KVCacheArgs&)>& mutate, StatusCode code, const std::string& fragment) {
    KVCacheArgs kv = fp8_kvcache();
    mutate(kv);
    const Status s = validate_kvcache(kv, &call);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message() << "\nexpected: " << fragment;
  };
  expect([](KVCacheArgs& kv) { kv.k_cache.dtype = DType::kBFloat16; }, StatusCode::kInvalidArgument, "k_cache.dtype");
  expect([](KVCacheArgs& kv) { kv.o.dtype = DType::kFloat16; }, StatusCode::kNotSupported,
         "o.dtype float16 with a float8_e4m3 cache is not supported yet");
  expect([](KVCacheArgs& kv) { kv.o.dtype = kFp8; }, StatusCode::kInvalidArgument, "o.dtype is float8_e4m3");
  expect([](KVCacheArgs& kv) { kv.softcap = 30.f; }, StatusCode::kNotSupported, "softcap with a float8_e4m3 cache");
  expect([](KVCacheArgs& kv) { kv.cache_leftpad = fake_ints(34, kBatch); }, StatusCode::kNotSupported,
         "cache_leftpad with a float8_e4m3 cache");
  expect(
      [](KVCacheArgs& kv) {
        kv.k_cache = make_tensor(fake(2), kFp8, {64, 16, kHeadsKv, kDim});
        kv.v_cache = make_tensor(fake(3), kFp8, {64, 16, kHeadsKv, kDim});
        kv.page_table = PageTable{static_cast<const int32_t*>(fake(7)), kBatch, 16, 0};
      },
      StatusCode::kNotSupported, "page_size 16 with a float8_e4m3 cache is not supported yet");
  expect(
      [](KVCacheArgs& kv) {
        kv.k_new = make_tensor(fake(32), kFp8, {kBatch, 1, kHeadsKv, kDim});
        kv.v_new = make_tensor(fake(33), kFp8, {kBatch, 1, kHeadsKv, kDim});
        kv.rotary.cos = make_tensor(fake(35), kFp8, {1024, 32});
        kv.rotary.sin = make_tensor(fake(36), kFp8, {1024, 32});
      },
      StatusCode::kNotSupported, "rotary embedding with a float8_e4m3 cache");
  expect([](KVCacheArgs& kv) { kv.k_descale = make_tensor(fake(30), DType::kFloat32, {kHeadsKv}); },
         StatusCode::kInvalidArgument, "k_descale");
  // Descales belong to FP8 caches only.
  KVCacheArgs bf16 = valid_kvcache();
  bf16.k_descale = make_tensor(fake(30), DType::kFloat32, {kBatch, kHeadsKv});
  expect_invalid(validate_kvcache(bf16, &call), "k_descale is given but q.dtype is bfloat16");
}

TEST(Fp8Validation, PagedForwardIsNotSupportedYet) {
  size_t bytes = 0;
  ForwardArgs a = valid_paged_forward();
  a.q.dtype = a.k.dtype = a.v.dtype = kFp8;
  expect_not_supported(forward(a, nullptr), "float8_e4m3 inputs with page_table are not supported yet");
  expect_not_supported(forward_workspace_size(a, &bytes), "float8_e4m3 inputs with page_table");
}

}  // namespace
}  // namespace hopattn
