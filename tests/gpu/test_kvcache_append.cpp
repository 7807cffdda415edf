// launch_append_kv against the CPU reference of the append (reference/kvcache_reference.hpp),
// bitwise: random inputs in both dtypes; contiguous caches and paged ones (pages of 1, 16 and 256
// positions, shuffled page tables); cache_batch_idx; varlen new tokens and queries; rotary in both
// layouts over part of the head, all of it or none, q rotated per row or at the start; values
// narrower and wider than the keys (head_dim_v). The whole cache is compared (what the append does
// not write must keep its random fill), and q_rotated and key_end. Then sequences whose append
// does not fit (overfull, negative length, a cache row or a page outside the cache, rotary
// positions past the table): nothing of theirs is written, their key_end is kAppendFault, and the
// other sequences are appended as usual.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "kernels/kvcache/append_kv.hpp"
#include "reference/kvcache_reference.hpp"
#include "testing/device_buffer.hpp"
#include "testing/random_inputs.hpp"

namespace hopattn::testing {
namespace {

using AppendKV = HopperTest;

class Append;

struct AppendSpec {
  DType dtype = DType::kBFloat16;
  int heads = 8;
  int heads_kv = 2;
  int head_dim = 128;
  int head_dim_v = 0;                               // of v_new and v_cache; 0: head_dim
  std::vector<int32_t> cache_seqlens = {0, 7, 30};  // one per sequence
  int seqlen_new = 1;                               // 0: no k_new/v_new
  std::vector<int32_t> varlen_new;                  // non-empty: varlen, each sequence's new tokens
  bool rotate_q = true;                             // q_rotated set (a copy of q where rotary_dim is 0)
  int seqlen_q = 1;
  std::vector<int32_t> varlen_q;  // non-empty: varlen, each sequence's query rows
  // Varlen: pass 1 as seqlen_new/seqlen_q instead of the maxima, so that the grid is too small and
  // the CTAs' loop must cover the rest.
  bool understate_maxima = false;
  int capacity = 40;         // paged: rounded up to whole pages
  int page_size = 0;         // 0: contiguous
  bool batch_index = false;  // sequence b uses cache row batch - b (row 0 is nobody's)
  int rotary_dim = 0;
  bool interleaved = false;
  bool q_positions_per_row = false;
  bool rotary_start = false;  // positions from cache_seqlens[b] / 2 instead of cache_seqlens[b]
  int row_padding = 0;        // extra elements in every row stride (a multiple of 8)
  // Makes some sequences' appends not fit, by editing the host arrays before they are uploaded;
  // `faulted` lists those sequences.
  std::function<void(Append&)> fault;
  std::vector<int> faulted;
  uint64_t seed = 0;
};

struct NamedSpec {
  std::string name;
  AppendSpec spec;
};
void PrintTo(const NamedSpec& c, std::ostream* os) { *os << c.name; }

// A host array and its device copy.
template <typename T>
struct Mirrored {
  std::vector<T> host;
  DeviceBuffer device;

  size_t bytes() const { return host.size() * sizeof(T); }
  void upload() {
    device = DeviceBuffer(bytes());
    if (!host.empty()) device.upload(host.data(), bytes());
  }
  std::vector<T> download() const {
    std::vector<T> out(host.size());
    if (!host.empty()) device.download(out.data(), bytes());
    return out;
  }
  // Null where the array is absent.
  T* pointer(bool on_device) {
    if (host.empty()) return nullptr;
    return on_device ? static_cast<T*>(device.data()) : host.data();
  }
};

// The arrays of one append, built from a spec; params() points into the host arrays or into
// their device copies, with the same layout.
class Append {
 public:
  explicit Append(const AppendSpec& s) : spec_(s) {
    const int batch = static_cast<int>(s.cache_seqlens.size());
    rows = batch + 1;
    std::mt19937_64 rng(s.seed);
    uint64_t stream = s.seed * 100;
    auto random_bits = [&](size_t n) { return random_normal_bits(s.dtype, n, ++stream); };

    p_.dtype = s.dtype;
    p_.batch = batch;
    p_.heads = s.heads;
    p_.heads_kv = s.heads_kv;
    p_.head_dim = s.head_dim;
    p_.head_dim_v = s.head_dim_v > 0 ? s.head_dim_v : s.head_dim;
    const int64_t k_row = int64_t(s.heads_kv) * s.head_dim + s.row_padding;
    const int64_t v_row = int64_t(s.heads_kv) * p_.head_dim_v + s.row_padding;
    const int64_t q_row = int64_t(s.heads) * s.head_dim + s.row_padding;

    // New tokens, fixed or varlen.
    int max_new = s.seqlen_new;
    int64_t total_new = int64_t(batch) * s.seqlen_new;
    if (!s.varlen_new.empty()) {
      cu_seqlens_new.host = prefix_sums(s.varlen_new);
      total_new = cu_seqlens_new.host.back();
      max_new = *std::max_element(s.varlen_new.begin(), s.varlen_new.end());
      p_.total_new = total_new;
    }
    p_.seqlen_new = s.understate_maxima ? 1 : max_new;
    if (max_new > 0) {
      k_new.host = random_bits(total_new * k_row);
      v_new.host = random_bits(total_new * v_row);
      const int64_t tokens = s.varlen_new.empty() ? s.seqlen_new : 0;  // batch stride in rows
      p_.k_new = RowTensor{nullptr, tokens * k_row, k_row, s.head_dim};
      p_.v_new = RowTensor{nullptr, tokens * v_row, v_row, p_.head_dim_v};
    }

    // The cache, filled with random values that must survive where nothing is appended.
    cache_seqlens.host = s.cache_seqlens;
    capacity = s.capacity;
    int64_t cache_batches = rows;
    int64_t cache_tokens = capacity;
    if (s.page_size > 0) {
      const int max_pages = (s.capacity + s.page_size - 1) / s.page_size;
      capacity = max_pages * s.page_size;
      num_pages = rows * max_pages + 2;  // two pages nobody owns
      std::vector<int32_t> pages(num_pages);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      page_table_stride = max_pages + 1;  // a column the append must never read: -1
      page_table.host.assign(size_t(rows) * page_table_stride, -1);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < max_pages; ++j) page_table.host[r * page_table_stride + j] = pages[r * max_pages + j];
      p_.cache.page_table_stride = page_table_stride;
      p_.cache.page_size = FastDivisor(s.page_size);
      p_.cache.num_pages = num_pages;
      p_.cache.max_pages = max_pages;
      cache_batches = num_pages;
      cache_tokens = s.page_size;
    }
    k_cache.host = random_bits(cache_batches * cache_tokens * k_row);
    v_cache.host = random_bits(cache_batches * cache_tokens * v_row);
    p_.k_cache = RowTensor{nullptr, cache_tokens * k_row, k_row, s.head_dim};
    p_.v_cache = RowTensor{nullptr, cache_tokens * v_row, v_row, p_.head_dim_v};
    p_.cache.rows = rows;
    p_.capacity = capacity;
    if (s.batch_index) {
      for (int b = 0; b < batch; ++b) batch_index.host.push_back(batch - b);
    }

    // q, fixed or varlen; q_rotated starts as random values too, every row of which is written.
    int max_q = s.seqlen_q;
    int64_t total_q = int64_t(batch) * s.seqlen_q;
    if (!s.varlen_q.empty()) {
      cu_seqlens_q.host = prefix_sums(s.varlen_q);
      total_q = cu_seqlens_q.host.back();
      max_q = *std::max_element(s.varlen_q.begin(), s.varlen_q.end());
      p_.total_q = total_q;
    }
    p_.seqlen_q = s.understate_maxima ? 1 : max_q;
    q.host = random_bits(total_q * q_row);
    if (s.rotate_q) q_rotated.host = random_bits(total_q * q_row);
    const int64_t q_batch_stride = s.varlen_q.empty() ? s.seqlen_q * q_row : 0;
    p_.q = p_.q_rotated = RowTensor{nullptr, q_batch_stride, q_row, s.head_dim};
    p_.q_positions_per_row = s.q_positions_per_row;

    // Rotary: cos/sin rows wider than rotary_dim / 2, enough of them for every position.
    if (s.rotary_dim > 0) {
      rotary_positions = capacity + max_q;
      const int64_t stride = s.rotary_dim / 2 + 5;
      cos.host = random_bits(rotary_positions * stride);
      sin.host = random_bits(rotary_positions * stride);
      p_.rotary_dim = s.rotary_dim;
      p_.rotary_interleaved = s.interleaved;
      p_.rotary_row_stride = stride;
      p_.rotary_positions = rotary_positions;
      if (s.rotary_start) {
        for (int32_t filled : s.cache_seqlens) rotary_start.host.push_back(std::max(filled / 2, 0));
      }
    }
    key_end.host.assign(batch, -7);
  }

  void upload() {
    for (Mirrored<uint16_t>* a : {&k_new, &v_new, &k_cache, &v_cache, &q, &q_rotated, &cos, &sin}) a->upload();
    for (Mirrored<int32_t>* a :
         {&cu_seqlens_new, &cu_seqlens_q, &cache_seqlens, &batch_index, &page_table, &rotary_start, &key_end}) {
      a->upload();
    }
  }

  AppendKVParams params(bool on_device) {
    AppendKVParams p = p_;
    p.k_new.data = k_new.pointer(on_device);
    p.v_new.data = v_new.pointer(on_device);
    p.cu_seqlens_new = cu_seqlens_new.pointer(on_device);
    p.k_cache.data = k_cache.pointer(on_device);
    p.v_cache.data = v_cache.pointer(on_device);
    p.cache.page_table = page_table.pointer(on_device);
    p.cache.batch_index = batch_index.pointer(on_device);
    p.cache_seqlens = cache_seqlens.pointer(on_device);
    p.rotary_cos = cos.pointer(on_device);
    p.rotary_sin = sin.pointer(on_device);
    p.rotary_start = rotary_start.pointer(on_device);
    p.q.data = q.pointer(on_device);
    p.q_rotated.data = q_rotated.pointer(on_device);
    p.cu_seqlens_q = cu_seqlens_q.pointer(on_device);
    p.key_end = key_end.pointer(on_device);
    return p;
  }

  // New tokens of sequence b (whatever its append's fate).
  int new_tokens(int b) const {
    if (!spec_.varlen_new.empty()) return spec_.varlen_new[b];
    return spec_.seqlen_new;
  }

  Mirrored<uint16_t> k_new, v_new, k_cache, v_cache, q, q_rotated, cos, sin;
  Mirrored<int32_t> cu_seqlens_new, cu_seqlens_q, cache_seqlens, batch_index, page_table, rotary_start, key_end;
  int rows = 0;  // of the cache (of the page table when paged)
  int capacity = 0;
  int num_pages = 0;
  int64_t page_table_stride = 0;
  int rotary_positions = 0;

 private:
  static std::vector<int32_t> prefix_sums(const std::vector<int32_t>& counts) {
    std::vector<int32_t> sums = {0};
    for (int32_t c : counts) sums.push_back(sums.back() + c);
    return sums;
  }

  AppendSpec spec_;
  AppendKVParams p_;
};

// Expects two arrays to hold the same bits, reporting how many entries differ and the first.
void expect_same_bits(const char* what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& expected) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = got.size(); i-- > 0;) {
    if (got[i] != expected[i]) {
      ++differ;
      first = i;
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " entries differ, the first at " << first
                        << " (got 0x" << std::hex << got[first] << ", expected 0x" << expected[first] << ")";
}

// Head rows (head_dim entries) that differ between two copies of an unpadded cache.
size_t changed_head_rows(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int head_dim) {
  size_t changed = 0;
  for (size_t row = 0; row < a.size() / head_dim; ++row) {
    changed += !std::equal(a.begin() + row * head_dim, a.begin() + (row + 1) * head_dim, b.begin() + row * head_dim);
  }
  return changed;
}

void run_and_compare(const AppendSpec& spec) {
  Append a(spec);
  if (spec.fault) spec.fault(a);
  a.upload();
  const std::vector<uint16_t> cache_before = a.k_cache.host;
  ASSERT_EQ(launch_append_kv(a.params(/*on_device=*/true), nullptr), cudaSuccess);
  check_cuda(cudaDeviceSynchronize(), "append_kv");
  cpu_reference::append_kv(a.params(/*on_device=*/false));

  const std::vector<uint16_t> k_cache = a.k_cache.download();
  expect_same_bits("k_cache", k_cache, a.k_cache.host);
  expect_same_bits("v_cache", a.v_cache.download(), a.v_cache.host);
  expect_same_bits("q_rotated", a.q_rotated.download(), a.q_rotated.host);
  EXPECT_EQ(a.key_end.download(), a.key_end.host);

  // The faults on their own terms, not only through the reference: the faulted sequences' key_end,
  // and no head row written but the other sequences' new ones.
  if (spec.faulted.empty()) return;
  ASSERT_EQ(spec.row_padding, 0);
  const std::vector<int32_t> key_end = a.key_end.download();
  size_t appended_rows = 0;
  for (int b = 0; b < static_cast<int>(spec.cache_seqlens.size()); ++b) {
    const bool faulted = std::find(spec.faulted.begin(), spec.faulted.end(), b) != spec.faulted.end();
    if (faulted) {
      EXPECT_EQ(key_end[b], kAppendFault) << "sequence " << b;
    } else {
      EXPECT_EQ(key_end[b], a.cache_seqlens.host[b] + a.new_tokens(b)) << "sequence " << b;
      appended_rows += size_t(a.new_tokens(b)) * spec.heads_kv;
    }
  }
  EXPECT_EQ(changed_head_rows(cache_before, k_cache, spec.head_dim), appended_rows);
}

class AppendSweep : public AppendKV, public ::testing::WithParamInterface<NamedSpec> {};

TEST_P(AppendSweep, MatchesCpuReferenceBitwise) { run_and_compare(GetParam().spec); }

std::vector<NamedSpec> sweep_cases() {
  std::vector<NamedSpec> all;
  auto add = [&](std::string name, AppendSpec s) {
    s.seed = 100 + all.size();
    all.push_back({std::move(name), std::move(s)});
  };
  AppendSpec s;
  add("decode_bf16_no_rotary", s);

  s = AppendSpec{};
  s.dtype = DType::kFloat16;
  s.rotary_dim = 64;
  s.q_positions_per_row = true;
  add("decode_fp16_rotary64_neox", s);

  s = AppendSpec{};
  s.rotary_dim = 128;
  s.interleaved = true;
  add("decode_bf16_rotary_whole_head_gptj", s);

  // The typical decode step: 32 query heads over 8 KV heads, a batch of 64 in pages of 16.
  s = AppendSpec{};
  s.heads = 32;
  s.heads_kv = 8;
  s.cache_seqlens.clear();
  for (int b = 0; b < 64; ++b) s.cache_seqlens.push_back((b * 37) % 300);
  s.capacity = 301;
  s.page_size = 16;
  s.rotary_dim = 128;
  add("decode_batch64_h32x8_paged16_rotary_neox", s);

  s = AppendSpec{};
  s.seqlen_new = 5;
  s.seqlen_q = 5;
  s.rotary_dim = 64;
  s.interleaved = true;
  s.q_positions_per_row = true;
  s.row_padding = 16;
  add("chunk5_bf16_rotary64_gptj_per_row_strided", s);

  s = AppendSpec{};
  s.seqlen_new = 4;
  s.seqlen_q = 4;
  s.dtype = DType::kFloat16;
  s.rotary_dim = 128;
  s.q_positions_per_row = false;
  add("chunk4_fp16_rotary_neox_q_at_start", s);

  s = AppendSpec{};
  s.page_size = 1;
  s.seqlen_new = 3;
  s.rotary_dim = 64;
  s.batch_index = true;
  add("paged1_cache_batch_idx_rotary64_neox", s);

  s = AppendSpec{};
  s.page_size = 16;
  s.cache_seqlens = {0, 15, 30, 47};
  s.capacity = 64;
  s.varlen_new = {0, 17, 3, 1};
  s.varlen_q = {1, 17, 3, 0};
  s.rotary_dim = 128;
  s.rotary_start = true;
  s.q_positions_per_row = true;
  s.batch_index = true;
  add("paged16_varlen_rotary_start_neox", s);

  s = AppendSpec{};
  s.dtype = DType::kFloat16;
  s.page_size = 256;
  s.capacity = 300;
  s.cache_seqlens = {0, 254, 300};
  s.seqlen_new = 3;  // sequence 1 crosses from its first page into its second
  s.rotary_dim = 64;
  s.interleaved = true;
  add("paged256_across_pages_rotary64_gptj", s);

  s = AppendSpec{};
  s.heads = 8;
  s.heads_kv = 1;
  s.head_dim = 64;
  s.rotary_dim = 64;
  s.dtype = DType::kFloat16;
  add("d64_mqa_fp16_rotary_whole_head", s);

  s = AppendSpec{};
  s.head_dim = 256;
  s.rotary_dim = 128;
  s.seqlen_new = 2;
  s.page_size = 16;
  add("d256_rotary128_neox", s);

  // Values with a head dim of their own, narrower (DeepSeek's 192 / 128) and wider than the keys':
  // a row's threads cover the wider one.
  s = AppendSpec{};
  s.head_dim = 192;
  s.head_dim_v = 128;
  s.rotary_dim = 64;
  s.seqlen_new = 3;
  s.seqlen_q = 3;
  s.q_positions_per_row = true;
  s.page_size = 16;
  add("d192_v128_paged16_rotary64_neox", s);
  s = AppendSpec{};
  s.head_dim = 64;
  s.head_dim_v = 256;
  s.rotary_dim = 64;
  s.interleaved = true;
  s.row_padding = 8;
  add("d64_v256_rotary_whole_head_gptj_strided", s);

  // A head dim that is not a multiple of 16, rotated in part.
  s = AppendSpec{};
  s.head_dim = 72;
  s.rotary_dim = 64;
  s.seqlen_q = 2;
  s.q_positions_per_row = true;
  add("d72_rotary64_neox", s);
  s.rotary_dim = 48;
  s.interleaved = true;
  add("d72_rotary48_gptj", s);

  s = AppendSpec{};
  s.rotate_q = false;
  s.rotary_dim = 64;
  add("q_not_rotated", s);

  s = AppendSpec{};
  s.seqlen_new = 0;
  add("no_new_tokens_q_copied", s);

  s = AppendSpec{};
  s.varlen_new = {40, 2, 0};
  s.cache_seqlens = {0, 3, 40};
  s.varlen_q = {40, 2, 5};
  s.understate_maxima = true;
  s.rotary_dim = 64;
  s.q_positions_per_row = true;
  add("varlen_maxima_understated_rows_looped", s);
  return all;
}

INSTANTIATE_TEST_SUITE_P(KVCacheAppend, AppendSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<NamedSpec>& info) { return info.param.name; });

class AppendFaults : public AppendKV, public ::testing::WithParamInterface<NamedSpec> {};

TEST_P(AppendFaults, NothingOfAFaultedSequenceIsWritten) { run_and_compare(GetParam().spec); }

std::vector<NamedSpec> fault_cases() {
  std::vector<NamedSpec> all;
  auto add = [&](std::string name, AppendSpec s) {
    s.seed = 200 + all.size();
    all.push_back({std::move(name), std::move(s)});
  };
  AppendSpec s;
  s.seqlen_new = 2;
  s.seqlen_q = 2;
  s.rotary_dim = 64;
  s.q_positions_per_row = true;
  const AppendSpec base = s;

  s.cache_seqlens = {3, 39, 10};  // 39 + 2 > 40
  s.faulted = {1};
  add("overfull", s);

  s = base;
  s.cache_seqlens = {-1, 5, 10};
  s.faulted = {0};
  add("negative_cache_seqlens", s);

  s = base;
  s.batch_index = true;
  s.fault = [](Append& a) {
    a.batch_index.host[1] = a.rows;
    a.batch_index.host[2] = -1;
  };
  s.faulted = {1, 2};
  add("cache_batch_idx_outside_cache", s);

  s = base;
  s.page_size = 16;
  s.cache_seqlens = {3, 20, 15};
  s.fault = [](Append& a) {
    a.page_table.host[1 * a.page_table_stride + 20 / 16] = -1;
    a.page_table.host[2 * a.page_table_stride + 1] = a.num_pages;  // position 16, the second new token
  };
  s.faulted = {1, 2};
  add("page_outside_cache", s);

  s = base;
  s.rotary_start = true;
  s.fault = [](Append& a) { a.rotary_start.host[2] = a.rotary_positions - 1; };
  s.faulted = {2};
  add("rotary_positions_past_table", s);
  return all;
}

INSTANTIATE_TEST_SUITE_P(KVCacheAppend, AppendFaults, ::testing::ValuesIn(fault_cases()),
                         [](const ::testing::TestParamInfo<NamedSpec>& info) { return info.param.name; });

}  // namespace
}  // namespace hopattn::testing
