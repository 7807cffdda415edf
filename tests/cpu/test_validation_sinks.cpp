// Attention sinks (ForwardArgs/KVCacheArgs::sinks, BackwardArgs::sinks and dsinks): every bad
// sinks or dsinks tensor gets an error naming it, through the public API, before anything touches
// the device. Valid arguments are checked through the internal validator, since the public call
// would go on to launch with the fake pointers used here.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"
#include "validation_args.hpp"

namespace hopattn {
namespace {

using namespace validation_args;

// GQA 8/2 (validation_args.hpp), so that a sinks tensor of heads_kv entries is a mistake the
// messages must catch.
Tensor sinks_tensor(uintptr_t slot, int64_t heads = kHeads) {
  return make_tensor(fake(slot), DType::kFloat32, {heads});
}
constexpr uintptr_t kSinksSlot = 20, kDsinksSlot = 21;

// The valid arguments of each call, with sinks (and the backward's dsinks).
template <class Args>
Args with_sinks(Args a) {
  a.sinks = sinks_tensor(kSinksSlot);
  return a;
}
ForwardArgs sinks_forward() { return with_sinks(valid_forward()); }
ForwardArgs sinks_varlen_forward() { return with_sinks(valid_varlen_forward()); }
ForwardArgs sinks_paged_forward() { return with_sinks(valid_paged_forward()); }
KVCacheArgs sinks_kvcache() { return with_sinks(valid_kvcache()); }
BackwardArgs sinks_backward() {
  BackwardArgs a = with_sinks(valid_backward());
  a.dsinks = sinks_tensor(kDsinksSlot);
  return a;
}

struct ForwardLayout {
  const char* name;
  ForwardArgs (*make)();
};
const ForwardLayout kForwardLayouts[] = {
    {"fixed-length", sinks_forward}, {"varlen", sinks_varlen_forward}, {"paged", sinks_paged_forward}};

void expect_forward_invalid(const std::function<void(ForwardArgs&)>& mutate, const std::string& fragment) {
  for (const ForwardLayout& layout : kForwardLayouts) {
    SCOPED_TRACE(layout.name);
    ForwardArgs a = layout.make();
    mutate(a);
    expect_invalid(forward(a, nullptr), fragment);
    expect_invalid(forward(a, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
    size_t bytes = 0;
    expect_invalid(forward_workspace_size(a, &bytes), fragment);  // validated before the device is asked
  }
}

void expect_kvcache_invalid(const std::function<void(KVCacheArgs&)>& mutate, const std::string& fragment) {
  KVCacheArgs a = sinks_kvcache();
  mutate(a);
  expect_invalid(forward_kvcache(a, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(forward_kvcache_workspace_size(a, &bytes), fragment);
}

void expect_backward_invalid(const std::function<void(BackwardArgs&)>& mutate, const std::string& fragment) {
  BackwardArgs a = sinks_backward();
  mutate(a);
  expect_invalid(backward(a, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(backward_workspace_size(a, &bytes), fragment);
}

struct Mistake {
  std::function<void(Tensor&)> mutate;
  std::string fragment;
};

// The mistakes a sinks or dsinks tensor (`name`, which the messages must name) can make, each with
// a fragment of its message.
std::vector<Mistake> tensor_mistakes(const std::string& name) {
  return {
      {[](Tensor& t) { t.dtype = DType::kBFloat16; }, name + ".dtype is bfloat16 but must be float32"},
      {[](Tensor& t) {
         t = make_tensor(t.data, DType::kFloat32, {1, kHeads});
       },
       name + ".rank is 2 but must be 1: (heads,)"},
      {[](Tensor& t) { t = make_tensor(t.data, DType::kFloat32, {}); }, name + ".rank is 0 but must be 1"},
      // One logit per query head, not per key/value head.
      {[](Tensor& t) { t.shape[0] = kHeadsKv; }, name + ".shape[0] is 2 but must be 8: expected (heads,) = (8)"},
      {[](Tensor& t) { t.shape[0] = kHeads + 1; }, name + ".shape[0] is 9 but must be 8"},
      {[](Tensor& t) { t.stride[0] = 2; }, name + ".stride[0] is 2"},
      {[](Tensor& t) { t.stride[0] = 0; }, name + ".stride[0] is 0"},
      {[](Tensor& t) { t.data = static_cast<char*>(t.data) + 2; }, name + ".data = "},
      {[](Tensor& t) { t.data = nullptr; }, name + ".data is null but its rank is 1"},
  };
}

TEST(SinksValidation, AcceptsValidSinksAndPassesThemOn) {
  Problem p;
  ForwardTensors t;
  for (const ForwardLayout& layout : kForwardLayouts) {
    const ForwardArgs a = layout.make();
    ASSERT_TRUE(validate_forward(a, &p, &t).ok()) << layout.name << ": " << validate_forward(a, &p, &t).message();
    EXPECT_EQ(t.sinks, a.sinks.data) << layout.name;
  }
  // Absent (the default Tensor) is no sinks.
  ForwardArgs plain = sinks_forward();
  plain.sinks = Tensor{};
  ASSERT_TRUE(validate_forward(plain, &p, &t).ok());
  EXPECT_EQ(t.sinks, nullptr);

  KVCacheCall call;
  const KVCacheArgs kv = sinks_kvcache();
  ASSERT_TRUE(validate_kvcache(kv, &call).ok()) << validate_kvcache(kv, &call).message();
  EXPECT_EQ(call.tensors.sinks, kv.sinks.data);

  BackwardTensors bt;
  const BackwardArgs b = sinks_backward();
  ASSERT_TRUE(validate_backward(b, &p, &bt).ok()) << validate_backward(b, &p, &bt).message();
  EXPECT_EQ(bt.sinks, b.sinks.data);
  EXPECT_EQ(bt.dsinks, b.dsinks.data);
  BackwardArgs none = sinks_backward();
  none.sinks = none.dsinks = Tensor{};
  ASSERT_TRUE(validate_backward(none, &p, &bt).ok());
  EXPECT_EQ(bt.sinks, nullptr);
  EXPECT_EQ(bt.dsinks, nullptr);
}

TEST(SinksValidation, OneHeadTakesAnyStride) {
  // A size-1 dimension's stride is never used.
  ForwardArgs a = sinks_forward();
  for (Tensor* x : {&a.q, &a.o}) *x = make_tensor(x->data, DType::kBFloat16, {kBatch, kSeqQ, 1, kDim});
  for (Tensor* x : {&a.k, &a.v}) *x = make_tensor(x->data, DType::kBFloat16, {kBatch, kSeqK, 1, kDim});
  a.lse = make_tensor(a.lse.data, DType::kFloat32, {kBatch, 1, kSeqQ});
  a.sinks = make_tensor(fake(kSinksSlot), DType::kFloat32, {1}, {7});
  Problem p;
  ForwardTensors t;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
}

TEST(SinksValidation, ForwardRejectsBadSinks) {
  for (const Mistake& m : tensor_mistakes("sinks")) {
    SCOPED_TRACE(m.fragment);
    expect_forward_invalid([&](ForwardArgs& a) { m.mutate(a.sinks); }, m.fragment);
  }
}

TEST(SinksValidation, KVCacheRejectsBadSinks) {
  for (const Mistake& m : tensor_mistakes("sinks")) {
    SCOPED_TRACE(m.fragment);
    expect_kvcache_invalid([&](KVCacheArgs& a) { m.mutate(a.sinks); }, m.fragment);
  }
}

TEST(SinksValidation, BackwardRejectsBadSinksAndDsinks) {
  for (const Mistake& m : tensor_mistakes("sinks")) {
    SCOPED_TRACE(m.fragment);
    expect_backward_invalid([&](BackwardArgs& a) { m.mutate(a.sinks); }, m.fragment);
  }
  for (const Mistake& m : tensor_mistakes("dsinks")) {
    SCOPED_TRACE(m.fragment);
    expect_backward_invalid([&](BackwardArgs& a) { m.mutate(a.dsinks); }, m.fragment);
  }
}

TEST(SinksValidation, BackwardNeedsDsinksExactlyWithSinks) {
  expect_backward_invalid([](BackwardArgs& a) { a.dsinks = Tensor{}; }, "dsinks is missing");
  expect_backward_invalid([](BackwardArgs& a) { a.sinks = Tensor{}; }, "dsinks is given without sinks");
}

}  // namespace
}  // namespace hopattn
