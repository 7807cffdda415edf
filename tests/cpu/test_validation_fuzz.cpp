// Randomised validation: tens of thousands of corrupted argument sets, each of which must come back
// as OK or as kInvalidArgument with a message. Never a crash, never undefined behaviour (build with
// -fsanitize=address,undefined to see that part), never a host read of device memory. Whatever
// validation accepts must also satisfy the documented rules, re-derived here in 128-bit arithmetic
// independently of validate.cpp. The seed is fixed so a failure reproduces (with the same standard
// library, whose distributions it uses); HOPATTN_FUZZ_SEED overrides it for exploratory runs.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int kIterations = 20000;

// Every "device" pointer points into pages the host may not touch, so validation reading tensor
// data, cu_seqlens or seqused on the host (they are device arrays) faults instead of passing by luck.
class NoAccessRegion {
 public:
  static constexpr size_t kSlotBytes = 0x10000;
  static constexpr size_t kBytes = 32 * kSlotBytes;

  NoAccessRegion() : base_(mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)) {}
  ~NoAccessRegion() {
    if (ok()) munmap(base_, kBytes);
  }
  NoAccessRegion(const NoAccessRegion&) = delete;
  NoAccessRegion& operator=(const NoAccessRegion&) = delete;

  bool ok() const { return base_ != MAP_FAILED; }
  // Page aligned, hence 16-byte aligned; distinct per slot.
  char* slot(int i) const { return static_cast<char*>(base_) + i * kSlotBytes; }

 private:
  void* base_;
};

// Two's-complement wrapping, without the undefined behaviour of signed overflow: the generator
// builds absurd sizes and strides on purpose.
int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
int32_t clamp32(int64_t v) { return static_cast<int32_t>(std::clamp<int64_t>(v, kI32Min, kI32Max)); }

enum Slot { kQ = 1, kK, kV, kO, kLse, kDout, kDq, kDk, kDv, kCuQ, kCuK, kUsedQ, kUsedK, kSpare };

class Fuzzer {
 public:
  Fuzzer(uint64_t seed, const NoAccessRegion& region) : rng_(seed), region_(region) {}

  bool coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  template <typename T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[uniform(0, static_cast<int64_t>(values.size()) - 1)];
  }

  // A mostly valid, sometimes extreme, problem; then tensors in one of several layouts; then a few
  // point corruptions of any field.
  BackwardArgs args() {
    BackwardArgs a;
    const bool varlen = coin(0.35);
    const int64_t heads_kv = coin(0.05) ? extreme_size() : pick<int64_t>({1, 2, 4});
    const int64_t heads = coin(0.05) ? extreme_size() : wrap_mul(heads_kv, pick<int64_t>({1, 2, 4}));
    const int64_t head_dim = coin(0.05) ? extreme_size() : pick<int64_t>({8, 64, 128, 256});
    // V's own head dim (V, O, dO, dV): mostly head_dim, else any other, sometimes an extreme one.
    const int64_t head_dim_v = coin(0.6)    ? head_dim
                               : coin(0.05) ? extreme_size()
                                            : pick<int64_t>({8, 64, 128, 192, 256});
    const int64_t batch = coin(0.05) ? extreme_size() : uniform(0, 4);
    const int64_t seq_q = coin(0.05) ? extreme_size() : uniform(0, 300);
    const int64_t seq_k = coin(0.05) ? extreme_size() : uniform(0, 300);
    const DType dtype = coin(0.5) ? DType::kFloat16 : DType::kBFloat16;
    auto dims = [&](int64_t seq, int64_t h, int64_t dim) {
      return varlen ? std::vector<int64_t>{seq, h, dim} : std::vector<int64_t>{batch, seq, h, dim};
    };
    const int64_t total_q = varlen ? (coin(0.05) ? extreme_size() : uniform(0, 1000)) : seq_q;
    const int64_t total_k = varlen ? (coin(0.05) ? extreme_size() : uniform(0, 1000)) : seq_k;
    a.q = tensor(kQ, dtype, dims(total_q, heads, head_dim));
    a.k = tensor(kK, dtype, dims(total_k, heads_kv, head_dim));
    a.v = tensor(kV, dtype, dims(total_k, heads_kv, head_dim_v));
    a.o = tensor(kO, dtype, dims(total_q, heads, head_dim_v));
    a.dout = tensor(kDout, dtype, dims(total_q, heads, head_dim_v));
    a.dq = tensor(kDq, dtype, dims(total_q, heads, head_dim));
    a.dk = tensor(kDk, dtype, dims(total_k, heads_kv, head_dim));
    a.dv = tensor(kDv, dtype, dims(total_k, heads_kv, head_dim_v));
    a.lse = tensor(kLse, DType::kFloat32,
                   varlen ? std::vector<int64_t>{heads, total_q} : std::vector<int64_t>{batch, heads, seq_q});
    if (varlen) {
      const int64_t size = wrap_add(batch, 1);
      a.varlen.cu_seqlens_q = IntArray{int_array(kCuQ), size};
      a.varlen.cu_seqlens_k = IntArray{int_array(kCuK), size};
      if (coin(0.3)) a.varlen.seqused_q = IntArray{int_array(kUsedQ), batch};
      if (coin(0.3)) a.varlen.seqused_k = IntArray{int_array(kUsedK), batch};
      a.varlen.max_seqlen_q = clamp32(seq_q);
      a.varlen.max_seqlen_k = clamp32(seq_k);
    }
    a.mask.causal = coin(0.3);
    if (coin(0.3)) a.mask.window_left = static_cast<int32_t>(uniform(0, 128));
    if (!a.mask.causal && coin(0.3)) a.mask.window_right = static_cast<int32_t>(uniform(0, 128));
    if (coin(0.3)) a.softmax_scale = 0.125f;
    a.deterministic = coin(0.5);

    const int64_t corruptions = pick<int64_t>({0, 0, 1, 1, 1, 2, 3});
    for (int64_t i = 0; i < corruptions; ++i) corrupt(a);
    return a;
  }

  static ForwardArgs forward_of(const BackwardArgs& b) {
    ForwardArgs f;
    f.q = b.q;
    f.k = b.k;
    f.v = b.v;
    f.o = b.o;
    f.lse = b.lse;
    f.softmax_scale = b.softmax_scale;
    f.mask = b.mask;
    f.varlen = b.varlen;
    return f;
  }

 private:
  int64_t extreme_size() {
    return pick<int64_t>({0, 1, 2, -1, kI32Max, int64_t{kI32Max} + 1, (int64_t{1} << 24) + 1, int64_t{1} << 30,
                          int64_t{1} << 40, kI64Max, kI64Min, -uniform(1, 1000), uniform(0, int64_t{1} << 31)});
  }

  int64_t extreme_stride() {
    return pick<int64_t>({0, 1, 8, -8, -1, (int64_t{1} << 39) - 8, int64_t{1} << 39, int64_t{1} << 40, int64_t{1} << 62,
                          kI64Max, kI64Max - 7, kI64Min, kI64Min + 8, uniform(0, int64_t{1} << 45) * 8,
                          -uniform(1, int64_t{1} << 20)});
  }

  const int32_t* int_array(int slot) { return reinterpret_cast<const int32_t*>(region_.slot(slot)); }

  // Contiguous, padded, heads-major, broadcast over the batch, or arbitrary strides.
  Tensor tensor(int slot, DType dtype, const std::vector<int64_t>& shape) {
    Tensor t;
    t.data = region_.slot(slot);
    t.dtype = dtype;
    t.rank = static_cast<int32_t>(shape.size());
    const int last = t.rank - 1;
    const int64_t multiple = dtype == DType::kFloat32 ? 1 : 8;
    int64_t stride = 1;
    const int layout = static_cast<int>(uniform(0, 9));
    for (int d = last; d >= 0; --d) {
      t.shape[d] = shape[d];
      t.stride[d] = stride;
      // Wrapping is wanted: strides that overflow are what validation must catch.
      stride = wrap_mul(stride, shape[d] > 0 ? shape[d] : 1);
      if (layout >= 6 && d < last) stride = wrap_add(stride, multiple * 4);
    }
    if (layout == 8 && t.rank == 4) {  // (batch, heads, seq, dim) in memory
      t.stride[2] = wrap_mul(t.shape[1], t.shape[3]);
      t.stride[1] = t.shape[3];
    }
    if (layout == 9 && t.rank >= 2) t.stride[0] = 0;
    if (coin(0.05)) t.stride[uniform(0, Tensor::kMaxRank - 1)] = extreme_stride();
    return t;
  }

  Tensor& any_tensor(BackwardArgs& a) {
    Tensor* const all[] = {&a.q, &a.k, &a.v, &a.o, &a.lse, &a.dout, &a.dq, &a.dk, &a.dv};
    return *all[uniform(0, 8)];
  }

  IntArray& any_int_array(BackwardArgs& a) {
    IntArray* const all[] = {&a.varlen.cu_seqlens_q, &a.varlen.cu_seqlens_k, &a.varlen.seqused_q, &a.varlen.seqused_k};
    return *all[uniform(0, 3)];
  }

  void* any_pointer(void* current) {
    // Integer arithmetic: the current pointer may already be a wild one that pointer arithmetic would overflow.
    const uintptr_t base = reinterpret_cast<uintptr_t>(current != nullptr ? current : region_.slot(kSpare));
    switch (uniform(0, 5)) {
      case 0:
        return nullptr;
      case 1:
        return reinterpret_cast<void*>(base + pick<uintptr_t>({1, 2, 4, 8, 12, 15}));
      case 2:
        return region_.slot(static_cast<int>(uniform(1, kSpare)));
      case 3:
        return reinterpret_cast<void*>(uintptr_t{0x10000});  // unmapped, aligned
      case 4:
        return reinterpret_cast<void*>(~uintptr_t{15});  // the top of the address space
      default:
        return reinterpret_cast<void*>(~uintptr_t{0});
    }
  }

  void corrupt(BackwardArgs& a) {
    switch (uniform(0, 11)) {
      case 0:
        any_tensor(a).shape[uniform(0, Tensor::kMaxRank - 1)] = extreme_size();
        break;
      case 1:
      case 2:
        any_tensor(a).stride[uniform(0, Tensor::kMaxRank - 1)] = extreme_stride();
        break;
      case 3:
        any_tensor(a).rank = pick<int32_t>({-1, 0, 1, 2, 3, 4, 5, kI32Min, kI32Max});
        break;
      case 4:
        any_tensor(a).dtype = static_cast<DType>(pick<int32_t>({0, 1, 2, 3, -1, kI32Max, kI32Min}));
        break;
      case 5: {
        Tensor& t = any_tensor(a);
        t.data = any_pointer(t.data);
        break;
      }
      case 6:
        any_tensor(a) = any_tensor(a);  // aliasing, or a tensor of the wrong role
        break;
      case 7:
        a.mask.causal = coin(0.5);
        (coin(0.5) ? a.mask.window_left : a.mask.window_right) =
            pick<int32_t>({-2, -1, 0, 1, 7, kI32Min, kI32Max, static_cast<int32_t>(uniform(-100, 100))});
        break;
      case 8:
        a.softmax_scale = pick<float>({NAN, INFINITY, -INFINITY, 0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
                                       std::numeric_limits<float>::max(), -1.0f, 1e-30f});
        break;
      case 9: {
        IntArray& array = any_int_array(a);
        array.size = pick<int64_t>({-1, 0, 1, 2, 3, 4, 5, kI32Max, int64_t{kI32Max} + 1, int64_t{kI32Max} + 2, kI64Max,
                                    kI64Min, wrap_add(array.size, 1), wrap_add(array.size, -1)});
        break;
      }
      case 10: {
        IntArray& array = any_int_array(a);
        array.data = static_cast<const int32_t*>(any_pointer(const_cast<int32_t*>(array.data)));
        break;
      }
      default:
        (coin(0.5) ? a.varlen.max_seqlen_q : a.varlen.max_seqlen_k) =
            pick<int32_t>({-1, 0, 1, kI32Max, kI32Min, static_cast<int32_t>(uniform(0, 1000))});
        break;
    }
  }

  std::mt19937_64 rng_;
  const NoAccessRegion& region_;
};

std::string describe(const char* name, const Tensor& t) {
  std::ostringstream out;
  out << "  " << name << ": data=" << t.data << " dtype=" << static_cast<int>(t.dtype) << " rank=" << t.rank
      << " shape=(";
  for (int d = 0; d < Tensor::kMaxRank; ++d) out << (d ? ", " : "") << t.shape[d];
  out << ") stride=(";
  for (int d = 0; d < Tensor::kMaxRank; ++d) out << (d ? ", " : "") << t.stride[d];
  out << ")\n";
  return out.str();
}

std::string describe(const BackwardArgs& a) {
  std::ostringstream out;
  const std::pair<const char*, const Tensor*> tensors[] = {{"q", &a.q},   {"k", &a.k},     {"v", &a.v},
                                                           {"o", &a.o},   {"lse", &a.lse}, {"dout", &a.dout},
                                                           {"dq", &a.dq}, {"dk", &a.dk},   {"dv", &a.dv}};
  for (const auto& [name, t] : tensors) out << describe(name, *t);
  const std::pair<const char*, const IntArray*> arrays[] = {{"cu_seqlens_q", &a.varlen.cu_seqlens_q},
                                                            {"cu_seqlens_k", &a.varlen.cu_seqlens_k},
                                                            {"seqused_q", &a.varlen.seqused_q},
                                                            {"seqused_k", &a.varlen.seqused_k}};
  for (const auto& [name, array] : arrays) {
    out << "  " << name << ": data=" << static_cast<const void*>(array->data) << " size=" << array->size << "\n";
  }
  out << "  max_seqlen_q=" << a.varlen.max_seqlen_q << " max_seqlen_k=" << a.varlen.max_seqlen_k
      << " causal=" << a.mask.causal << " window=(" << a.mask.window_left << ", " << a.mask.window_right
      << ") softmax_scale=" << a.softmax_scale << "\n";
  return out.str();
}

// The documented tensor rules, re-derived with 128-bit arithmetic: an accepted tensor must obey
// them all. Returns what it broke, or an empty string.
std::string broken_rule(const char* name, const Tensor& t, DType dtype) {
  if (t.dtype != dtype) return std::string(name) + " has the wrong dtype";
  if (t.rank < 1 || t.rank > Tensor::kMaxRank) return std::string(name) + " has an impossible rank";
  const int64_t bytes = dtype == DType::kFloat32 ? 4 : dtype == DType::kFloat8E4M3 ? 1 : 2;
  const bool tma_operand = dtype != DType::kFloat32;
  bool empty = false;
  __int128 largest = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0 || t.shape[d] > kI32Max) return std::string(name) + " has a size outside [0, 2^31)";
    empty = empty || t.shape[d] == 0;
    if (t.shape[d] <= 1) continue;
    if (t.stride[d] < 0) return std::string(name) + " has a negative stride";
    if (d == t.rank - 1 && t.stride[d] != 1) return std::string(name) + " has a non-contiguous last dimension";
    if (tma_operand && d < t.rank - 1 &&
        (t.stride[d] % (16 / bytes) != 0 || __int128{t.stride[d]} * bytes >= __int128{1} << 40)) {
      return std::string(name) + " has a stride TMA cannot take";
    }
    largest += __int128{t.stride[d]} * (t.shape[d] - 1);
  }
  if (largest * bytes > kI64Max) return std::string(name) + " has a byte offset past int64";
  if (!empty && t.data == nullptr) return std::string(name) + " is null";
  if (reinterpret_cast<uintptr_t>(t.data) % (tma_operand ? 16 : 4) != 0) return std::string(name) + " is misaligned";
  return "";
}

// A row tensor that obeys the tensor rules (its rank is real) and ends in `width`: head_dim for q,
// k, dq and dk, head_dim_v for v, o, dout and dv.
std::string broken_rule(const char* name, const Tensor& t, DType dtype, int64_t width) {
  if (std::string broken = broken_rule(name, t, dtype); !broken.empty()) return broken;
  if (t.shape[t.rank - 1] != width) return std::string(name) + " does not end in its head dim";
  return "";
}

bool supported_head_dim(int64_t d) { return d % 8 == 0 && d >= 8 && d <= 256; }

std::string broken_rule(const ForwardArgs& a, const Problem& p) {
  if (!supported_head_dim(p.head_dim)) return "head_dim outside the supported set";
  if (!supported_head_dim(p.head_dim_v)) return "head_dim_v outside the supported set";
  if (p.heads_kv < 1 || p.heads % p.heads_kv != 0) return "heads not a multiple of heads_kv";
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale == 0.0f) return "softmax_scale not resolved to finite";
  if (p.mask.left < -1 || p.mask.right < -1) return "window below -1";
  const std::pair<const char*, const Tensor*> rows[] = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"o", &a.o}};
  for (const auto& [name, t] : rows) {
    const int64_t width = t == &a.q || t == &a.k ? p.head_dim : p.head_dim_v;
    const DType dtype = t == &a.o ? p.out_dtype : p.dtype;
    if (std::string broken = broken_rule(name, *t, dtype, width); !broken.empty()) return broken;
  }
  return a.lse.data ? broken_rule("lse", a.lse, DType::kFloat32) : "";
}

// Counts outcomes, and which rules were hit, so the test can insist the generator reaches them.
struct Tally {
  int ok = 0;
  int invalid = 0;
  std::vector<std::pair<std::string, int>> rules = {
      {"a TMA limit", 0},    {"overflows int64", 0}, {"overlaps itself", 0},
      {"is null", 0},        {"aligned", 0},         {"must not be negative", 0},
      {"must be finite", 0}, {"varlen.", 0},         {"mask.", 0},
      {".rank is", 0},       {".dtype is", 0},       {"multiple of 8 elements", 0},
      {"(head_dim_v) is", 0}};

  void count(const Status& s) {
    if (s.ok()) {
      ++ok;
      return;
    }
    ++invalid;
    for (auto& [fragment, hits] : rules) hits += s.message().find(fragment) != std::string::npos;
  }
};

// OK, or kInvalidArgument with a message: anything else (another code, an empty message) fails;
// but for the backward of an FP8 q (a corrupted dtype can make one), which is kNotSupported.
bool well_formed(const Status& s) {
  if (s.code() == StatusCode::kNotSupported) return s.message().find("has a forward only") != std::string::npos;
  return s.ok() || (s.code() == StatusCode::kInvalidArgument && !s.message().empty());
}

uint64_t seed() {
  const char* text = std::getenv("HOPATTN_FUZZ_SEED");
  return text != nullptr ? std::strtoull(text, nullptr, 0) : 0x5eed'a77e'0000'0001ull;
}

void expect_reached_every_rule(const Tally& tally) {
  ::testing::Test::RecordProperty("accepted", tally.ok);
  ::testing::Test::RecordProperty("rejected", tally.invalid);
  for (const auto& [fragment, hits] : tally.rules) ::testing::Test::RecordProperty(fragment, hits);
  // The generator must keep reaching valid problems and every rule, or the fuzzing proves little.
  EXPECT_GT(tally.ok, kIterations / 50);
  for (const auto& [fragment, hits] : tally.rules) EXPECT_GT(hits, 0) << "no message contained \"" << fragment << "\"";
}

class ValidationFuzz : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(region_.ok()) << "mmap of the no-access region failed"; }
  NoAccessRegion region_;
};

TEST_F(ValidationFuzz, ForwardReturnsOkOrAnInvalidArgumentMessage) {
  Fuzzer fuzz(seed(), region_);
  Tally tally;
  for (int i = 0; i < kIterations; ++i) {
    const BackwardArgs b = fuzz.args();
    ForwardArgs a = Fuzzer::forward_of(b);
    if (fuzz.coin(0.2)) a.lse.data = nullptr;  // LSE is optional in the forward
    Problem p;
    ForwardTensors t;
    const Status s = validate_forward(a, &p, &t);
    tally.count(s);
    ASSERT_TRUE(well_formed(s)) << "iteration " << i << ": code " << static_cast<int>(s.code()) << ", message \""
                                << s.message() << "\"\n"
                                << describe(b);
    if (!s.ok()) continue;
    const std::string broken = broken_rule(a, p);
    ASSERT_TRUE(broken.empty()) << "iteration " << i << ": accepted although " << broken << "\n" << describe(b);
    ASSERT_EQ(t.q.data, a.q.data);
    ASSERT_EQ(t.o.data, a.o.data);
    ASSERT_EQ(t.lse.data, a.lse.data);
  }
  expect_reached_every_rule(tally);
}

TEST_F(ValidationFuzz, BackwardAndWorkspaceSizeReturnOkOrAnInvalidArgumentMessage) {
  Fuzzer fuzz(seed() + 1, region_);
  Tally tally;
  for (int i = 0; i < kIterations; ++i) {
    const BackwardArgs a = fuzz.args();
    Problem p;
    BackwardTensors t;
    const Status s = validate_backward(a, &p, &t);
    tally.count(s);
    ASSERT_TRUE(well_formed(s)) << "iteration " << i << ": code " << static_cast<int>(s.code()) << ", message \""
                                << s.message() << "\"\n"
                                << describe(a);
    // The workspace query validates the same way, so it must agree to the letter.
    size_t bytes = 0;
    const Status w = backward_workspace_size(a, &bytes);
    ASSERT_EQ(w.code(), s.code()) << "iteration " << i << ": " << w.message() << "\n" << describe(a);
    ASSERT_EQ(w.message(), s.message()) << "iteration " << i;
    if (!s.ok()) continue;
    std::string broken = broken_rule(Fuzzer::forward_of(a), p);
    if (broken.empty()) broken = broken_rule("lse", a.lse, DType::kFloat32);  // required in the backward
    const std::pair<const char*, const Tensor*> grads[] = {
        {"dout", &a.dout}, {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}};
    for (const auto& [name, g] : grads) {
      const int64_t width = g == &a.dq || g == &a.dk ? p.head_dim : p.head_dim_v;
      if (broken.empty()) broken = broken_rule(name, *g, p.dtype, width);
    }
    ASSERT_TRUE(broken.empty()) << "iteration " << i << ": accepted although " << broken << "\n" << describe(a);
    ASSERT_EQ(t.dk.data, a.dk.data);
  }
  expect_reached_every_rule(tally);
}

// The property the region relies on, shown directly: a valid varlen problem whose every pointer,
// cu_seqlens and seqused included, is unreadable validates fine.
TEST_F(ValidationFuzz, ValidationNeverReadsDeviceArrays) {
  ForwardArgs a;
  a.q = make_tensor(region_.slot(kQ), DType::kBFloat16, {100, 8, 128});
  a.k = make_tensor(region_.slot(kK), DType::kBFloat16, {150, 2, 128});
  a.v = make_tensor(region_.slot(kV), DType::kBFloat16, {150, 2, 128});
  a.o = make_tensor(region_.slot(kO), DType::kBFloat16, {100, 8, 128});
  a.lse = make_tensor(region_.slot(kLse), DType::kFloat32, {8, 100});
  a.varlen.cu_seqlens_q = IntArray{reinterpret_cast<const int32_t*>(region_.slot(kCuQ)), 4};
  a.varlen.cu_seqlens_k = IntArray{reinterpret_cast<const int32_t*>(region_.slot(kCuK)), 4};
  a.varlen.seqused_q = IntArray{reinterpret_cast<const int32_t*>(region_.slot(kUsedQ)), 3};
  a.varlen.seqused_k = IntArray{reinterpret_cast<const int32_t*>(region_.slot(kUsedK)), 3};
  a.varlen.max_seqlen_q = 60;
  a.varlen.max_seqlen_k = 80;
  Problem p;
  ForwardTensors t;
  EXPECT_TRUE(validate_forward(a, &p, &t).ok()) << validate_forward(a, &p, &t).message();
}

}  // namespace
}  // namespace hopattn
