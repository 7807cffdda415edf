// The KV-cache call (forward_kvcache) and the paged forward (ForwardArgs::page_table) over the
// parameter space of FlashAttention-3's kvcache tests: query rows 1 to past a tile, fixed and
// varlen queries, caches from empty to full, new keys appended (0, 1 or several per sequence),
// rotary embedding in both layouts, contiguous and paged caches (page sizes 1 to 256 with shuffled
// page tables; pages that hold whole key blocks, whole boxes of 16 keys, or neither), cache_batch_idx, left
// padding, causal and local masks, MHA/GQA/MQA, kernel and non-kernel head dims, key splits. Each
// call is checked three ways: the cache after the call bitwise against the CPU append reference
// (new rows rotated where asked, every other element unchanged), O and LSE against the float64
// CPU reference on the keys the cache then holds (FA3's rule), and, for the caller's errors that
// only the device can see (a page outside the cache, an overfull cache), NaN rows for exactly the
// sequences concerned with nothing written outside the cache. A graph captured once replays
// correctly with the cache lengths and the page table changed between replays.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "kernel_cases.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/kvcache_reference.hpp"
#include "testing/device_buffer.hpp"
#include "testing/random_inputs.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {
namespace {

using KVCache = HopperTest;

struct KVCacheSpec {
  DType dtype = DType::kBFloat16;
  int head_dim = 128;
  int heads = 6;
  int heads_kv = 3;
  int batch = 3;
  int seqlen_q = 1;
  std::vector<int> varlen_q;  // non-empty: queries of these lengths through cu_seqlens_q
  int capacity = 512;         // positions per sequence: the cache's length, or max_pages * page_size
  int page_size = 0;          // 0: contiguous
  std::vector<int> cache_seqlens;  // per sequence, before the append
  std::vector<int> leftpad;        // optional
  bool batch_index = false;        // twice as many cache rows, sequences on shuffled ones
  int seqlen_new = 0;              // new keys per sequence
  std::vector<int> varlen_new;     // non-empty: new keys of these counts, packed, through cu_seqlens_new
  int rotary_dim = 0;
  bool rotary_interleaved = false;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  int num_splits = 0;
  PackGqa pack_gqa = PackGqa::kAuto;
  std::vector<float> sinks;  // attention sinks, one per query head; empty: none
  float softcap = 0.f;
  // Through forward() with ForwardArgs::page_table (chunked prefill): no append, no left padding,
  // no batch index; cache_seqlens become varlen.seqused_k.
  bool through_forward = false;
  uint64_t seed = 1;
};

// Host and device copies of one call's tensors, the host ones laid out as on the device.
class KVCacheCall {
 public:
  explicit KVCacheCall(const KVCacheSpec& s) : s_(s) {
    const int b = s.batch;
    cache_rows_ = s.batch_index ? 2 * b : b;
    if (s.page_size > 0) {
      max_pages_ = s.capacity / s.page_size;
      num_pages_ = cache_rows_ * max_pages_ + 3;  // a few pages nobody owns
    }
    const int64_t cache_positions = s.page_size > 0 ? int64_t{num_pages_} * s.page_size : int64_t{cache_rows_} * s.capacity;
    const int64_t row = int64_t{s.heads_kv} * s.head_dim;
    cu_q_.push_back(0);
    for (int i = 0; i < b; ++i) cu_q_.push_back(cu_q_.back() + (s.varlen_q.empty() ? s.seqlen_q : s.varlen_q[i]));
    total_q_ = cu_q_.back();
    max_q_ = s.varlen_q.empty() ? s.seqlen_q : *std::max_element(s.varlen_q.begin(), s.varlen_q.end());

    q_ = random_normal_bits(s.dtype, total_q_ * s.heads * s.head_dim, s.seed);
    k_cache_ = random_normal_bits(s.dtype, cache_positions * row, s.seed + 1);
    v_cache_ = random_normal_bits(s.dtype, cache_positions * row, s.seed + 2);
    cu_new_.push_back(0);
    for (int i = 0; i < b; ++i) cu_new_.push_back(cu_new_.back() + (s.varlen_new.empty() ? s.seqlen_new : s.varlen_new[i]));
    k_new_ = random_normal_bits(s.dtype, cu_new_.back() * row, s.seed + 3);
    v_new_ = random_normal_bits(s.dtype, cu_new_.back() * row, s.seed + 4);
    rotary_positions_ = s.capacity + max_q_;
    cos_ = random_normal_bits(s.dtype, int64_t{rotary_positions_} * std::max(s.rotary_dim / 2, 1), s.seed + 5);
    sin_ = random_normal_bits(s.dtype, int64_t{rotary_positions_} * std::max(s.rotary_dim / 2, 1), s.seed + 6);

    std::mt19937 rng(static_cast<uint32_t>(s.seed));
    rows_.resize(b);
    std::vector<int> all_rows(cache_rows_);
    std::iota(all_rows.begin(), all_rows.end(), 0);
    if (s.batch_index) std::shuffle(all_rows.begin(), all_rows.end(), rng);
    for (int i = 0; i < b; ++i) rows_[i] = all_rows[i];
    if (s.page_size > 0) {
      std::vector<int> pages(num_pages_);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      table_.assign(pages.begin(), pages.begin() + int64_t{cache_rows_} * max_pages_);
    }
    cache_seqlens_ = s.cache_seqlens;
    leftpad_ = s.leftpad;
  }

  const KVCacheSpec& spec() const { return s_; }
  std::vector<int32_t>& table() { return table_; }
  std::vector<int32_t>& cache_seqlens() { return cache_seqlens_; }

  // Uploads every input (the cache in its initial state) and poisons the outputs, into the same
  // device buffers on later calls (a captured graph keeps their addresses).
  void upload() {
    auto up = [](DeviceBuffer& d, const auto& host) {
      const size_t bytes = host.size() * sizeof(host[0]);
      if (d.bytes() != std::max<size_t>(bytes, 16)) d = DeviceBuffer(std::max<size_t>(bytes, 16));
      if (bytes > 0) d.upload(host.data(), bytes);
    };
    up(q_d_, q_);
    up(k_cache_d_, k_cache_);
    up(v_cache_d_, v_cache_);
    up(k_new_d_, k_new_);
    up(v_new_d_, v_new_);
    up(cos_d_, cos_);
    up(sin_d_, sin_);
    up(cu_q_d_, cu_q_);
    up(cu_new_d_, cu_new_);
    up(table_d_, table_);
    up(rows_d_, rows_);
    up(cache_seqlens_d_, cache_seqlens_);
    up(leftpad_d_, leftpad_);
    up(sinks_d_, s_.sinks);
    const size_t o_bytes = std::max<size_t>(total_q_ * s_.heads * s_.head_dim * sizeof(uint16_t), 16);
    const size_t lse_bytes = std::max<size_t>(total_q_ * s_.heads * sizeof(float), 16);
    if (o_d_.bytes() != o_bytes) o_d_ = DeviceBuffer(o_bytes);
    if (lse_d_.bytes() != lse_bytes) lse_d_ = DeviceBuffer(lse_bytes);
    o_d_.fill_bytes(0xFF);
    lse_d_.fill_bytes(0xFF);
  }

  KVCacheArgs kvcache_args() const {
    const KVCacheSpec& s = s_;
    KVCacheArgs a;
    const bool varlen = !s.varlen_q.empty();
    const int64_t hd = s.head_dim;
    if (varlen) {
      a.q = make_tensor(q_d_.data(), s.dtype, {total_q_, s.heads, hd});
      a.o = make_tensor(o_d_.data(), s.dtype, {total_q_, s.heads, hd});
      a.lse = make_tensor(lse_d_.data(), DType::kFloat32, {s.heads, total_q_});
      a.cu_seqlens_q = IntArray{static_cast<const int32_t*>(cu_q_d_.data()), s.batch + 1};
      a.max_seqlen_q = max_q_;
    } else {
      a.q = make_tensor(q_d_.data(), s.dtype, {s.batch, s.seqlen_q, s.heads, hd});
      a.o = make_tensor(o_d_.data(), s.dtype, {s.batch, s.seqlen_q, s.heads, hd});
      a.lse = make_tensor(lse_d_.data(), DType::kFloat32, {s.batch, s.heads, s.seqlen_q});
    }
    if (s.page_size > 0) {
      a.k_cache = make_tensor(k_cache_d_.data(), s.dtype, {num_pages_, s.page_size, s.heads_kv, hd});
      a.v_cache = make_tensor(v_cache_d_.data(), s.dtype, {num_pages_, s.page_size, s.heads_kv, hd});
      a.page_table = PageTable{static_cast<const int32_t*>(table_d_.data()), cache_rows_, max_pages_, 0};
    } else {
      a.k_cache = make_tensor(k_cache_d_.data(), s.dtype, {cache_rows_, s.capacity, s.heads_kv, hd});
      a.v_cache = make_tensor(v_cache_d_.data(), s.dtype, {cache_rows_, s.capacity, s.heads_kv, hd});
    }
    a.cache_seqlens = IntArray{static_cast<const int32_t*>(cache_seqlens_d_.data()), s.batch};
    if (s.batch_index) a.cache_batch_idx = IntArray{static_cast<const int32_t*>(rows_d_.data()), s.batch};
    if (!s.leftpad.empty()) a.cache_leftpad = IntArray{static_cast<const int32_t*>(leftpad_d_.data()), s.batch};
    if (!s.varlen_new.empty()) {
      a.k_new = make_tensor(k_new_d_.data(), s.dtype, {cu_new_.back(), s.heads_kv, hd});
      a.v_new = make_tensor(v_new_d_.data(), s.dtype, {cu_new_.back(), s.heads_kv, hd});
      a.cu_seqlens_new = IntArray{static_cast<const int32_t*>(cu_new_d_.data()), s.batch + 1};
    } else if (s.seqlen_new > 0) {
      a.k_new = make_tensor(k_new_d_.data(), s.dtype, {s.batch, s.seqlen_new, s.heads_kv, hd});
      a.v_new = make_tensor(v_new_d_.data(), s.dtype, {s.batch, s.seqlen_new, s.heads_kv, hd});
    }
    if (s.rotary_dim > 0) {
      a.rotary.cos = make_tensor(cos_d_.data(), s.dtype, {rotary_positions_, s.rotary_dim / 2});
      a.rotary.sin = make_tensor(sin_d_.data(), s.dtype, {rotary_positions_, s.rotary_dim / 2});
      a.rotary.interleaved = s.rotary_interleaved;
    }
    a.mask = Mask{s.causal, s.window_left, s.window_right};
    a.num_splits = s.num_splits;
    a.pack_gqa = s.pack_gqa;
    if (!s.sinks.empty()) a.sinks = make_tensor(sinks_d_.data(), DType::kFloat32, {s.heads});
    a.softcap = s.softcap;
    return a;
  }

  // The same attention through forward() with ForwardArgs::page_table (no append).
  ForwardArgs forward_args() const {
    const KVCacheArgs a = kvcache_args();
    ForwardArgs f;
    f.q = a.q;
    f.k = a.k_cache;
    f.v = a.v_cache;
    f.o = a.o;
    f.lse = a.lse;
    f.page_table = a.page_table;
    f.varlen.cu_seqlens_q = a.cu_seqlens_q;
    f.varlen.max_seqlen_q = a.max_seqlen_q;
    f.varlen.seqused_k = a.cache_seqlens;
    f.mask = a.mask;
    f.num_splits = a.num_splits;
    f.pack_gqa = a.pack_gqa;
    f.sinks = a.sinks;
    f.softcap = a.softcap;
    return f;
  }

  // forward_kvcache (or forward) on `stream` with a poisoned workspace of the size asked for.
  Status run(cudaStream_t stream = nullptr) {
    size_t bytes = 0;
    Status s = s_.through_forward ? forward_workspace_size(forward_args(), &bytes)
                                  : forward_kvcache_workspace_size(kvcache_args(), &bytes);
    if (!s.ok()) return s;
    if (workspace_.bytes() < bytes) {
      workspace_ = DeviceBuffer(bytes);
      workspace_.fill_bytes(0xFF);
    }
    const Workspace w{workspace_.data(), workspace_.bytes()};
    return s_.through_forward ? forward(forward_args(), w, stream) : forward_kvcache(kvcache_args(), w, stream);
  }

  // The append on the host copies, by the CPU reference: the cache as it must be after the call,
  // the rotated q and each sequence's key count.
  struct Expected {
    std::vector<uint16_t> k_cache, v_cache, q;
    std::vector<int32_t> key_end;
  };
  Expected expected() const {
    const KVCacheSpec& s = s_;
    Expected e{k_cache_, v_cache_, q_, std::vector<int32_t>(s.batch)};
    if (s.through_forward || (cu_new_.back() == 0 && s.rotary_dim == 0)) {
      e.key_end = cache_seqlens_;
      return e;
    }
    const bool varlen = !s.varlen_q.empty();
    const int64_t hd = s.head_dim;
    AppendKVParams p;
    p.dtype = s.dtype;
    p.batch = s.batch;
    p.heads = s.heads;
    p.heads_kv = s.heads_kv;
    p.head_dim = s.head_dim;
    p.head_dim_v = s.head_dim;
    const int64_t new_row = int64_t{s.heads_kv} * hd;
    if (!s.varlen_new.empty()) {
      p.k_new = RowTensor{const_cast<uint16_t*>(k_new_.data()), 0, new_row, hd};
      p.v_new = RowTensor{const_cast<uint16_t*>(v_new_.data()), 0, new_row, hd};
      p.cu_seqlens_new = cu_new_.data();
      p.seqlen_new = *std::max_element(s.varlen_new.begin(), s.varlen_new.end());
      p.total_new = cu_new_.back();
    } else if (s.seqlen_new > 0) {
      p.k_new = RowTensor{const_cast<uint16_t*>(k_new_.data()), s.seqlen_new * new_row, new_row, hd};
      p.v_new = RowTensor{const_cast<uint16_t*>(v_new_.data()), s.seqlen_new * new_row, new_row, hd};
      p.seqlen_new = s.seqlen_new;
      p.total_new = int64_t{s.batch} * s.seqlen_new;
    }
    const int64_t positions = s.page_size > 0 ? s.page_size : s.capacity;
    p.k_cache = RowTensor{e.k_cache.data(), positions * new_row, new_row, hd};
    p.v_cache = RowTensor{e.v_cache.data(), positions * new_row, new_row, hd};
    p.cache.rows = cache_rows_;
    p.cache.batch_index = s.batch_index ? rows_.data() : nullptr;
    if (s.page_size > 0) {
      p.cache.page_table = table_.data();
      p.cache.page_table_stride = max_pages_;
      p.cache.page_size = FastDivisor(s.page_size);
      p.cache.num_pages = num_pages_;
      p.cache.max_pages = max_pages_;
    }
    p.capacity = s.capacity;
    p.cache_seqlens = cache_seqlens_.data();
    if (s.rotary_dim > 0) {
      p.rotary_dim = s.rotary_dim;
      p.rotary_interleaved = s.rotary_interleaved;
      p.rotary_cos = cos_.data();
      p.rotary_sin = sin_.data();
      p.rotary_row_stride = s.rotary_dim / 2;
      p.rotary_positions = rotary_positions_;
      const int64_t q_row = int64_t{s.heads} * hd;
      p.q = varlen ? RowTensor{const_cast<uint16_t*>(q_.data()), 0, q_row, hd}
                   : RowTensor{const_cast<uint16_t*>(q_.data()), s.seqlen_q * q_row, q_row, hd};
      p.q_rotated = p.q;
      p.q_rotated.data = e.q.data();
      p.cu_seqlens_q = varlen ? cu_q_.data() : nullptr;
      p.seqlen_q = max_q_;
      p.total_q = total_q_;
      p.q_positions_per_row = s.causal || s.window_left >= 0 || s.window_right >= 0;
    }
    p.key_end = e.key_end.data();
    cpu_reference::append_kv(p);
    return e;
  }

  // The cache position of key j of sequence b (after its left padding), or -1 outside the cache.
  int64_t cache_position(int b, int64_t j) const {
    const int64_t position = (leftpad_.empty() ? 0 : leftpad_[b]) + j;
    const int row = rows_[b];
    if (s_.page_size == 0) return int64_t{row} * s_.capacity + position;
    const int page = table_[int64_t{row} * max_pages_ + position / s_.page_size];
    if (page < 0 || page >= num_pages_) return -1;
    return int64_t{page} * s_.page_size + position % s_.page_size;
  }

  // Whether sequence b's keys fit the cache: its rows must come out NaN otherwise.
  bool sequence_fits(const Expected& e, int b) const {
    const int start = leftpad_.empty() ? 0 : leftpad_[b];
    const int end = e.key_end[b];
    if (end < 0 || end > s_.capacity || start < 0 || start > end) return false;
    for (int64_t j = 0; j < end - start; ++j) {
      if (cache_position(b, j) < 0) return false;
    }
    return true;
  }

  // O and LSE of the call against the float64 reference on the keys the expected cache holds;
  // sequences that do not fit must be NaN in every element.
  void check_attention(const Expected& e) const {
    const KVCacheSpec& s = s_;
    const int64_t hd = s.head_dim;
    const int64_t kv_row = int64_t{s.heads_kv} * hd;
    cpu_reference::HostProblem hp;
    hp.heads = s.heads;
    hp.heads_kv = s.heads_kv;
    hp.head_dim = s.head_dim;
    hp.cu_seqlens_q = cu_q_;
    hp.cu_seqlens_k = {0};
    hp.softmax_scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    hp.sinks.assign(s.sinks.begin(), s.sinks.end());
    hp.softcap = s.softcap;
    std::vector<double> k, v;
    std::vector<bool> fits(s.batch);
    for (int b = 0; b < s.batch; ++b) {
      fits[b] = sequence_fits(e, b);
      const int keys = fits[b] ? e.key_end[b] - (leftpad_.empty() ? 0 : leftpad_[b]) : 0;
      for (int j = 0; j < keys; ++j) {
        const int64_t at = cache_position(b, j) * kv_row;
        for (int64_t i = 0; i < kv_row; ++i) {
          k.push_back(bits_value(s.dtype, e.k_cache[at + i]));
          v.push_back(bits_value(s.dtype, e.v_cache[at + i]));
        }
      }
      hp.cu_seqlens_k.push_back(hp.cu_seqlens_k.back() + keys);
    }
    // Each sequence's mask is aligned with its own lengths (the reference's varlen rule).
    hp.mask = BandMask::from_args(s.causal, s.window_left, s.window_right);
    std::vector<double> q(e.q.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = bits_value(s.dtype, e.q[i]);
    const auto exact = cpu_reference::forward(hp, q, k, v);
    const auto naive = cpu_reference::forward(hp, q, k, v, cpu_reference::rounding_for(s.dtype));

    std::vector<uint16_t> o_bits(total_q_ * s.heads * hd);
    std::vector<float> lse(total_q_ * s.heads);
    o_d_.download(o_bits.data(), o_bits.size() * sizeof(uint16_t));
    lse_d_.download(lse.data(), lse.size() * sizeof(float));
    // The reference's LSE is (heads, total_q); a fixed-length call's is (batch, heads, seqlen_q).
    const bool varlen = !s.varlen_q.empty();
    auto lse_at = [&](int64_t token, int h) {
      if (varlen) return lse[h * total_q_ + token];
      const int64_t b = token / s.seqlen_q, i = token % s.seqlen_q;
      return lse[(b * s.heads + h) * s.seqlen_q + i];
    };
    Downloaded got_o, got_lse;
    got_o.values.resize(o_bits.size());
    got_o.untouched.assign(o_bits.size(), false);
    got_lse.values.resize(lse.size());
    got_lse.untouched.assign(lse.size(), false);
    std::vector<double> exact_o = exact.o, naive_o = naive.o, exact_lse = exact.lse, naive_lse = naive.lse;
    size_t nan_rows_wrong = 0;
    for (int b = 0; b < s.batch; ++b) {
      for (int64_t token = cu_q_[b]; token < cu_q_[b + 1]; ++token) {
        for (int h = 0; h < s.heads; ++h) {
          const int64_t row = token * s.heads + h;
          const double l = lse_at(token, h);
          got_lse.values[h * total_q_ + token] = l;
          bool all_nan = std::isnan(l);
          for (int64_t i = 0; i < hd; ++i) {
            const double x = bits_value(s.dtype, o_bits[row * hd + i]);
            got_o.values[row * hd + i] = x;
            all_nan = all_nan && std::isnan(x);
          }
          if (fits[b]) continue;
          // A faulted sequence: every element NaN, and out of the accuracy check.
          nan_rows_wrong += !all_nan;
          for (int64_t i = 0; i < hd; ++i) got_o.values[row * hd + i] = exact_o[row * hd + i] = naive_o[row * hd + i] = 0;
          got_lse.values[h * total_q_ + token] = exact_lse[h * total_q_ + token] = naive_lse[h * total_q_ + token] = 0;
        }
      }
    }
    EXPECT_EQ(nan_rows_wrong, 0u) << "rows of faulted sequences that are not all NaN";
    expect_ok(check_against_reference("O", got_o, exact_o, naive_o, s.dtype));
    expect_ok(check_against_reference("LSE", got_lse, exact_lse, naive_lse, DType::kFloat32));
  }

  // The cache after the call, bitwise against the expected one (new rows where they belong, every
  // other element untouched).
  void check_cache(const Expected& e) const {
    std::vector<uint16_t> k(k_cache_.size()), v(v_cache_.size());
    k_cache_d_.download(k.data(), k.size() * sizeof(uint16_t));
    v_cache_d_.download(v.data(), v.size() * sizeof(uint16_t));
    size_t k_diff = 0, v_diff = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      k_diff += k[i] != e.k_cache[i];
      v_diff += v[i] != e.v_cache[i];
    }
    EXPECT_EQ(k_diff, 0u) << "elements of k_cache that differ from the expected cache";
    EXPECT_EQ(v_diff, 0u) << "elements of v_cache that differ from the expected cache";
  }

 private:
  KVCacheSpec s_;
  int cache_rows_ = 0;
  int max_pages_ = 0;
  int num_pages_ = 0;
  int64_t total_q_ = 0;
  int max_q_ = 0;
  int rotary_positions_ = 0;
  std::vector<int32_t> cu_q_, cu_new_, table_, rows_, cache_seqlens_, leftpad_;
  std::vector<uint16_t> q_, k_cache_, v_cache_, k_new_, v_new_, cos_, sin_;
  DeviceBuffer q_d_, k_cache_d_, v_cache_d_, k_new_d_, v_new_d_, cos_d_, sin_d_, cu_q_d_, cu_new_d_, table_d_, rows_d_,
      cache_seqlens_d_, leftpad_d_, sinks_d_, o_d_, lse_d_, workspace_;
};

struct NamedKVCase {
  std::string name;
  KVCacheSpec spec;
};
void PrintTo(const NamedKVCase& c, std::ostream* os) { *os << c.name; }

// Every (query rows, capacity) pair with the page size, append, rotary, mask, heads, head dim and
// options rotating through their values, so that each value meets several shapes; cache lengths
// drawn per sequence so that the appended keys fit (empty and full caches included).
std::vector<NamedKVCase> kvcache_cases() {
  struct Shape {
    int seqlen_q, capacity;
  };
  const Shape shapes[] = {{1, 128}, {1, 339 * 2}, {3, 1024}, {64, 800}, {1, 8192}, {16, 4096}, {200, 1024}};
  const int page_sizes[] = {0, 16, 1, 256, 64, 128, 0};
  const int new_keys[] = {1, 0, 3, 1, 0, 16};
  const int rotary[] = {0, 64, 128, 0, 32};
  struct Heads {
    int q, kv;
  };
  const Heads heads[] = {{6, 3}, {6, 6}, {6, 1}, {32, 8}};
  const int head_dims[] = {128, 64, 256, 72, 128};
  const int splits[] = {0, 1, 3};
  std::vector<NamedKVCase> all;
  int i = 0;
  for (const Shape& sh : shapes) {
    for (int variant = 0; variant < 6; ++variant, ++i) {
      KVCacheSpec s;
      s.seqlen_q = sh.seqlen_q;
      s.page_size = page_sizes[i % 7];
      s.capacity = s.page_size > 0 ? (sh.capacity + s.page_size - 1) / s.page_size * s.page_size : sh.capacity;
      s.seqlen_new = std::min(new_keys[i % 6], s.capacity);
      s.rotary_dim = s.seqlen_new > 0 ? rotary[i % 5] : 0;
      s.rotary_interleaved = i % 2 == 1;
      s.heads = heads[i % 4].q;
      s.heads_kv = heads[i % 4].kv;
      s.head_dim = head_dims[i % 5];
      s.rotary_dim = std::min(s.rotary_dim, s.head_dim / 16 * 16);
      s.dtype = i % 7 == 5 ? DType::kFloat16 : DType::kBFloat16;
      s.causal = variant % 3 == 1;
      if (variant % 3 == 2) {
        s.window_left = 40 + i;
        s.window_right = i % 2 == 0 ? 0 : 7;
      }
      s.num_splits = splits[i % 3];
      s.batch_index = i % 4 == 2;
      if (i % 8 == 3) s.varlen_q = {sh.seqlen_q, std::max(sh.seqlen_q / 2, 1), 0};
      // Unequal new keys per sequence (cu_seqlens_new): one sequence appends none.
      if (i % 6 == 5) s.varlen_new = {s.seqlen_new, 0, std::max(s.seqlen_new / 2, 1)};
      if (i % 9 == 4) {
        for (int h = 0; h < s.heads; ++h) s.sinks.push_back(static_cast<float>(h % 5) - 1.5f);
      }
      if (i % 7 == 2) s.softcap = 30.f;
      s.seed = 3000 + 17 * i;
      std::mt19937 rng(static_cast<uint32_t>(s.seed));
      const int most = s.capacity - s.seqlen_new;
      for (int b = 0; b < s.batch; ++b) {
        // First sequence empty, second full, the rest anywhere.
        const int filled = b == 0 ? 0 : (b == 1 ? most : static_cast<int>(rng() % (most + 1)));
        s.cache_seqlens.push_back(filled);
      }
      if (i % 5 == 4) {
        for (int b = 0; b < s.batch; ++b) s.leftpad.push_back(s.cache_seqlens[b] > 0 ? static_cast<int>(rng() % s.cache_seqlens[b]) : 0);
      }
      const std::string mask = s.causal ? "causal" : (s.window_left >= 0 ? "local" : "full");
      std::string name = "c" + std::to_string(i) + "_q" + std::to_string(s.seqlen_q) + (s.varlen_q.empty() ? "" : "varlen") + "_cap" +
                         std::to_string(s.capacity) + (s.page_size ? "_page" + std::to_string(s.page_size) : "_contiguous") +
                         "_new" + std::to_string(s.seqlen_new) + "_rot" + std::to_string(s.rotary_dim) +
                         (s.rotary_dim > 0 && s.rotary_interleaved ? "i" : "") + "_h" + std::to_string(s.heads) + "x" +
                         std::to_string(s.heads_kv) + "_d" + std::to_string(s.head_dim) +
                         (s.dtype == DType::kFloat16 ? "_fp16_" : "_bf16_") + mask + "_splits" +
                         std::to_string(s.num_splits) + (s.batch_index ? "_batchidx" : "") +
                         (s.leftpad.empty() ? "" : "_leftpad") + (s.varlen_new.empty() ? "" : "_varlennew") + (s.sinks.empty() ? "" : "_sinks") + (s.softcap > 0 ? "_softcap" : "");
      all.push_back({name, s});
    }
  }
  // Chunked prefill through forward() with a page table: varlen queries against paged caches of
  // `capacity` keys, the second sequence's `full` of them.
  auto chunked_prefill = [](int page, int capacity, int full, int head_dim, int seed) {
    KVCacheSpec s;
    s.through_forward = true;
    s.varlen_q = {300, 1, 77};
    s.page_size = page;
    s.capacity = capacity;
    s.cache_seqlens = {1500, full, 400};
    s.heads = 8;
    s.heads_kv = 2;
    s.head_dim = head_dim;
    s.causal = true;
    s.seed = seed;
    return s;
  };
  for (int page : {16, 128, 256, 3, 48, 192}) {
    all.push_back({"chunked_prefill_page" + std::to_string(page),
                   chunked_prefill(page, (2000 + page - 1) / page * page, 2000 / page * page, 128, 4000 + page)});
  }
  // The key-group-major kernel (page boxes in one copy each, fwd_page_rows_tma.hpp) at other head
  // dims: d256 and d192 (4 and 3 chunks a row), and d64 (on the d128 kernel where no d64 one is
  // built: its second chunk lies past the tensor and reads zeros).
  for (const auto& [page, head_dim] : {std::pair{16, 256}, std::pair{64, 192}, std::pair{16, 64}, std::pair{64, 128}}) {
    all.push_back({"chunked_prefill_page" + std::to_string(page) + "_d" + std::to_string(head_dim),
                   chunked_prefill(page, 2048, 2048, head_dim, 4100 + page + head_dim)});
  }
  // The cases above pack the GQA group's rows (300 queries x 4 heads: 10 tiles, against 12 apart),
  // so they run the packed kernel's key-group-major form; these its plain form.
  for (int page : {16, 64}) {
    KVCacheSpec s = chunked_prefill(page, 2048, 2048, 128, 4300 + page);
    s.pack_gqa = PackGqa::kOff;
    all.push_back({"chunked_prefill_page" + std::to_string(page) + "_unpacked", s});
  }
  // Decode over 64-key pages, with an append: the narrow tile's 64-key-block form
  // (ForwardPackedNarrowPageTileConfig) at d128 unsplit, and a split d64 case (on that form of the
  // d128 kernel where no d64 kernel is built, else on d64's narrow tile with page boxes).
  for (const auto& [head_dim, splits] : {std::pair{128, 0}, std::pair{64, 3}}) {
    KVCacheSpec s;
    s.head_dim = head_dim;
    s.heads = 32;
    s.heads_kv = 8;
    s.page_size = 64;
    s.capacity = 4096;
    s.seqlen_new = 1;
    s.causal = true;
    s.num_splits = splits;
    s.cache_seqlens = {0, 4095, 2100};
    s.seed = 4500 + head_dim;
    all.push_back({"decode_page64_narrow_d" + std::to_string(head_dim) + "_splits" + std::to_string(splits), s});
  }
  // The softcap variant's key-group-major kernels, packed and not.
  for (const bool packed : {true, false}) {
    KVCacheSpec s = chunked_prefill(16, 2048, 2048, 128, 4400 + packed);
    s.softcap = 30.f;
    if (!packed) s.pack_gqa = PackGqa::kOff;
    all.push_back({std::string("chunked_prefill_page16_softcap") + (packed ? "" : "_unpacked"), s});
  }
  return all;
}

class KVCacheSweep : public KVCache, public ::testing::WithParamInterface<NamedKVCase> {};

TEST_P(KVCacheSweep, AppendsBitwiseAndMatchesFloat64Reference) {
  const KVCacheSpec& spec = GetParam().spec;
  if (!built_for(spec.dtype, spec.head_dim, 0, spec.softcap)) GTEST_SKIP() << "no kernel for this case in this build";
  KVCacheCall call(spec);
  call.upload();
  const Status s = call.run();
  ASSERT_TRUE(s.ok()) << s.message();
  check_cuda(cudaDeviceSynchronize(), "forward_kvcache");
  const KVCacheCall::Expected e = call.expected();
  call.check_cache(e);
  call.check_attention(e);
}
INSTANTIATE_TEST_SUITE_P(KVCache, KVCacheSweep, ::testing::ValuesIn(kvcache_cases()),
                         [](const auto& info) { return info.param.name; });

KVCacheSpec fault_spec(int page_size) {
  KVCacheSpec s;
  s.batch = 4;
  s.heads = 8;
  s.heads_kv = 2;
  s.page_size = page_size;
  s.capacity = 1024;
  s.seqlen_new = 2;
  s.rotary_dim = 64;
  s.cache_seqlens = {500, 1023, 700, 100};  // sequence 1 overflows with its 2 new keys
  s.causal = true;
  s.sinks = {0.5f, -1.f, 2.f, 0.f, 1.f, -2.f, 3.f, 0.25f};  // faulted rows stay NaN with sinks too
  s.seed = 5000 + page_size;
  return s;
}

// A sequence whose append does not fit, or whose page table names a page outside the cache: its
// rows are NaN, nothing of it is written, the other sequences are exact; with and without splits.
TEST_F(KVCache, OverfullCachesAndBadPagesGiveNaNRows) {
  for (int page_size : {0, 16, 128}) {
    for (int splits : {1, 0, 4}) {
      KVCacheSpec spec = fault_spec(page_size);
      spec.num_splits = splits;
      if (!built_for(spec.dtype, spec.head_dim, 0, spec.softcap)) GTEST_SKIP() << "no kernel for this case in this build";
      KVCacheCall call(spec);
      if (page_size > 0) {
        // Sequence 2: a page past the cache in its used range; sequence 3: a negative one.
        const int max_pages = spec.capacity / page_size;
        call.table()[2 * max_pages + 600 / page_size] = 1 << 30;
        call.table()[3 * max_pages] = -1;
      }
      call.upload();
      std::cout << "    page_size " << page_size << ", num_splits " << splits << ":\n";
      ASSERT_TRUE(call.run().ok());
      check_cuda(cudaDeviceSynchronize(), "forward_kvcache");
      const KVCacheCall::Expected e = call.expected();
      call.check_cache(e);
      call.check_attention(e);
    }
  }
}

// One capture, three replays with other cache lengths and a reshuffled page table written between
// them (what an engine does at every step). The cache grows by the appended keys at each replay,
// so every replay is checked against its own expected cache.
TEST_F(KVCache, GraphReplaysFollowLengthAndTableChanges) {
  KVCacheSpec spec;
  spec.batch = 3;
  spec.heads = 32;
  spec.heads_kv = 8;
  spec.page_size = 16;
  spec.capacity = 4096;
  spec.seqlen_new = 1;
  spec.rotary_dim = 128;
  spec.causal = true;
  spec.cache_seqlens = {4000, 17, 2048};
  spec.seed = 6000;
  if (!built_for(spec.dtype, spec.head_dim, 0, spec.softcap)) GTEST_SKIP() << "no kernel for this case in this build";
  KVCacheCall call(spec);
  call.upload();
  size_t bytes = 0;
  const KVCacheArgs args = call.kvcache_args();
  ASSERT_TRUE(forward_kvcache_workspace_size(args, &bytes).ok());
  const DeviceBuffer workspace(std::max<size_t>(bytes, 16));
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const Status captured = forward_kvcache(args, Workspace{workspace.data(), workspace.bytes()}, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  ASSERT_TRUE(captured.ok()) << captured.message();
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const std::vector<std::vector<int>> steps = {{4000, 17, 2048}, {0, 4095, 1}, {2500, 300, 4094}};
  std::mt19937 rng(7);
  for (const std::vector<int>& lengths : steps) {
    call.cache_seqlens() = lengths;
    std::shuffle(call.table().begin(), call.table().end(), rng);
    call.upload();  // the same device buffers: new lengths and table, the cache reset, outputs poisoned
    check_cuda(cudaGraphLaunch(exec, stream), "replay");
    check_cuda(cudaStreamSynchronize(stream), "replay");
    std::cout << "    cache_seqlens " << lengths[0] << ", " << lengths[1] << ", " << lengths[2] << ":\n";
    const KVCacheCall::Expected e = call.expected();
    call.check_cache(e);
    call.check_attention(e);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace hopattn::testing
