// Valid arguments for each call of the public API, on fake device pointers (never dereferenced),
// that the validation tests of each feature change one field at a time; and the check that a
// status is the invalid-argument error naming what it should.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "hopattn/hopattn.hpp"

namespace hopattn::validation_args {

// Distinct, 16-byte aligned addresses that are never dereferenced.
inline void* fake(uintptr_t slot) { return reinterpret_cast<void*>(0x100000 + slot * 0x10000); }
inline IntArray fake_ints(uintptr_t slot, int64_t size) { return IntArray{static_cast<const int32_t*>(fake(slot)), size}; }

constexpr int kBatch = 2, kSeqQ = 64, kSeqK = 96, kHeads = 8, kHeadsKv = 2, kDim = 128;

inline ForwardArgs valid_forward() {
  ForwardArgs a;
  a.q = make_tensor(fake(1), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  a.k = make_tensor(fake(2), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, kDim});
  a.v = make_tensor(fake(3), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, kDim});
  a.o = make_tensor(fake(4), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  a.lse = make_tensor(fake(5), DType::kFloat32, {kBatch, kHeads, kSeqQ});
  return a;
}

// 3 sequences packed into 100 query and 150 key tokens.
inline ForwardArgs valid_varlen_forward() {
  ForwardArgs a;
  a.q = make_tensor(fake(1), DType::kFloat16, {100, kHeads, kDim});
  a.k = make_tensor(fake(2), DType::kFloat16, {150, kHeadsKv, kDim});
  a.v = make_tensor(fake(3), DType::kFloat16, {150, kHeadsKv, kDim});
  a.o = make_tensor(fake(4), DType::kFloat16, {100, kHeads, kDim});
  a.lse = make_tensor(fake(5), DType::kFloat32, {kHeads, 100});
  a.varlen.cu_seqlens_q = fake_ints(10, 4);
  a.varlen.cu_seqlens_k = fake_ints(11, 4);
  a.varlen.max_seqlen_q = 60;
  a.varlen.max_seqlen_k = 80;
  return a;
}

// Chunked prefill: varlen queries against 40 pages of 16 keys, 16 pages a sequence.
inline ForwardArgs valid_paged_forward() {
  ForwardArgs a;
  a.q = make_tensor(fake(1), DType::kBFloat16, {100, kHeads, kDim});
  a.k = make_tensor(fake(2), DType::kBFloat16, {40, 16, kHeadsKv, kDim});
  a.v = make_tensor(fake(3), DType::kBFloat16, {40, 16, kHeadsKv, kDim});
  a.o = make_tensor(fake(4), DType::kBFloat16, {100, kHeads, kDim});
  a.varlen.cu_seqlens_q = fake_ints(10, kBatch + 1);
  a.varlen.max_seqlen_q = 64;
  a.page_table = PageTable{static_cast<const int32_t*>(fake(12)), kBatch, 16, 0};
  return a;
}

// A decode step against a contiguous cache of 256 keys.
inline KVCacheArgs valid_kvcache() {
  KVCacheArgs a;
  a.q = make_tensor(fake(1), DType::kBFloat16, {kBatch, 1, kHeads, kDim});
  a.k_cache = make_tensor(fake(2), DType::kBFloat16, {kBatch, 256, kHeadsKv, kDim});
  a.v_cache = make_tensor(fake(3), DType::kBFloat16, {kBatch, 256, kHeadsKv, kDim});
  a.cache_seqlens = fake_ints(10, kBatch);
  a.o = make_tensor(fake(4), DType::kBFloat16, {kBatch, 1, kHeads, kDim});
  return a;
}

inline BackwardArgs valid_backward() {
  const ForwardArgs f = valid_forward();
  BackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.o = f.o;
  a.lse = f.lse;
  a.dout = make_tensor(fake(6), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  a.dq = make_tensor(fake(7), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  a.dk = make_tensor(fake(8), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, kDim});
  a.dv = make_tensor(fake(9), DType::kBFloat16, {kBatch, kSeqK, kHeadsKv, kDim});
  return a;
}

inline void expect_invalid(const Status& s, const std::string& fragment) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message() << "\nexpected: " << fragment;
}

}  // namespace hopattn::validation_args
