// Every bad input gets a clear error naming the argument and the rule, through the public API,
// before anything touches the device. Valid inputs are checked through the internal validator,
// since the public call would go on to launch with the fake pointers used here.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "api/device.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"
#include "validation_args.hpp"

namespace hopattn {
namespace {

using namespace validation_args;  // fake pointers, shapes, valid_forward(), valid_backward()

// Varlen: 3 sequences packed into 100 query and 150 key tokens.
ForwardArgs valid_varlen_forward() {
  ForwardArgs a;
  a.q = make_tensor(fake(1), DType::kFloat16, {100, kHeads, kDim});
  a.k = make_tensor(fake(2), DType::kFloat16, {150, kHeadsKv, kDim});
  a.v = make_tensor(fake(3), DType::kFloat16, {150, kHeadsKv, kDim});
  a.o = make_tensor(fake(4), DType::kFloat16, {100, kHeads, kDim});
  a.lse = make_tensor(fake(5), DType::kFloat32, {kHeads, 100});
  a.varlen.cu_seqlens_q = IntArray{static_cast<const int32_t*>(fake(10)), 4};
  a.varlen.cu_seqlens_k = IntArray{static_cast<const int32_t*>(fake(11)), 4};
  a.varlen.max_seqlen_q = 60;
  a.varlen.max_seqlen_k = 80;
  return a;
}

void expect_invalid(const Status& s, const std::string& fragment) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message() << "\nexpected: " << fragment;
}

void expect_forward_invalid(const std::function<void(ForwardArgs&)>& mutate, const std::string& fragment,
                            ForwardArgs (*make)() = valid_forward) {
  ForwardArgs a = make();
  mutate(a);
  expect_invalid(forward(a, nullptr), fragment);
  expect_invalid(forward(a, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(forward_workspace_size(a, &bytes), fragment);  // validated before the device is asked
}

void expect_backward_invalid(const std::function<void(BackwardArgs&)>& mutate, const std::string& fragment) {
  BackwardArgs a = valid_backward();
  mutate(a);
  expect_invalid(backward(a, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(backward_workspace_size(a, &bytes), fragment);
}

TEST(Validation, AcceptsValidArgumentsAndResolvesTheProblem) {
  Problem p;
  ForwardTensors t;
  ASSERT_TRUE(validate_forward(valid_forward(), &p, &t).ok());
  EXPECT_EQ(p.batch, kBatch);
  EXPECT_EQ(p.heads, kHeads);
  EXPECT_EQ(p.heads_kv, kHeadsKv);
  EXPECT_EQ(p.head_dim, kDim);
  EXPECT_EQ(p.max_seqlen_q, kSeqQ);
  EXPECT_EQ(p.max_seqlen_k, kSeqK);
  EXPECT_FLOAT_EQ(p.softmax_scale, 1.0f / std::sqrt(float(kDim)));
  EXPECT_EQ(t.q.row_stride, kHeads * kDim);
  EXPECT_EQ(t.lse.head_stride, kSeqQ);

  BackwardTensors bt;
  EXPECT_TRUE(validate_backward(valid_backward(), &p, &bt).ok());

  ForwardArgs v = valid_varlen_forward();
  ASSERT_TRUE(validate_forward(v, &p, &t).ok());
  EXPECT_EQ(p.batch, 3);
  EXPECT_TRUE(p.varlen());
  EXPECT_EQ(t.q.batch_stride, 0);
  EXPECT_EQ(t.lse.row_stride, 1);
}

TEST(Validation, CausalWithLeftWindowIsLocalAndCausalRightMinusOneIsCausal) {
  Problem p;
  ForwardTensors t;
  ForwardArgs a = valid_forward();
  a.mask = Mask{true, 32, -1};
  ASSERT_TRUE(validate_forward(a, &p, &t).ok());
  EXPECT_EQ(p.mask.left, 32);
  EXPECT_EQ(p.mask.right, 0);
  a.mask = Mask{true, -1, 0};
  ASSERT_TRUE(validate_forward(a, &p, &t).ok());
  EXPECT_EQ(p.mask.right, 0);
}

// Bounds that hide nothing are dropped, so that such problems run the unmasked kernels: causal with
// one query row, windows at least as wide as the sequences (max lengths in varlen mode).
TEST(Validation, BoundsThatHideNothingAreDropped) {
  Problem p;
  ForwardTensors t;
  ForwardArgs a = valid_forward();
  a.mask = Mask{false, kSeqK - 1, kSeqQ - 1};
  ASSERT_TRUE(validate_forward(a, &p, &t).ok());
  EXPECT_TRUE(p.mask.unbounded());
  a.mask = Mask{false, kSeqK - 2, kSeqQ - 2};
  ASSERT_TRUE(validate_forward(a, &p, &t).ok());
  EXPECT_EQ(p.mask.left, kSeqK - 2);
  EXPECT_EQ(p.mask.right, kSeqQ - 2);
  a.mask = Mask{true, 2147483647, -1};
  ASSERT_TRUE(validate_forward(a, &p, &t).ok());
  EXPECT_EQ(p.mask.left, -1);
  EXPECT_EQ(p.mask.right, 0);

  ForwardArgs decode = valid_forward();
  decode.q.shape[1] = decode.o.shape[1] = decode.lse.shape[2] = 1;
  decode.mask = Mask{true, -1, -1};
  ASSERT_TRUE(validate_forward(decode, &p, &t).ok());
  EXPECT_TRUE(p.mask.unbounded());

  ForwardArgs varlen = valid_varlen_forward();
  varlen.mask = Mask{false, varlen.varlen.max_seqlen_k - 1, -1};
  ASSERT_TRUE(validate_forward(varlen, &p, &t).ok());
  EXPECT_TRUE(p.mask.unbounded());
}

TEST(Validation, NullPointers) {
  expect_forward_invalid([](ForwardArgs& a) { a.q.data = nullptr; }, "q.data is null");
  expect_forward_invalid([](ForwardArgs& a) { a.k.data = nullptr; }, "k.data is null");
  expect_forward_invalid([](ForwardArgs& a) { a.v.data = nullptr; }, "v.data is null");
  expect_forward_invalid([](ForwardArgs& a) { a.o.data = nullptr; }, "o.data is null");
  expect_backward_invalid([](BackwardArgs& a) { a.lse.data = nullptr; }, "lse.data is null");
  expect_backward_invalid([](BackwardArgs& a) { a.dout.data = nullptr; }, "dout.data is null");
  expect_backward_invalid([](BackwardArgs& a) { a.dq.data = nullptr; }, "dq.data is null");
  expect_backward_invalid([](BackwardArgs& a) { a.dk.data = nullptr; }, "dk.data is null");
  expect_backward_invalid([](BackwardArgs& a) { a.dv.data = nullptr; }, "dv.data is null");
}

TEST(Validation, MisalignedPointers) {
  auto shift = [](Tensor& t, int bytes) { t.data = static_cast<char*>(t.data) + bytes; };
  expect_forward_invalid([&](ForwardArgs& a) { shift(a.q, 2); }, "q.data = ");
  expect_forward_invalid([&](ForwardArgs& a) { shift(a.v, 8); }, "is not 16-byte aligned");
  expect_backward_invalid([&](BackwardArgs& a) { shift(a.dk, 4); }, "dk.data");
  expect_forward_invalid([&](ForwardArgs& a) { shift(a.lse, 2); }, "is not 4-byte aligned");
}

TEST(Validation, Strides) {
  expect_forward_invalid([](ForwardArgs& a) { a.q.stride[1] = kHeads * kDim + 4; },
                         "q.stride[1] is 1028 but must be a multiple of 8");
  expect_forward_invalid([](ForwardArgs& a) { a.k.stride[3] = 2; },
                         "k.stride[3] is 2 but the last dimension must be contiguous");
  expect_backward_invalid([](BackwardArgs& a) { a.dout.stride[2] = 12; }, "dout.stride[2] is 12");
  expect_forward_invalid([](ForwardArgs& a) { a.o.stride[0] = -8; }, "o.stride[0] is -8 but must not be negative");
  expect_forward_invalid([](ForwardArgs& a) { a.lse.stride[2] = 2; }, "lse.stride[2] is 2");
  // A stride of a size-1 dimension is never used, so anything goes there.
  ForwardArgs a = valid_forward();
  a.q = make_tensor(fake(1), DType::kBFloat16, {kBatch, kSeqQ, 1, kDim}, {kSeqQ * kDim, kDim, 3, 1});
  a.o = a.q;
  a.o.data = fake(4);
  a.k.shape[2] = a.v.shape[2] = 1;
  a.lse = make_tensor(fake(5), DType::kFloat32, {kBatch, 1, kSeqQ});
  Problem p;
  ForwardTensors t;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
}

TEST(Validation, OutputsMustNotOverlapThemselves) {
  // Rows 8 elements apart while each row holds heads * head_dim = 1024 elements.
  expect_forward_invalid([](ForwardArgs& a) { a.o.stride[1] = 8; }, "o.stride[1] is 8, so o overlaps itself");
  expect_backward_invalid([](BackwardArgs& a) { a.dk.stride[0] = 0; }, "dk.stride[0] is 0, so dk overlaps itself");
  expect_forward_invalid([](ForwardArgs& a) { a.lse.stride[1] = 1; }, "lse overlaps itself");
  // Inputs may share memory (a broadcast K, say); heads-major layouts are fine for outputs.
  Problem p;
  ForwardTensors t;
  ForwardArgs a = valid_forward();
  a.k.stride[0] = 0;
  a.v.stride[0] = 0;
  a.o = make_tensor(fake(4), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim},
                    {kHeads * kSeqQ * kDim, kDim, kSeqQ * kDim, 1});
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
}

TEST(Validation, StridesMustStayBelowTheTmaLimit) {
  constexpr int64_t k2To39 = int64_t{1} << 39;  // elements of 2 bytes: exactly 2^40 bytes
  expect_forward_invalid([](ForwardArgs& a) { a.q.stride[0] = k2To39; },
                         "q.stride[0] is 549755813888 elements (1099511627776 bytes) but must be below 2^40 bytes "
                         "(a TMA limit)");
  expect_forward_invalid([](ForwardArgs& a) { a.k.stride[2] = k2To39; }, "k.stride[2] is 549755813888 elements");
  // The byte count of a stride near INT64_MAX does not fit in int64; the message still gives it.
  expect_backward_invalid([](BackwardArgs& a) { a.dv.stride[1] = INT64_MAX - 7; },
                          "dv.stride[1] is 9223372036854775800 elements (18446744073709551600 bytes) but must be "
                          "below 2^40 bytes (a TMA limit)");
  expect_backward_invalid([](BackwardArgs& a) { a.dout.stride[0] = k2To39 + 8; }, "dout.stride[0] is 549755813896");
  expect_forward_invalid([](ForwardArgs& a) { a.q.stride[0] = k2To39; }, "q.stride[0] is 549755813888 elements",
                         valid_varlen_forward);

  // 16 bytes below the limit is fine; LSE is not loaded through TMA, so its strides are not limited.
  Problem p;
  ForwardTensors t;
  ForwardArgs a = valid_forward();
  a.q.stride[0] = a.k.stride[0] = a.v.stride[0] = k2To39 - 8;
  a.lse.stride[0] = int64_t{1} << 41;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
}

TEST(Validation, LargestOffsetsMustFitInInt64) {
  // An input (inputs may share memory, but must still be addressable): 2^25 rows of 2^39 - 8
  // elements each reach about 2^64 elements. Every stride is below the TMA limit on its own.
  constexpr int64_t kRows = int64_t{1} << 25, kRowStride = (int64_t{1} << 39) - 8;
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.q = make_tensor(fake(1), DType::kBFloat16, {1, kRows, kHeads, kDim},
                          {kRows * kHeads * kDim, kRowStride, kDim, 1});
        a.o = make_tensor(fake(4), DType::kBFloat16, {1, kRows, kHeads, kDim});
        a.lse = make_tensor(fake(5), DType::kFloat32, {1, kHeads, kRows});
        a.k.shape[0] = a.v.shape[0] = 1;
      },
      "q.stride = (34359738368, 549755813880, 128, 1) with q.shape = (1, 33554432, 8, 128): the largest element "
      "offset, the sum of stride[d] * (shape[d] - 1), overflows int64; it must fit in int64");
  // The sum overflows though every term fits (an output here, and an input of the backward).
  expect_forward_invalid([](ForwardArgs& a) { a.lse.stride[0] = INT64_MAX; },
                         "lse.stride = (9223372036854775807, 64, 1) with lse.shape = (2, 8, 64): the largest element "
                         "offset");
  expect_backward_invalid([](BackwardArgs& a) { a.lse.stride[0] = INT64_MAX; }, "overflows int64");
  // The elements fit but the bytes do not: 2^62 + 511 float32 elements.
  expect_forward_invalid([](ForwardArgs& a) { a.lse.stride[0] = int64_t{1} << 62; },
                         "lse.stride = (4611686018427387904, 64, 1) with lse.shape = (2, 8, 64): the largest element "
                         "offset is 4611686018427388415, and its byte offset 4611686018427388415 * 4 overflows int64; "
                         "it must fit in int64");

  // The largest byte offset exactly at the limit (INT64_MAX - 3 bytes) is accepted; one element more is not.
  const int64_t lse_limit = INT64_MAX / 4 - (7 * 64 + 63);
  Problem p;
  ForwardTensors t;
  ForwardArgs a = valid_forward();
  a.lse.stride[0] = lse_limit;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
  a.lse.stride[0] = lse_limit + 1;
  expect_invalid(validate_forward(a, &p, &t), "lse.stride = (");
  // A size-1 dimension adds nothing to the largest offset, whatever its stride.
  a = valid_forward();
  a.lse = make_tensor(fake(5), DType::kFloat32, {1, kHeads, kSeqQ}, {INT64_MAX, kSeqQ, 1});
  for (Tensor* x : {&a.q, &a.k, &a.v, &a.o}) x->shape[0] = 1;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
}

TEST(Validation, DTypes) {
  expect_forward_invalid([](ForwardArgs& a) { a.k.dtype = DType::kFloat16; },
                         "k.dtype is float16 but must be bfloat16");
  expect_forward_invalid([](ForwardArgs& a) { a.q.dtype = a.k.dtype = a.v.dtype = a.o.dtype = DType::kFloat32; },
                         "q.dtype is float32 but must be float16 or bfloat16");
  expect_forward_invalid([](ForwardArgs& a) { a.lse.dtype = DType::kBFloat16; },
                         "lse.dtype is bfloat16 but must be float32");
  expect_backward_invalid([](BackwardArgs& a) { a.dv.dtype = DType::kFloat16; }, "dv.dtype is float16");
  expect_forward_invalid([](ForwardArgs& a) { a.q.dtype = static_cast<DType>(7); }, "q.dtype is unknown dtype");
}

TEST(Validation, HeadDim) {
  auto set_dim = [](ForwardArgs& a, int d) {
    for (Tensor* t : {&a.q, &a.k, &a.v, &a.o}) {
      t->shape[3] = d;
      t->stride[2] = d;
      t->stride[1] = int64_t{d} * t->shape[2];
      t->stride[0] = t->stride[1] * t->shape[1];
    }
  };
  expect_forward_invalid([&](ForwardArgs& a) { set_dim(a, 12); },
                         "head_dim (q.shape[3]) is 12 but must be a multiple of 8");
  expect_forward_invalid([&](ForwardArgs& a) { set_dim(a, 264); }, "is 264 but must be a multiple of 8 in [8, 256]");
  expect_forward_invalid([&](ForwardArgs& a) { set_dim(a, 0); }, "is 0 but must be");
  expect_forward_invalid([](ForwardArgs& a) { a.k.shape[3] = a.v.shape[3] = 64; }, "k.shape[3] is 64 but must be 128");
}

// V has a head dim of its own (DeepSeek-style 192 for Q/K, 128 for V): V, O, dO and dV carry it,
// Q, K, dQ and dK keep head_dim, and the default scale stays 1/sqrt(head_dim).
constexpr int kDimV = 64;

ForwardArgs forward_with_dim_v(int dim_v) {
  ForwardArgs a = valid_forward();
  a.v = make_tensor(fake(3), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, dim_v});
  a.o = make_tensor(fake(4), DType::kBFloat16, {kBatch, kSeqQ, kHeads, dim_v});
  return a;
}

BackwardArgs backward_with_dim_v(int dim_v) {
  const ForwardArgs f = forward_with_dim_v(dim_v);
  BackwardArgs a = valid_backward();
  a.v = f.v;
  a.o = f.o;
  a.dout = make_tensor(fake(6), DType::kBFloat16, {kBatch, kSeqQ, kHeads, dim_v});
  a.dv = make_tensor(fake(9), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, dim_v});
  return a;
}

TEST(Validation, HeadDimVIsVsLastDimension) {
  Problem p;
  ForwardTensors t;
  ASSERT_TRUE(validate_forward(valid_forward(), &p, &t).ok());
  EXPECT_EQ(p.head_dim_v, kDim);            // set also where it equals head_dim
  for (int dim_v : {8, kDimV, 192, 256}) {  // narrower and wider than head_dim
    ASSERT_TRUE(validate_forward(forward_with_dim_v(dim_v), &p, &t).ok())
        << validate_forward(forward_with_dim_v(dim_v), &p, &t).message();
    EXPECT_EQ(p.head_dim, kDim);
    EXPECT_EQ(p.head_dim_v, dim_v);
    EXPECT_FLOAT_EQ(p.softmax_scale, 1.0f / std::sqrt(float(kDim)));
    EXPECT_EQ(t.v.row_stride, kHeadsKv * dim_v);
    EXPECT_EQ(t.o.row_stride, kHeads * dim_v);
    BackwardTensors bt;
    ASSERT_TRUE(validate_backward(backward_with_dim_v(dim_v), &p, &bt).ok())
        << validate_backward(backward_with_dim_v(dim_v), &p, &bt).message();
    EXPECT_EQ(p.head_dim_v, dim_v);
    EXPECT_EQ(bt.dout.row_stride, kHeads * dim_v);
    EXPECT_EQ(bt.dv.row_stride, kHeadsKv * dim_v);
  }
  ForwardArgs varlen = valid_varlen_forward();
  varlen.v = make_tensor(fake(3), DType::kFloat16, {150, kHeadsKv, kDimV});
  varlen.o = make_tensor(fake(4), DType::kFloat16, {100, kHeads, kDimV});
  ASSERT_TRUE(validate_forward(varlen, &p, &t).ok()) << validate_forward(varlen, &p, &t).message();
  EXPECT_EQ(p.head_dim_v, kDimV);
}

TEST(Validation, HeadDimVFollowsTheHeadDimRule) {
  auto with_dim_v = [](int dim_v) { return [dim_v](ForwardArgs& a) { a = forward_with_dim_v(dim_v); }; };
  expect_forward_invalid(with_dim_v(100), "v.shape[3] (head_dim_v) is 100 but must be a multiple of 8 in [8, 256]");
  expect_forward_invalid(with_dim_v(264), "v.shape[3] (head_dim_v) is 264 but must be a multiple of 8 in [8, 256]");
  expect_forward_invalid(with_dim_v(0), "v.shape[3] (head_dim_v) is 0 but must be");
  expect_forward_invalid([](ForwardArgs& a) { a.v.shape[3] = -8; }, "v.shape[3] (head_dim_v) is -8 but must be");
  expect_backward_invalid([](BackwardArgs& a) { a = backward_with_dim_v(12); }, "v.shape[3] (head_dim_v) is 12");
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.v = make_tensor(fake(3), DType::kFloat16, {150, kHeadsKv, 20});
      },
      "v.shape[2] (head_dim_v) is 20 but must be a multiple of 8", valid_varlen_forward);
  // q's head_dim is checked first; v's rank names head_dim_v.
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a = forward_with_dim_v(100);
        a.q.shape[3] = 12;
      },
      "head_dim (q.shape[3]) is 12");
  expect_forward_invalid([](ForwardArgs& a) { a.v.rank = 3; },
                         "v.rank is 3 but must be 4: (batch, seqlen_k, heads_kv, head_dim_v)");
}

TEST(Validation, OutputsAndGradientsTakeTheirHeadDim) {
  // O, dO and dV have V's head dim, dQ and dK Q/K's: each mismatch names the tensor and the dims.
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a = forward_with_dim_v(kDimV);
        a.o = valid_forward().o;
      },
      "o.shape[3] is 128 but must be 64: expected (batch, seqlen_q, heads, head_dim_v) = (2, 64, 8, 64)");
  expect_forward_invalid([](ForwardArgs& a) { a.o = forward_with_dim_v(kDimV).o; }, "o.shape[3] is 64 but must be 128");
  expect_backward_invalid(
      [](BackwardArgs& a) {
        a = backward_with_dim_v(kDimV);
        a.dout = valid_backward().dout;
      },
      "dout.shape[3] is 128 but must be 64: expected (batch, seqlen_q, heads, head_dim_v)");
  expect_backward_invalid(
      [](BackwardArgs& a) {
        a = backward_with_dim_v(kDimV);
        a.dv = valid_backward().dv;
      },
      "dv.shape[3] is 128 but must be 64: expected (batch, seqlen_k, heads_kv, head_dim_v)");
  expect_backward_invalid(
      [](BackwardArgs& a) {
        a = backward_with_dim_v(kDimV);
        a.dq = make_tensor(fake(7), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDimV});
      },
      "dq.shape[3] is 64 but must be 128: expected (batch, seqlen_q, heads, head_dim)");
  expect_backward_invalid(
      [](BackwardArgs& a) {
        a = backward_with_dim_v(kDimV);
        a.dk = make_tensor(fake(8), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, kDimV});
      },
      "dk.shape[3] is 64 but must be 128: expected (batch, seqlen_k, heads_kv, head_dim)");
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.v = make_tensor(fake(3), DType::kFloat16, {150, kHeadsKv, kDimV});
      },
      "o.shape[2] is 128 but must be 64: expected (total_q, heads, head_dim_v)", valid_varlen_forward);
}

TEST(Validation, Heads) {
  expect_forward_invalid([](ForwardArgs& a) { a.k.shape[2] = a.v.shape[2] = 3; },
                         "heads (8) must be a multiple of heads_kv (3)");
  expect_forward_invalid([](ForwardArgs& a) { a.k.shape[2] = a.v.shape[2] = 0; }, "heads_kv (k.shape[2]) is 0");
  expect_forward_invalid([](ForwardArgs& a) { a.v.shape[2] = 4; }, "v.shape[2] is 4 but must be 2");
}

TEST(Validation, NegativeAndMismatchedSizes) {
  expect_forward_invalid([](ForwardArgs& a) { a.q.shape[1] = -5; },
                         "q.shape[1] (seqlen_q) is -5 but must not be negative");
  expect_forward_invalid([](ForwardArgs& a) { a.k.shape[0] = -1; }, "k.shape[0] (batch) is -1");
  expect_forward_invalid([](ForwardArgs& a) { a.k.shape[0] = a.v.shape[0] = 3; },
                         "k.shape[0] (batch) is 3 but must equal");
  expect_forward_invalid([](ForwardArgs& a) { a.o.shape[1] = 65; }, "o.shape[1] is 65 but must be 64");
  expect_forward_invalid([](ForwardArgs& a) { a.lse.shape[2] = 63; }, "lse.shape[2] is 63 but must be 64");
  expect_forward_invalid([](ForwardArgs& a) { a.q.rank = 3; }, "q.rank is 3 but must be 4");
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.q = make_tensor(fake(1), DType::kBFloat16, {1, kBatch, kSeqQ, kHeads, kDim});
      },
      "q.rank is 5 but must be 4");
}

TEST(Validation, MaskAndScale) {
  expect_forward_invalid([](ForwardArgs& a) { a.mask.window_left = -2; }, "mask.window_left is -2 but must be >= -1");
  expect_forward_invalid([](ForwardArgs& a) { a.mask.window_right = -7; }, "mask.window_right is -7");
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.mask = Mask{true, -1, 4};
      },
      "mask.causal is set with mask.window_right = 4");
  expect_forward_invalid([](ForwardArgs& a) { a.softmax_scale = NAN; }, "softmax_scale is nan but must be finite");
  expect_forward_invalid([](ForwardArgs& a) { a.softmax_scale = INFINITY; }, "softmax_scale is inf");
}

TEST(Validation, ForwardLayoutOptions) {
  expect_forward_invalid([](ForwardArgs& a) { a.num_splits = -1; }, "num_splits is -1 but must be >= 0");
  expect_forward_invalid([](ForwardArgs& a) { a.pack_gqa = static_cast<PackGqa>(7); },
                         "pack_gqa is 7 but must be -1 (auto), 0 (off) or 1 (on)");
  ForwardArgs a = valid_forward();
  a.num_splits = 5;
  a.pack_gqa = PackGqa::kOn;
  Problem p;
  ForwardTensors t;
  ASSERT_TRUE(validate_forward(a, &p, &t).ok());
  EXPECT_EQ(p.num_splits, 5);
  EXPECT_EQ(p.pack_gqa, PackGqa::kOn);
}

TEST(Validation, Varlen) {
  auto varlen = valid_varlen_forward;
  expect_forward_invalid([](ForwardArgs& a) { a.varlen.cu_seqlens_k = {}; },
                         "varlen.cu_seqlens_k is missing: varlen mode needs both", varlen);
  expect_forward_invalid([](ForwardArgs& a) { a.varlen.cu_seqlens_q = {}; }, "varlen.cu_seqlens_q is missing", varlen);
  expect_forward_invalid([](ForwardArgs& a) { a.varlen.cu_seqlens_k.size = 5; },
                         "varlen.cu_seqlens_k.size is 5 but must be 4", varlen);
  expect_forward_invalid([](ForwardArgs& a) { a.varlen.cu_seqlens_q.size = 0; },
                         "varlen.cu_seqlens_q.size is 0 but must be batch + 1 >= 1", varlen);
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.varlen.seqused_k = IntArray{static_cast<const int32_t*>(fake(12)), 4};
      },
      "varlen.seqused_k.size is 4 but must be 3", varlen);
  expect_forward_invalid([](ForwardArgs& a) { a.varlen.max_seqlen_q = -1; }, "varlen.max_seqlen_q is -1", varlen);
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.varlen.cu_seqlens_q.data = static_cast<const int32_t*>(static_cast<void*>(static_cast<char*>(fake(10)) + 2));
      },
      "varlen.cu_seqlens_q.data", varlen);
  // seqused needs varlen.
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.varlen.seqused_q = IntArray{static_cast<const int32_t*>(fake(12)), kBatch};
      },
      "varlen.seqused_q is given without varlen.cu_seqlens_q/cu_seqlens_k");
  // Varlen tensors are (tokens, heads, head_dim).
  expect_forward_invalid([](ForwardArgs& a) { a.q = valid_forward().q; }, "q.rank is 4 but must be 3", varlen);
  expect_forward_invalid(
      [](ForwardArgs& a) {
        a.lse = make_tensor(fake(5), DType::kFloat32, {100, kHeads});
      },
      "lse.shape[0] is 100 but must be 8", varlen);
}

TEST(Validation, Workspace) {
  BackwardArgs a = valid_backward();
  expect_invalid(backward_workspace_size(a, nullptr), "bytes is null");
  expect_invalid(forward_workspace_size(valid_forward(), nullptr), "bytes is null");
  // The backward kernel's workspace: a build without a bf16 d128 kernel runs this problem on the
  // simple kernel, which needs none (HOPATTN_HEADDIMS / HOPATTN_DTYPES select the kernels).
  const BuildInfo info = build_info();
  if (std::find(info.head_dims.begin(), info.head_dims.end(), kDim) == info.head_dims.end() ||
      std::find(info.dtypes.begin(), info.dtypes.end(), DType::kBFloat16) == info.dtypes.end()) {
    GTEST_SKIP() << "this build has no bf16 d" << kDim << " backward kernel";
  }
  size_t bytes = 0;
  ASSERT_TRUE(backward_workspace_size(a, &bytes).ok());
  EXPECT_GT(bytes, 0u);
  expect_invalid(backward(a, Workspace{}, nullptr), "workspace.data is null but this backward needs");
  expect_invalid(backward(a, Workspace{fake(20), bytes - 1}, nullptr), "workspace.bytes is");
  expect_invalid(backward(a, Workspace{static_cast<char*>(fake(20)) + 8, bytes}, nullptr), "workspace.data = ");
}

TEST(Validation, ZeroSizeProblemsAreValid) {
  Problem p;
  ForwardTensors t;
  ForwardArgs a = valid_forward();
  for (Tensor* x : {&a.q, &a.k, &a.v, &a.o, &a.lse}) {
    x->shape[0] = 0;
    x->data = nullptr;  // frameworks hand out null for empty tensors
  }
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();

  a = valid_forward();
  a.k.shape[1] = a.v.shape[1] = 0;  // seqlen_k = 0: O = 0, LSE = -inf
  EXPECT_TRUE(validate_forward(a, &p, &t).ok());
  a = valid_forward();
  a.q.shape[1] = a.o.shape[1] = a.lse.shape[2] = 0;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok());

  // seqlen_k = 0 with the strides a contiguous allocation gives: the batch stride is 0, and the
  // empty outputs are not overlapping anything.
  BackwardArgs b = valid_backward();
  BackwardTensors bt;
  for (Tensor* x : {&b.k, &b.v, &b.dk, &b.dv}) {
    *x = make_tensor(x->data, DType::kBFloat16, {kBatch, 0, kHeadsKv, kDim});
  }
  EXPECT_EQ(b.dk.stride[0], 0);
  EXPECT_TRUE(validate_backward(b, &p, &bt).ok()) << validate_backward(b, &p, &bt).message();
}

TEST(Validation, NoHopperDeviceGivesAClearError) {
  if (check_current_device().ok()) GTEST_SKIP() << "an sm_90 GPU is present; this test covers machines without one";
  const Status s = forward(valid_forward(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kDeviceUnavailable);
  EXPECT_NE(s.message().find("Hopper"), std::string::npos) << s.message();
  BackwardArgs b = valid_backward();
  size_t bytes = 0;
  ASSERT_TRUE(backward_workspace_size(b, &bytes).ok());
  EXPECT_EQ(backward(b, Workspace{fake(20), bytes}, nullptr).code(), StatusCode::kDeviceUnavailable);
}

TEST(Device, ChecksAreCachedAndAgreeAcrossThreads) {
  if (!check_current_device().ok()) GTEST_SKIP() << "needs an sm_90 GPU: " << check_current_device().message();
  const int sms = current_device_limits().multiprocessors;
  EXPECT_GT(sms, 0);
  const DeviceLimits limits = current_device_limits();
  EXPECT_EQ(limits.multiprocessors, sms);
  EXPECT_GT(limits.l2_bytes, 0);
  // forward() may be called from several host threads at once, each checking the device first.
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 1000; ++j) {
        const bool same = current_device_limits().l2_bytes == limits.l2_bytes && current_device_limits().multiprocessors == sms;
        if (!check_current_device().ok() || !same) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace hopattn
