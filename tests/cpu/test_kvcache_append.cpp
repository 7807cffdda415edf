// The KV-cache append's rule and its CPU reference: append_fits on hand-made caches (each bound
// from both sides, page boundaries, cache rows, rotary positions of keys and queries, varlen new
// tokens, int32 sums that would wrap), and the reference's append on tiny hand-computed examples:
// the rotation in both layouts with entries past rotary_dim, q's positions, where rows land in
// pages and cache rows, a sequence that does not fit, and the single rounding from fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/kvcache/append_kv.hpp"
#include "reference/kvcache_reference.hpp"
#include "testing/random_inputs.hpp"

namespace hopattn {
namespace {

// An address append_fits never dereferences (it only asks whether k_new and q_rotated are set).
void* fake() { return reinterpret_cast<void*>(0x100000); }

// The lengths, rows, pages and rotary table of an append, as host arrays: what append_fits reads.
struct FitsCase {
  int capacity = 16;
  int rows = 1;  // cache rows (page table rows when paged)
  bool has_new = true;
  int seqlen_new = 1;
  std::vector<int32_t> cu_seqlens_new;  // empty: seqlen_new tokens each
  int64_t total_new = 0;
  std::vector<int32_t> cache_seqlens = {0};
  std::vector<int32_t> batch_index;  // empty: sequence b uses cache row b
  int page_size = 0;                 // 0: contiguous
  int num_pages = 0;
  int max_pages = 0;
  std::vector<int32_t> page_table;  // rows x max_pages
  int rotary_positions = 0;         // > 0: rotary with that many rows of cos/sin
  std::vector<int32_t> rotary_start;
  int seqlen_q = 0;  // > 0: q is rotated, seqlen_q rows each
  bool q_positions_per_row = false;

  AppendKVParams params() const {
    AppendKVParams p;
    p.batch = static_cast<int>(cache_seqlens.size());
    p.heads = p.heads_kv = 1;
    p.head_dim = p.head_dim_v = 8;
    if (has_new) p.k_new.data = p.v_new.data = fake();
    p.cu_seqlens_new = cu_seqlens_new.empty() ? nullptr : cu_seqlens_new.data();
    p.seqlen_new = seqlen_new;
    p.total_new = total_new;
    p.cache.rows = rows;
    p.cache.batch_index = batch_index.empty() ? nullptr : batch_index.data();
    if (page_size > 0) {
      p.cache.page_table = page_table.data();
      p.cache.page_table_stride = max_pages;
      p.cache.page_size = FastDivisor(page_size);
      p.cache.num_pages = num_pages;
      p.cache.max_pages = max_pages;
    }
    p.capacity = capacity;
    p.cache_seqlens = cache_seqlens.data();
    if (rotary_positions > 0) {
      p.rotary_dim = 8;
      p.rotary_positions = rotary_positions;
      p.rotary_start = rotary_start.empty() ? nullptr : rotary_start.data();
    }
    if (seqlen_q > 0) p.q_rotated.data = fake();
    p.seqlen_q = seqlen_q;
    p.q_positions_per_row = q_positions_per_row;
    return p;
  }
  bool fits(int b = 0) const { return append_fits(params(), b); }
};

TEST(AppendFits, NewTokensEndWithinCapacity) {
  FitsCase c;
  c.capacity = 8;
  c.seqlen_new = 3;
  c.cache_seqlens = {5};
  EXPECT_TRUE(c.fits());  // ends exactly at capacity
  c.cache_seqlens = {6};
  EXPECT_FALSE(c.fits());  // one past
  c.has_new = false;       // nothing appended: only cache_seqlens itself must be within capacity
  c.cache_seqlens = {8};
  EXPECT_TRUE(c.fits());
  c.cache_seqlens = {9};
  EXPECT_FALSE(c.fits());
}

TEST(AppendFits, NegativeCacheSeqlensNeverFits) {
  FitsCase c;
  c.cache_seqlens = {-1};
  EXPECT_FALSE(c.fits());
  c.has_new = false;
  EXPECT_FALSE(c.fits());
}

TEST(AppendFits, SumsDoNotWrapAroundInt32) {
  FitsCase c;
  c.capacity = std::numeric_limits<int32_t>::max();
  c.seqlen_new = 2;
  c.cache_seqlens = {std::numeric_limits<int32_t>::max() - 1};  // + 2 wraps to a negative int32
  EXPECT_FALSE(c.fits());
  c.rotary_positions = std::numeric_limits<int32_t>::max();
  c.capacity = 16;
  c.cache_seqlens = {0};
  c.rotary_start = {std::numeric_limits<int32_t>::max() - 1};
  EXPECT_FALSE(c.fits());
}

TEST(AppendFits, CacheRowMustExist) {
  FitsCase c;
  c.rows = 2;
  c.batch_index = {1};
  EXPECT_TRUE(c.fits());
  c.batch_index = {2};
  EXPECT_FALSE(c.fits());
  c.batch_index = {-1};
  EXPECT_FALSE(c.fits());
  // Without cache_batch_idx sequence b uses row b, which a cache of fewer rows lacks.
  c.batch_index.clear();
  c.cache_seqlens = {0, 0};
  c.rows = 1;
  EXPECT_TRUE(c.fits(0));
  EXPECT_FALSE(c.fits(1));
}

// Pages of 4 positions; row 0 owns pages {3, -1, 5}, row 1 {0, 6 (= num_pages), 2}.
FitsCase paged_case() {
  FitsCase c;
  c.page_size = 4;
  c.max_pages = 3;
  c.capacity = 12;
  c.num_pages = 6;
  c.rows = 2;
  c.page_table = {3, -1, 5, 0, 6, 2};
  return c;
}

TEST(AppendFits, EveryPageTouchedMustExist) {
  FitsCase c = paged_case();
  c.seqlen_new = 2;
  c.cache_seqlens = {2};  // positions 2, 3: page 3
  EXPECT_TRUE(c.fits());
  c.cache_seqlens = {3};  // positions 3, 4: across the boundary into the missing page
  EXPECT_FALSE(c.fits());
  c.cache_seqlens = {8};  // positions 8, 9: page 5, past the missing one
  EXPECT_TRUE(c.fits());
  c.seqlen_new = 8;
  c.cache_seqlens = {4};  // positions 4 to 11
  EXPECT_FALSE(c.fits());
  c.has_new = false;  // nothing appended: no page is touched, not even the missing one at 4
  EXPECT_TRUE(c.fits());

  c = paged_case();
  c.batch_index = {1};
  c.seqlen_new = 2;
  c.cache_seqlens = {2};  // page 0
  EXPECT_TRUE(c.fits());
  c.cache_seqlens = {3};  // into page 6, one past the last page
  EXPECT_FALSE(c.fits());
  c.seqlen_new = 4;
  c.cache_seqlens = {8};  // page 2 exactly
  EXPECT_TRUE(c.fits());
}

// The kernel shares a long append's pages out among a CTA's threads: the pages checked from
// offsets 0 .. step - 1 with that step together are append_fits' pages.
TEST(AppendFits, PagesSplitAmongThreadsAgreeWithWholeCheck) {
  FitsCase c = paged_case();
  c.page_size = 1;
  c.capacity = 3;
  for (int filled = 0; filled <= 3; ++filled) {
    for (int count = 0; filled + count <= 3; ++count) {
      c.cache_seqlens = {filled};
      c.seqlen_new = count;
      const AppendKVParams p = c.params();
      for (int step : {1, 2, 3, 128}) {
        bool all = true;
        for (int first = 0; first < step; ++first) all = all && append_pages_exist(p, 0, first, step);
        EXPECT_EQ(append_fits_except_pages(p, 0) && all, append_fits(p, 0))
            << "filled " << filled << " count " << count << " step " << step;
      }
    }
  }
}

TEST(AppendFits, RotaryPositionsOfKeysMustBeRowsOfTheTable) {
  FitsCase c;
  c.rotary_positions = 6;
  c.seqlen_new = 3;
  c.cache_seqlens = {3};  // keys at 3, 4, 5
  EXPECT_TRUE(c.fits());
  c.cache_seqlens = {4};  // 4, 5, 6
  EXPECT_FALSE(c.fits());
  c.rotary_start = {0};  // 0, 1, 2 whatever the cache holds
  EXPECT_TRUE(c.fits());
  c.rotary_start = {-1};
  EXPECT_FALSE(c.fits());
  c.rotary_positions = 0;  // no rotary: positions do not matter
  EXPECT_TRUE(c.fits());
}

TEST(AppendFits, RotaryPositionsOfQueriesMustBeRowsOfTheTable) {
  FitsCase c;
  c.rotary_positions = 6;
  c.seqlen_q = 3;
  c.rotary_start = {3};  // key at 3, queries at 3, 4, 5
  c.q_positions_per_row = true;
  EXPECT_TRUE(c.fits());
  c.rotary_start = {4};  // queries at 4, 5, 6
  EXPECT_FALSE(c.fits());
  c.q_positions_per_row = false;  // every query at 4
  EXPECT_TRUE(c.fits());
  c.rotary_start = {5};  // key at 5: fits; queries at 5 (not per row) fit too
  EXPECT_TRUE(c.fits());
  c.seqlen_new = 2;  // keys at 5, 6
  EXPECT_FALSE(c.fits());
}

TEST(AppendFits, VarlenNewTokens) {
  FitsCase c;
  c.capacity = 5;
  c.rows = 2;
  c.cu_seqlens_new = {0, 2, 7};
  c.total_new = 7;
  c.cache_seqlens = {3, 0};  // 3 + 2 and 0 + 5: both end at capacity
  EXPECT_TRUE(c.fits(0));
  EXPECT_TRUE(c.fits(1));
  c.cache_seqlens = {4, 1};
  EXPECT_FALSE(c.fits(0));
  EXPECT_FALSE(c.fits(1));
}

// Prefix sums read from device memory are clamped to the packed rows, never followed past them.
TEST(AppendFits, InconsistentPrefixSumsAreClamped) {
  FitsCase c;
  c.cache_seqlens = {0, 0};
  c.cu_seqlens_new = {2, 9, 1};
  c.total_new = 7;
  const AppendKVParams p = c.params();
  EXPECT_EQ(new_tokens(p, 0).offset, 2);
  EXPECT_EQ(new_tokens(p, 0).length, 5);  // 9 clamped to 7
  EXPECT_EQ(new_tokens(p, 1).length, 0);  // a decreasing pair is empty
}

// ---- The CPU reference on hand-computed examples ----

uint16_t bits(DType dtype, float x) {
  return dtype == DType::kFloat16 ? __half_as_ushort(__float2half_rn(x)) : __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

std::vector<uint16_t> bits(DType dtype, const std::vector<float>& values) {
  std::vector<uint16_t> out;
  for (float x : values) out.push_back(bits(dtype, x));
  return out;
}

constexpr uint16_t kUntouched = 0x7777;  // what the cache and q_rotated hold before the append
constexpr int kDim = 8;

// One sequence with one KV head and one query head of 8 entries, appended to a contiguous cache of
// one row; cos/sin rows one entry wider apart than rotary_dim / 2.
struct Tiny {
  Tiny(DType dtype, int capacity, int filled, const std::vector<std::vector<float>>& new_keys) {
    for (const auto& key : new_keys) {
      for (uint16_t b : bits(dtype, key)) k_new.push_back(b);
      for (float x : key) v_new.push_back(bits(dtype, -x));
    }
    k_cache.assign(size_t(capacity) * kDim, kUntouched);
    v_cache = k_cache;
    cache_seqlens = {filled};
    key_end = {-1};
    p.dtype = dtype;
    p.batch = p.heads = p.heads_kv = 1;
    p.head_dim = p.head_dim_v = kDim;
    p.k_new = RowTensor{k_new.data(), 0, kDim, kDim};
    p.v_new = RowTensor{v_new.data(), 0, kDim, kDim};
    p.seqlen_new = static_cast<int>(new_keys.size());
    p.k_cache = RowTensor{k_cache.data(), int64_t(capacity) * kDim, kDim, kDim};
    p.v_cache = RowTensor{v_cache.data(), int64_t(capacity) * kDim, kDim, kDim};
    p.cache.rows = 1;
    p.capacity = capacity;
    p.cache_seqlens = cache_seqlens.data();
    p.key_end = key_end.data();
  }
  Tiny(const Tiny&) = delete;

  // Rotary with the given cos/sin rows (positions 0, 1, ...).
  void rotary(int rotary_dim, bool interleaved, const std::vector<std::vector<float>>& cos_rows,
              const std::vector<std::vector<float>>& sin_rows) {
    const int stride = rotary_dim / 2 + 1;
    cos.assign(cos_rows.size() * stride, kUntouched);
    sin = cos;
    for (size_t r = 0; r < cos_rows.size(); ++r) {
      for (size_t i = 0; i < cos_rows[r].size(); ++i) {
        cos[r * stride + i] = bits(p.dtype, cos_rows[r][i]);
        sin[r * stride + i] = bits(p.dtype, sin_rows[r][i]);
      }
    }
    p.rotary_dim = rotary_dim;
    p.rotary_interleaved = interleaved;
    p.rotary_cos = cos.data();
    p.rotary_sin = sin.data();
    p.rotary_row_stride = stride;
    p.rotary_positions = static_cast<int>(cos_rows.size());
  }

  // q of the given rows, rotated into q_rotated.
  void queries(const std::vector<std::vector<float>>& rows, bool per_row) {
    for (const auto& row : rows)
      for (uint16_t b : bits(p.dtype, row)) q.push_back(b);
    q_rotated.assign(q.size(), kUntouched);
    p.q = RowTensor{q.data(), int64_t(q.size()), kDim, kDim};
    p.q_rotated = RowTensor{q_rotated.data(), int64_t(q.size()), kDim, kDim};
    p.seqlen_q = static_cast<int>(rows.size());
    p.q_positions_per_row = per_row;
  }

  std::vector<uint16_t> k_cache_row(int position) const {
    return {k_cache.begin() + position * kDim, k_cache.begin() + (position + 1) * kDim};
  }
  std::vector<uint16_t> q_rotated_row(int i) const {
    return {q_rotated.begin() + i * kDim, q_rotated.begin() + (i + 1) * kDim};
  }

  AppendKVParams p;
  std::vector<uint16_t> k_new, v_new, k_cache, v_cache, cos, sin, q, q_rotated;
  std::vector<int32_t> cache_seqlens, key_end;
};

const std::vector<float> kKey = {1, 2, 3, 4, 5, 6, 7, 8};
// Row 0 is never used below; row 1: cos (0.5, 1), sin (0.25, -0.5).
const std::vector<std::vector<float>> kCos = {{9, 9}, {0.5f, 1}};
const std::vector<std::vector<float>> kSin = {{9, 9}, {0.25f, -0.5f}};

TEST(KVCacheReference, NeoXRotatesPairsAcrossTheHalvesOfTheRotaryPart) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    Tiny t(dtype, 3, 1, {kKey});
    t.rotary(4, /*interleaved=*/false, kCos, kSin);
    cpu_reference::append_kv(t.p);
    // Pairs (0, 2) and (1, 3): x0 c0 - x2 s0 = 0.5 - 0.75, x2 c0 + x0 s0 = 1.5 + 0.25,
    // x1 c1 - x3 s1 = 2 + 2, x3 c1 + x1 s1 = 4 - 1; entries 4 to 7 unchanged.
    EXPECT_EQ(t.k_cache_row(1), bits(dtype, {-0.25f, 4, 1.75f, 3, 5, 6, 7, 8}));
    EXPECT_EQ(t.k_cache_row(0), std::vector<uint16_t>(kDim, kUntouched));
    EXPECT_EQ(t.k_cache_row(2), std::vector<uint16_t>(kDim, kUntouched));
    EXPECT_EQ(std::vector<uint16_t>(t.v_cache.begin() + kDim, t.v_cache.begin() + 2 * kDim),
              bits(dtype, {-1, -2, -3, -4, -5, -6, -7, -8}));  // values are not rotated
    EXPECT_EQ(t.key_end, std::vector<int32_t>{2});
  }
}

// Values with a head dim of their own (16 next to the keys' 8): whole V rows copied, K rows rotated.
TEST(KVCacheReference, ValuesCopyRowsOfTheirOwnHeadDim) {
  constexpr int kDimV = 16;
  Tiny t(DType::kBFloat16, 3, 1, {kKey});
  std::vector<float> value(kDimV);
  for (int d = 0; d < kDimV; ++d) value[d] = float(d + 1);
  t.v_new = bits(DType::kBFloat16, value);
  t.v_cache.assign(3 * kDimV, kUntouched);
  t.p.head_dim_v = kDimV;
  t.p.v_new = RowTensor{t.v_new.data(), 0, kDimV, kDimV};
  t.p.v_cache = RowTensor{t.v_cache.data(), 3 * kDimV, kDimV, kDimV};
  t.rotary(4, /*interleaved=*/false, kCos, kSin);
  cpu_reference::append_kv(t.p);
  std::vector<uint16_t> expected(3 * kDimV, kUntouched);
  std::copy(t.v_new.begin(), t.v_new.end(), expected.begin() + kDimV);  // position 1, not rotated
  EXPECT_EQ(t.v_cache, expected);
  EXPECT_EQ(t.k_cache_row(1), bits(DType::kBFloat16, {-0.25f, 4, 1.75f, 3, 5, 6, 7, 8}));
  EXPECT_EQ(t.key_end, std::vector<int32_t>{2});
}

TEST(KVCacheReference, GptJRotatesNeighbouringPairs) {
  Tiny t(DType::kBFloat16, 2, 1, {kKey});
  t.rotary(4, /*interleaved=*/true, kCos, kSin);
  cpu_reference::append_kv(t.p);
  // Pairs (0, 1) with cos/sin[0], (2, 3) with cos/sin[1].
  EXPECT_EQ(t.k_cache_row(1), bits(DType::kBFloat16, {0, 1.25f, 5, 2.5f, 5, 6, 7, 8}));
}

TEST(KVCacheReference, KeysTakeConsecutivePositionsFromRotaryStart) {
  // Row 0 the identity, row 1 a quarter turn: (x1, x2) -> (-x2, x1).
  Tiny t(DType::kBFloat16, 4, 2, {kKey, kKey});
  t.rotary(kDim, /*interleaved=*/false, {{1, 1, 1, 1}, {0, 0, 0, 0}}, {{0, 0, 0, 0}, {1, 1, 1, 1}});
  const std::vector<int32_t> start = {0};
  t.p.rotary_start = start.data();
  cpu_reference::append_kv(t.p);
  EXPECT_EQ(t.k_cache_row(2), bits(DType::kBFloat16, kKey));
  EXPECT_EQ(t.k_cache_row(3), bits(DType::kBFloat16, {-5, -6, -7, -8, 1, 2, 3, 4}));
  EXPECT_EQ(t.key_end, std::vector<int32_t>{4});
}

TEST(KVCacheReference, QueriesTakePositionsPerRowOrAllTheStart) {
  for (bool per_row : {true, false}) {
    Tiny t(DType::kFloat16, 2, 0, {kKey});
    t.rotary(4, /*interleaved=*/false, {{1, 1}, {0, 0}}, {{0, 0}, {1, 1}});
    t.queries({kKey, kKey}, per_row);
    cpu_reference::append_kv(t.p);
    EXPECT_EQ(t.q_rotated_row(0), bits(DType::kFloat16, kKey));  // position 0: the identity
    EXPECT_EQ(t.q_rotated_row(1),
              per_row ? bits(DType::kFloat16, {-3, -4, 1, 2, 5, 6, 7, 8}) : bits(DType::kFloat16, kKey));
  }
}

TEST(KVCacheReference, SequenceThatDoesNotFitWritesNothingAndKeepsQ) {
  Tiny t(DType::kBFloat16, 2, 1, {kKey, kKey});  // 1 + 2 > capacity 2
  t.rotary(4, /*interleaved=*/false, {{0, 0}, {0, 0}, {0, 0}}, {{1, 1}, {1, 1}, {1, 1}});
  t.queries({kKey}, /*per_row=*/true);
  cpu_reference::append_kv(t.p);
  EXPECT_EQ(t.k_cache, std::vector<uint16_t>(2 * kDim, kUntouched));
  EXPECT_EQ(t.v_cache, std::vector<uint16_t>(2 * kDim, kUntouched));
  EXPECT_EQ(t.key_end, std::vector<int32_t>{kAppendFault});
  EXPECT_EQ(t.q_rotated_row(0), bits(DType::kBFloat16, kKey));  // copied, not rotated
}

// Paged: pages of 2 positions, sequence 0 in page-table row 1 (cache_batch_idx), whose pages are
// {2, 0}; 2 new tokens at positions 1 and 2 land in page 2 row 1 and page 0 row 0.
TEST(KVCacheReference, PlacesTokensInPagesOfTheSequencesCacheRow) {
  Tiny t(DType::kFloat16, 4, 1, {kKey, {8, 7, 6, 5, 4, 3, 2, 1}});
  const int num_pages = 3, page_size = 2;
  t.k_cache.assign(size_t(num_pages) * page_size * kDim, kUntouched);
  t.v_cache = t.k_cache;
  const std::vector<int32_t> page_table = {1, 1, 2, 0}, batch_index = {1};
  t.p.k_cache = RowTensor{t.k_cache.data(), page_size * kDim, kDim, kDim};
  t.p.v_cache = RowTensor{t.v_cache.data(), page_size * kDim, kDim, kDim};
  t.p.cache.page_table = page_table.data();
  t.p.cache.page_table_stride = 2;
  t.p.cache.page_size = FastDivisor(page_size);
  t.p.cache.num_pages = num_pages;
  t.p.cache.max_pages = 2;
  t.p.cache.rows = 2;
  t.p.cache.batch_index = batch_index.data();
  cpu_reference::append_kv(t.p);
  std::vector<uint16_t> expected(t.k_cache.size(), kUntouched);
  const std::vector<uint16_t> first = bits(DType::kFloat16, kKey);
  const std::vector<uint16_t> second = bits(DType::kFloat16, {8, 7, 6, 5, 4, 3, 2, 1});
  std::copy(first.begin(), first.end(), expected.begin() + (2 * page_size + 1) * kDim);
  std::copy(second.begin(), second.end(), expected.begin() + (0 * page_size + 0) * kDim);
  EXPECT_EQ(t.k_cache, expected);
  EXPECT_EQ(t.key_end, std::vector<int32_t>{3});
}

// Each rotated entry is the element type's nearest value to the rotation computed in float64 (up
// to fp32's error, far below half a unit in the last place of fp16 or bf16).
TEST(KVCacheReference, RotationRoundsOnceToTheNearestElement) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const std::vector<uint16_t> key = testing::random_normal_bits(dtype, kDim, 7);
    const std::vector<uint16_t> cos = testing::random_normal_bits(dtype, kDim / 2, 8);
    const std::vector<uint16_t> sin = testing::random_normal_bits(dtype, kDim / 2, 9);
    auto value = [&](uint16_t b) { return testing::bits_value(dtype, b); };
    std::vector<float> key_values, cos_values, sin_values;
    for (uint16_t b : key) key_values.push_back(float(value(b)));
    for (int i = 0; i < kDim / 2; ++i) {
      cos_values.push_back(float(value(cos[i])));
      sin_values.push_back(float(value(sin[i])));
    }
    Tiny t(dtype, 1, 0, {key_values});
    t.rotary(kDim, /*interleaved=*/false, {cos_values}, {sin_values});
    cpu_reference::append_kv(t.p);
    for (int j = 0; j < kDim; ++j) {
      const int i = j % (kDim / 2);
      const double x = value(key[j]), partner = value(key[(j + kDim / 2) % kDim]);
      const double exact = x * value(cos[i]) + (j < kDim / 2 ? -1 : 1) * partner * value(sin[i]);
      const uint16_t got = t.k_cache[j];
      // The neighbours in magnitude of a nonzero fp16/bf16 value are its bit pattern -+ 1.
      const double error = std::abs(value(got) - exact);
      const double slack = 1e-6 * std::abs(exact);
      EXPECT_LE(error, std::abs(value(uint16_t(got + 1)) - exact) + slack) << j;
      EXPECT_LE(error, std::abs(value(uint16_t(got - 1)) - exact) + slack) << j;
    }
  }
}

}  // namespace
}  // namespace hopattn
