// The KV-cache arguments (forward_kvcache, and forward() with a page table) get a clear error
// naming the argument and the rule, through the public API, before anything touches the device:
// both calls validate first. Valid arguments are checked through the internal validator, since the
// public call would go on to launch with the fake pointers used here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "api/device.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {
namespace {

// Distinct, 16-byte aligned addresses that are never dereferenced.
void* fake(uintptr_t slot) { return reinterpret_cast<void*>(0x100000 + slot * 0x10000); }
IntArray fake_ints(uintptr_t slot, int64_t size) { return IntArray{static_cast<const int32_t*>(fake(slot)), size}; }

constexpr int kBatch = 2, kSeqQ = 4, kHeads = 8, kHeadsKv = 2, kDim = 128, kCapacity = 256;
constexpr int kPageSize = 16, kMaxPages = kCapacity / kPageSize, kNumPages = 40, kSeqNew = 3, kMaxPosition = 1024;

// Decode with a few queries per sequence against a contiguous cache, no append.
KVCacheArgs valid_kvcache() {
  KVCacheArgs a;
  a.q = make_tensor(fake(1), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  a.k_cache = make_tensor(fake(2), DType::kBFloat16, {kBatch, kCapacity, kHeadsKv, kDim});
  a.v_cache = make_tensor(fake(3), DType::kBFloat16, {kBatch, kCapacity, kHeadsKv, kDim});
  a.cache_seqlens = fake_ints(4, kBatch);
  a.o = make_tensor(fake(5), DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDim});
  a.lse = make_tensor(fake(6), DType::kFloat32, {kBatch, kHeads, kSeqQ});
  return a;
}

// The same on a paged cache (page size 16, 16 pages a sequence, 40 pages).
KVCacheArgs valid_paged_kvcache() {
  KVCacheArgs a = valid_kvcache();
  a.k_cache = make_tensor(fake(2), DType::kBFloat16, {kNumPages, kPageSize, kHeadsKv, kDim});
  a.v_cache = make_tensor(fake(3), DType::kBFloat16, {kNumPages, kPageSize, kHeadsKv, kDim});
  a.page_table = PageTable{static_cast<const int32_t*>(fake(7)), kBatch, kMaxPages, 0};
  return a;
}

// New keys and values appended, with rotary embedding (rotary_dim 64).
KVCacheArgs valid_append() {
  KVCacheArgs a = valid_kvcache();
  a.k_new = make_tensor(fake(8), DType::kBFloat16, {kBatch, kSeqNew, kHeadsKv, kDim});
  a.v_new = make_tensor(fake(9), DType::kBFloat16, {kBatch, kSeqNew, kHeadsKv, kDim});
  a.rotary.cos = make_tensor(fake(10), DType::kBFloat16, {kMaxPosition, 32});
  a.rotary.sin = make_tensor(fake(11), DType::kBFloat16, {kMaxPosition, 32});
  return a;
}

// Chunked prefill through forward(): varlen queries against paged K/V, key counts in seqused_k.
ForwardArgs valid_paged_forward() {
  ForwardArgs a;
  a.q = make_tensor(fake(1), DType::kBFloat16, {100, kHeads, kDim});
  a.k = make_tensor(fake(2), DType::kBFloat16, {kNumPages, kPageSize, kHeadsKv, kDim});
  a.v = make_tensor(fake(3), DType::kBFloat16, {kNumPages, kPageSize, kHeadsKv, kDim});
  a.o = make_tensor(fake(4), DType::kBFloat16, {100, kHeads, kDim});
  a.lse = make_tensor(fake(5), DType::kFloat32, {kHeads, 100});
  a.varlen.cu_seqlens_q = fake_ints(6, kBatch + 1);
  a.varlen.seqused_k = fake_ints(7, kBatch);
  a.varlen.max_seqlen_q = 64;
  a.page_table = PageTable{static_cast<const int32_t*>(fake(8)), kBatch, kMaxPages, 0};
  return a;
}

void expect_invalid(const Status& s, const std::string& fragment) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message() << "\nexpected: " << fragment;
}

void expect_kvcache_invalid(const std::function<void(KVCacheArgs&)>& mutate, const std::string& fragment,
                            KVCacheArgs (*make)() = valid_kvcache) {
  KVCacheArgs a = make();
  mutate(a);
  expect_invalid(forward_kvcache(a, Workspace{fake(20), size_t{1} << 30}, nullptr), fragment);
  expect_invalid(forward_kvcache(a, Workspace{}, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(forward_kvcache_workspace_size(a, &bytes), fragment);  // validated before the device is asked
}

void expect_paged_forward_invalid(const std::function<void(ForwardArgs&)>& mutate, const std::string& fragment) {
  ForwardArgs a = valid_paged_forward();
  mutate(a);
  expect_invalid(forward(a, nullptr), fragment);
  size_t bytes = 0;
  expect_invalid(forward_workspace_size(a, &bytes), fragment);
}

TEST(KVCacheValidation, AcceptsValidArgumentsAndResolvesTheCall) {
  KVCacheCall call;
  ASSERT_TRUE(validate_kvcache(valid_kvcache(), &call).ok()) << validate_kvcache(valid_kvcache(), &call).message();
  EXPECT_EQ(call.problem.batch, kBatch);
  EXPECT_EQ(call.problem.max_seqlen_q, kSeqQ);
  EXPECT_EQ(call.problem.max_seqlen_k, kCapacity);
  EXPECT_FALSE(call.problem.key_cache.paged());
  EXPECT_EQ(call.problem.key_cache.rows, kBatch);
  EXPECT_FALSE(call.appends());

  ASSERT_TRUE(validate_kvcache(valid_paged_kvcache(), &call).ok());
  EXPECT_TRUE(call.problem.key_cache.paged());
  EXPECT_EQ(call.problem.key_cache.page_size.divisor(), kPageSize);
  EXPECT_EQ(call.problem.key_cache.page_table_stride, kMaxPages);  // row_stride 0 means max_pages
  EXPECT_EQ(call.problem.max_seqlen_k, kCapacity);

  KVCacheArgs append = valid_append();
  append.mask.causal = true;
  ASSERT_TRUE(validate_kvcache(append, &call).ok()) << validate_kvcache(append, &call).message();
  EXPECT_TRUE(call.appends());
  EXPECT_EQ(call.append.seqlen_new, kSeqNew);
  EXPECT_EQ(call.append.rotary_dim, 64);
  EXPECT_TRUE(call.append.q_positions_per_row);  // causal: query i at position start + i

  Problem p;
  ForwardTensors t;
  ASSERT_TRUE(validate_forward(valid_paged_forward(), &p, &t).ok());
  EXPECT_EQ(p.batch, kBatch);
  EXPECT_TRUE(p.key_cache.paged());
}

// Pages that follow one another as runs of rows (one allocation) may take the key-group-major
// forward, whose TMA view runs across pages; pages further apart (a view of a larger pool) may not.
TEST(KVCacheValidation, SaysWhetherPagesAreConsecutive) {
  KVCacheCall call;
  ASSERT_TRUE(validate_kvcache(valid_paged_kvcache(), &call).ok());
  EXPECT_TRUE(call.problem.key_cache.consecutive_pages);

  for (const bool gap_in_k : {true, false}) {
    KVCacheArgs a = valid_paged_kvcache();
    Tensor& t = gap_in_k ? a.k_cache : a.v_cache;
    t.stride[0] = (kPageSize + 16) * t.stride[1];  // 16 rows between one page's end and the next's start
    ASSERT_TRUE(validate_kvcache(a, &call).ok()) << validate_kvcache(a, &call).message();
    EXPECT_FALSE(call.problem.key_cache.consecutive_pages) << (gap_in_k ? "k" : "v");
  }

  Problem p;
  ForwardTensors t;
  ASSERT_TRUE(validate_forward(valid_paged_forward(), &p, &t).ok());
  EXPECT_TRUE(p.key_cache.consecutive_pages);
  ASSERT_TRUE(validate_kvcache(valid_kvcache(), &call).ok());
  EXPECT_FALSE(call.problem.key_cache.consecutive_pages);  // contiguous caches have no pages
}

TEST(KVCacheValidation, CacheRanksAndShapes) {
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.k_cache = make_tensor(fake(2), DType::kBFloat16, {kBatch, kCapacity, kDim});
      },
      "k_cache.rank is 3 but must be 4: (cache_rows, capacity, heads_kv, head_dim)");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.rank = 3; },
                         "k_cache.rank is 3 but must be 4: (num_pages, page_size, heads_kv, head_dim)",
                         valid_paged_kvcache);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.rank = 3; }, "v_cache.rank is 3 but must be 4");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.shape[1] = kCapacity - 1; },
                         "v_cache.shape[1] is 255 but must be 256");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.shape[0] = kNumPages - 1; }, "v_cache.shape[0] is 39",
                         valid_paged_kvcache);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.shape[2] = 1; }, "v_cache.shape[2] is 1 but must be 2");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.shape[3] = 64; },
                         "k_cache.shape[3] (head_dim) is 64 but must equal q's head_dim = 128");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.shape[2] = a.v_cache.shape[2] = 3; },
                         "heads (8) must be a multiple of heads_kv (3)");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.shape[0] = a.v_cache.shape[0] = 3; },
                         "k_cache.shape[0] (cache rows) is 3");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.shape[1] = -1; }, "k_cache.shape[1]");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.dtype = DType::kFloat16; },
                         "v_cache.dtype is float16 but must be bfloat16");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.data = nullptr; }, "k_cache.data is null");
  // The cache is written by appends, so rows that share memory are refused even where it is only read.
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.stride[0] = 0; }, "v_cache overlaps itself");
}

TEST(KVCacheValidation, CapacityMustBePositive) {
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.shape[1] = a.v_cache.shape[1] = 0; },
                         "k_cache.shape[1] (capacity) is 0 but must be at least 1");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_cache.shape[1] = a.v_cache.shape[1] = 0; },
                         "num_pages and page_size must be at least 1", valid_paged_kvcache);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.page_table.max_pages = 0; },
                         "page_table.max_pages is 0 but must be in [1, 2^31-1]", valid_paged_kvcache);
}

TEST(KVCacheValidation, PageTable) {
  expect_kvcache_invalid([](KVCacheArgs& a) { a.page_table.batch = 3; }, "page_table.batch (rows) is 3",
                         valid_paged_kvcache);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.page_table.batch = -1; }, "page_table.batch", valid_paged_kvcache);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.page_table.row_stride = kMaxPages - 1; },
                         "page_table.row_stride is 15 but must be 0 or >= max_pages = 16", valid_paged_kvcache);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.page_table.data = static_cast<const int32_t*>(static_cast<const void*>(static_cast<char*>(fake(7)) + 2));
      },
      "page_table.data = ", valid_paged_kvcache);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.cache_batch_idx = fake_ints(12, kBatch);  // the table's rows need not match the batch
        a.page_table.batch = 5;
        a.page_table.row_stride = int64_t{1} << 62;
      },
      "page_table: batch * row_stride overflows int64", valid_paged_kvcache);
  // With cache_batch_idx the table has rows of its own, at least one.
  KVCacheArgs a = valid_paged_kvcache();
  a.cache_batch_idx = fake_ints(12, kBatch);
  a.page_table.batch = 7;
  KVCacheCall call;
  ASSERT_TRUE(validate_kvcache(a, &call).ok()) << validate_kvcache(a, &call).message();
  EXPECT_EQ(call.problem.key_cache.rows, 7);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.cache_batch_idx = fake_ints(12, kBatch);
        a.page_table.batch = 0;
      },
      "page_table.batch (rows) is 0", valid_paged_kvcache);
}

TEST(KVCacheValidation, IndexArrays) {
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cache_seqlens = IntArray{}; },
                         "cache_seqlens is missing (data is null)");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cache_seqlens.size = 3; }, "cache_seqlens.size is 3 but must be 2");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cache_batch_idx = fake_ints(12, 1); },
                         "cache_batch_idx.size is 1 but must be 2");
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.cache_batch_idx = IntArray{nullptr, 2};
      },
      "cache_batch_idx.size is 2 but data is null");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cache_leftpad = fake_ints(13, 3); },
                         "cache_leftpad.size is 3 but must be 2");
}

TEST(KVCacheValidation, Queries) {
  // Fixed-length q with one sequence per cache row; varlen q with cu_seqlens_q.
  expect_kvcache_invalid([](KVCacheArgs& a) { a.q.rank = 3; }, "q.rank is 3 but must be 4");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cu_seqlens_q = fake_ints(14, kBatch + 1); },
                         "q.rank is 4 but must be 3: (total_q, heads, head_dim)");
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.q = make_tensor(fake(1), DType::kBFloat16, {9, kHeads, kDim});
        a.cu_seqlens_q = fake_ints(14, 0);
      },
      "cu_seqlens_q.size is 0 but must be batch + 1 >= 1");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.q.dtype = DType::kFloat32; }, "q.dtype is float32");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.o.shape[1] = kSeqQ + 1; }, "o.shape[1] is 5 but must be 4");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.lse.shape[2] = 1; }, "lse.shape[2] is 1 but must be 4");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.q.stride[1] = 0; },
                         "q.stride[1] is 0: a call on a KV cache takes no broadcast q");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.q.stride[0] = 0; },
                         "q.stride[0] is 0: a call on a KV cache takes no broadcast q");
}

TEST(KVCacheValidation, NewKeysAndValues) {
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_new = Tensor{}; },
                         "v_new.data is null but k_new is given; new keys and values come together", valid_append);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.k_new = Tensor{};
        a.rotary = RotaryEmbedding{};
      },
      "k_new.data is null but v_new is given", valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cu_seqlens_new = fake_ints(15, kBatch + 1); },
                         "cu_seqlens_new is given without k_new/v_new");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_new.shape[1] = kSeqNew + 1; }, "v_new.shape[1] is 4 but must be 3",
                         valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_new.shape[2] = 1; }, "k_new.shape[2] is 1 but must be 2",
                         valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_new.rank = 3; },
                         "k_new.rank is 3 but must be 4: (batch, seqlen_new, heads_kv, head_dim)", valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cu_seqlens_new = fake_ints(15, kBatch + 1); },
                         "k_new.rank is 4 but must be 3: (total_new, heads_kv, head_dim)", valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.cu_seqlens_new = fake_ints(15, kBatch); },
                         "cu_seqlens_new.size is 2 but must be 3", valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_new.dtype = DType::kFloat16; },
                         "k_new.dtype is float16 but must be bfloat16", valid_append);
}

// A value head dim of its own: v_cache, v_new (and a paged forward's v) and o carry it, q, k_cache
// and k_new keep head_dim, which alone bounds rotary_dim.
constexpr int kDimV = 64;

KVCacheArgs with_dim_v(KVCacheArgs a) {
  a.v_cache = make_tensor(a.v_cache.data, DType::kBFloat16,
                          {a.v_cache.shape[0], a.v_cache.shape[1], a.v_cache.shape[2], kDimV});
  a.o = make_tensor(a.o.data, DType::kBFloat16, {kBatch, kSeqQ, kHeads, kDimV});
  if (a.v_new.data != nullptr) {
    a.v_new = make_tensor(a.v_new.data, DType::kBFloat16, {kBatch, kSeqNew, kHeadsKv, kDimV});
  }
  return a;
}

TEST(KVCacheValidation, HeadDimVIsTheValueCachesLastDimension) {
  KVCacheCall call;
  ASSERT_TRUE(validate_kvcache(valid_append(), &call).ok());
  EXPECT_EQ(call.problem.head_dim_v, kDim);  // set also where it equals head_dim
  EXPECT_EQ(call.append.head_dim_v, kDim);
  for (KVCacheArgs (*make)() : {valid_kvcache, valid_paged_kvcache, valid_append}) {
    const KVCacheArgs a = with_dim_v(make());
    ASSERT_TRUE(validate_kvcache(a, &call).ok()) << validate_kvcache(a, &call).message();
    EXPECT_EQ(call.problem.head_dim, kDim);
    EXPECT_EQ(call.problem.head_dim_v, kDimV);
    EXPECT_EQ(call.append.head_dim, kDim);
    EXPECT_EQ(call.append.head_dim_v, kDimV);
    EXPECT_FLOAT_EQ(call.problem.softmax_scale, 1.0f / std::sqrt(float(kDim)));
  }
  // rotary_dim may exceed head_dim_v: only q and k are rotated.
  KVCacheArgs rotary = with_dim_v(valid_append());
  rotary.rotary.cos = make_tensor(fake(10), DType::kBFloat16, {kMaxPosition, kDim / 2});
  rotary.rotary.sin = make_tensor(fake(11), DType::kBFloat16, {kMaxPosition, kDim / 2});
  ASSERT_TRUE(validate_kvcache(rotary, &call).ok()) << validate_kvcache(rotary, &call).message();
  EXPECT_EQ(call.append.rotary_dim, kDim);

  ForwardArgs paged = valid_paged_forward();
  paged.v = make_tensor(fake(3), DType::kBFloat16, {kNumPages, kPageSize, kHeadsKv, kDimV});
  paged.o = make_tensor(fake(4), DType::kBFloat16, {100, kHeads, kDimV});
  Problem p;
  ForwardTensors t;
  ASSERT_TRUE(validate_forward(paged, &p, &t).ok()) << validate_forward(paged, &p, &t).message();
  EXPECT_EQ(p.head_dim_v, kDimV);
}

TEST(KVCacheValidation, HeadDimVRulesAndShapes) {
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.v_cache = make_tensor(fake(3), DType::kBFloat16, {kBatch, kCapacity, kHeadsKv, 100});
      },
      "v_cache.shape[3] (head_dim_v) is 100 but must be a multiple of 8 in [8, 256]");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_cache.rank = 3; },
                         "v_cache.rank is 3 but must be 4: (num_pages, page_size, heads_kv, head_dim_v)",
                         valid_paged_kvcache);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.o = valid_kvcache().o; },
                         "o.shape[3] is 128 but must be 64: expected (batch, seqlen_q, heads, head_dim_v)",
                         [] { return with_dim_v(valid_kvcache()); });
  expect_kvcache_invalid([](KVCacheArgs& a) { a.v_new = valid_append().v_new; },
                         "v_new.shape[3] is 128 but must be 64: expected (batch, seqlen_new, heads_kv, head_dim_v)",
                         [] { return with_dim_v(valid_append()); });
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.cu_seqlens_new = fake_ints(15, kBatch + 1);
        a.k_new = make_tensor(fake(8), DType::kBFloat16, {7, kHeadsKv, kDim});
        a.v_new = make_tensor(fake(9), DType::kBFloat16, {7, kHeadsKv, kDim});
      },
      "v_new.shape[2] is 128 but must be 64: expected (total_new, heads_kv, head_dim_v)",
      [] { return with_dim_v(valid_append()); });
  // The key side keeps head_dim whatever V has.
  expect_kvcache_invalid([](KVCacheArgs& a) { a.k_new = with_dim_v(valid_append()).v_new; },
                         "k_new.shape[3] is 64 but must be 128", [] { return with_dim_v(valid_append()); });
  expect_paged_forward_invalid(
      [](ForwardArgs& a) {
        a.v = make_tensor(fake(3), DType::kBFloat16, {kNumPages, kPageSize, kHeadsKv, kDimV});
      },
      "o.shape[2] is 128 but must be 64: expected (total_q, heads, head_dim_v)");
}

TEST(KVCacheValidation, Rotary) {
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.rotary.cos = make_tensor(fake(10), DType::kBFloat16, {kMaxPosition, 32});
        a.rotary.sin = make_tensor(fake(11), DType::kBFloat16, {kMaxPosition, 32});
      },
      "rotary.cos is given without k_new/v_new");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.rotary.cos = Tensor{}; }, "rotary.sin is given without rotary.cos",
                         valid_append);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.rotary.cos = a.rotary.sin = Tensor{};
        a.rotary.positions = fake_ints(16, kBatch);
      },
      "rotary.positions is given without rotary.cos/sin", valid_append);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.rotary.cos = make_tensor(fake(10), DType::kBFloat16, {kMaxPosition, 12});
        a.rotary.sin = make_tensor(fake(11), DType::kBFloat16, {kMaxPosition, 12});
      },
      "rotary_dim (2 * rotary.cos.shape[1]) is 24 but must be a multiple of 16 in [16, head_dim = 128]", valid_append);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.rotary.cos = make_tensor(fake(10), DType::kBFloat16, {kMaxPosition, 72});
        a.rotary.sin = make_tensor(fake(11), DType::kBFloat16, {kMaxPosition, 72});
      },
      "rotary_dim (2 * rotary.cos.shape[1]) is 144", valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.rotary.cos.rank = 3; }, "rotary.cos.rank is 3 but must be 2",
                         valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.rotary.sin.shape[1] = 16; }, "rotary.sin.shape[1] is 16 but must be 32",
                         valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.rotary.sin.dtype = DType::kFloat32; },
                         "rotary.sin.dtype is float32 but must be bfloat16", valid_append);
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.rotary.sin = make_tensor(fake(11), DType::kBFloat16, {kMaxPosition, 32}, {64, 1});
      },
      "rotary.sin.stride[0] is 64 but must equal rotary.cos.stride[0] = 32", valid_append);
  expect_kvcache_invalid([](KVCacheArgs& a) { a.rotary.positions = fake_ints(16, kBatch + 1); },
                         "rotary.positions.size is 3 but must be 2", valid_append);
}

TEST(KVCacheValidation, MaskAndLayoutOptions) {
  expect_kvcache_invalid([](KVCacheArgs& a) { a.num_splits = -1; },
                         "num_splits is -1 but must be >= 0 (0: chosen, 1: no split)");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.pack_gqa = static_cast<PackGqa>(4); },
                         "pack_gqa is 4 but must be -1 (auto), 0 (off) or 1 (on)");
  expect_kvcache_invalid(
      [](KVCacheArgs& a) {
        a.mask = Mask{true, -1, 3};
      },
      "mask.causal is set with mask.window_right = 3");
  expect_kvcache_invalid([](KVCacheArgs& a) { a.softmax_scale = INFINITY; }, "softmax_scale is inf");
}

TEST(KVCacheValidation, PagedForward) {
  expect_paged_forward_invalid([](ForwardArgs& a) { a.varlen.cu_seqlens_k = fake_ints(9, kBatch + 1); },
                               "varlen.cu_seqlens_k is given with page_table");
  expect_paged_forward_invalid(
      [](ForwardArgs& a) {
        a.q = make_tensor(fake(1), DType::kBFloat16, {kBatch, 50, kHeads, kDim});
        a.o = make_tensor(fake(4), DType::kBFloat16, {kBatch, 50, kHeads, kDim});
        a.lse = Tensor{};
        a.varlen.cu_seqlens_q = IntArray{};
        a.varlen.seqused_q = fake_ints(10, kBatch);
      },
      "varlen.seqused_q is given without varlen.cu_seqlens_q; it needs varlen queries");
  expect_paged_forward_invalid([](ForwardArgs& a) { a.varlen.seqused_k.size = 1; },
                               "varlen.seqused_k.size is 1 but must be 2");
  expect_paged_forward_invalid([](ForwardArgs& a) { a.page_table.batch = 1; }, "page_table.batch (rows) is 1");
  expect_paged_forward_invalid([](ForwardArgs& a) { a.page_table.row_stride = 3; },
                               "page_table.row_stride is 3 but must be 0 or >= max_pages = 16");
  expect_paged_forward_invalid(
      [](ForwardArgs& a) {
        a.k = make_tensor(fake(2), DType::kBFloat16, {640, kHeadsKv, kDim});
      },
      "k.rank is 3 but must be 4: (num_pages, page_size, heads_kv, head_dim)");
  expect_paged_forward_invalid([](ForwardArgs& a) { a.v.shape[1] = 32; }, "v.shape[1] is 32 but must be 16");
  expect_paged_forward_invalid([](ForwardArgs& a) { a.num_splits = -2; }, "num_splits is -2");
  // Fixed-length queries against pages are fine; a table without data but with a shape is a mistake.
  ForwardArgs fixed = valid_paged_forward();
  fixed.q = make_tensor(fake(1), DType::kBFloat16, {kBatch, 50, kHeads, kDim});
  fixed.o = make_tensor(fake(4), DType::kBFloat16, {kBatch, 50, kHeads, kDim});
  fixed.lse = make_tensor(fake(5), DType::kFloat32, {kBatch, kHeads, 50});
  fixed.varlen.cu_seqlens_q = IntArray{};
  Problem p;
  ForwardTensors t;
  EXPECT_TRUE(validate_forward(fixed, &p, &t).ok()) << validate_forward(fixed, &p, &t).message();
  expect_paged_forward_invalid([](ForwardArgs& a) { a.page_table.data = nullptr; },
                               "page_table.data is null but its shape is (2, 16)");
}

TEST(KVCacheValidation, ValidCallsStopAtTheDeviceCheckWithoutAGpu) {
  if (check_current_device().ok()) GTEST_SKIP() << "an sm_90 GPU is present; this test covers machines without one";
  size_t bytes = 0;
  EXPECT_EQ(forward_kvcache_workspace_size(valid_append(), &bytes).code(), StatusCode::kDeviceUnavailable);
  EXPECT_EQ(forward_kvcache(valid_paged_kvcache(), Workspace{}, nullptr).code(), StatusCode::kDeviceUnavailable);
  EXPECT_EQ(forward(valid_paged_forward(), nullptr).code(), StatusCode::kDeviceUnavailable);
  expect_invalid(forward_kvcache_workspace_size(valid_kvcache(), nullptr), "bytes is null");
}

}  // namespace
}  // namespace hopattn
