// The float64 reference against first principles: hand-computed values, mask patterns read off
// through one-hot values, GQA head mapping, varlen equal to separate runs, seqused, a value head dim
// against zero padding to equal dims, and gradients against central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "reference/cpu_reference.hpp"

namespace hopattn::cpu_reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

size_t q_size(const HostProblem& p) { return size_t(p.total_q() * p.heads * p.head_dim); }
size_t k_size(const HostProblem& p) { return size_t(p.total_k() * p.heads_kv * p.head_dim); }

TEST(CpuReference, HandComputedSoftmax) {
  // One query e0, keys e0 and 2 e0, scale 1: scores (1, 2).
  HostProblem p = fixed_length_problem(1, 1, 2, 1, 1, 8, 1.0, BandMask{});
  std::vector<double> q(8, 0.0), k(16, 0.0), v(16, 0.0);
  q[0] = 1;
  k[0] = 1;
  k[8] = 2;
  for (int d = 0; d < 8; ++d) {
    v[d] = d;
    v[8 + d] = 10 + d;
  }
  const ForwardResult r = forward(p, q, k, v);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(r.lse[0], lse, 1e-14);
  const double p0 = std::exp(1.0 - lse), p1 = std::exp(2.0 - lse);
  for (int d = 0; d < 8; ++d) EXPECT_NEAR(r.o[d], p0 * d + p1 * (10 + d), 1e-13);
}

// With V = identity (v_j = e_j), O's row i is P's row i: the mask can be read off directly.
std::vector<std::vector<double>> probabilities(BandMask mask, int seqlen_q, int seqlen_k) {
  const int d = 8 * ((seqlen_k + 7) / 8);
  HostProblem p = fixed_length_problem(1, seqlen_q, seqlen_k, 1, 1, d, 0.1, mask);
  std::vector<double> v(size_t(seqlen_k) * d, 0.0);
  for (int j = 0; j < seqlen_k; ++j) v[size_t(j) * d + j] = 1;
  const ForwardResult r = forward(p, random_values(q_size(p), 1), random_values(k_size(p), 2), v);
  std::vector<std::vector<double>> probs(seqlen_q, std::vector<double>(seqlen_k));
  for (int i = 0; i < seqlen_q; ++i)
    for (int j = 0; j < seqlen_k; ++j) probs[i][j] = r.o[size_t(i) * d + j];
  return probs;
}

void expect_pattern(BandMask mask, int seqlen_q, int seqlen_k, const std::vector<std::vector<int>>& visible) {
  const auto probs = probabilities(mask, seqlen_q, seqlen_k);
  for (int i = 0; i < seqlen_q; ++i) {
    double sum = 0;
    for (int j = 0; j < seqlen_k; ++j) {
      if (visible[i][j]) {
        EXPECT_GT(probs[i][j], 0.0) << i << "," << j;
      } else {
        EXPECT_EQ(probs[i][j], 0.0) << i << "," << j;
      }
      sum += probs[i][j];
    }
    bool any = false;
    for (int j = 0; j < seqlen_k; ++j) any = any || visible[i][j];
    EXPECT_NEAR(sum, any ? 1.0 : 0.0, 1e-12) << "row " << i;
  }
}

TEST(CpuReference, CausalMaskBottomRightWithMoreKeys) {
  expect_pattern(BandMask::from_args(true, -1, -1), 3, 5, {{1, 1, 1, 0, 0}, {1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}});
}

TEST(CpuReference, CausalMaskBottomRightWithMoreQueriesLeavesEmptyRows) {
  const BandMask causal = BandMask::from_args(true, -1, -1);
  expect_pattern(causal, 4, 2, {{0, 0}, {0, 0}, {1, 0}, {1, 1}});
  HostProblem p = fixed_length_problem(1, 4, 2, 1, 1, 8, 0.5, causal);
  const ForwardResult r =
      forward(p, random_values(q_size(p), 3), random_values(k_size(p), 4), random_values(k_size(p), 5));
  EXPECT_EQ(r.lse[0], -INFINITY);
  EXPECT_EQ(r.lse[1], -INFINITY);
  EXPECT_TRUE(std::isfinite(r.lse[2]));
  for (int d = 0; d < 8; ++d) EXPECT_EQ(r.o[d], 0.0);
}

TEST(CpuReference, SlidingWindowBottomRight) {
  // seqlen_q = 3, seqlen_k = 6, shift 3, window (1, 0): query i sees keys i + 2 and i + 3.
  expect_pattern(BandMask{1, 0}, 3, 6, {{0, 0, 1, 1, 0, 0}, {0, 0, 0, 1, 1, 0}, {0, 0, 0, 0, 1, 1}});
  // Two-sided window (1, 1) with equal lengths.
  expect_pattern(BandMask{1, 1}, 4, 4, {{1, 1, 0, 0}, {1, 1, 1, 0}, {0, 1, 1, 1}, {0, 0, 1, 1}});
  // Left-unbounded, right 1.
  expect_pattern(BandMask{-1, 1}, 3, 3, {{1, 1, 0}, {1, 1, 1}, {1, 1, 1}});
}

// Extracts one head (and its kv head) of a single-sequence problem.
std::vector<double> head_slice(const std::vector<double>& t, int64_t rows, int heads, int head, int d) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int x = 0; x < d; ++x) out.push_back(t[(r * heads + head) * d + x]);
  return out;
}

TEST(CpuReference, GqaMapsQueryHeadsToTheirKvHead) {
  const int heads = 6, heads_kv = 2, d = 16, sq = 7, sk = 9;
  HostProblem p = fixed_length_problem(1, sq, sk, heads, heads_kv, d, 0.3, BandMask{});
  const auto q = random_values(q_size(p), 10), k = random_values(k_size(p), 11), v = random_values(k_size(p), 12);
  const ForwardResult r = forward(p, q, k, v);
  HostProblem single = fixed_length_problem(1, sq, sk, 1, 1, d, 0.3, BandMask{});
  for (int h = 0; h < heads; ++h) {
    const int hk = h / (heads / heads_kv);
    const ForwardResult s = forward(single, head_slice(q, sq, heads, h, d), head_slice(k, sk, heads_kv, hk, d),
                                    head_slice(v, sk, heads_kv, hk, d));
    const auto o = head_slice(r.o, sq, heads, h, d);
    for (size_t e = 0; e < o.size(); ++e) ASSERT_EQ(o[e], s.o[e]) << "head " << h;
  }
}

TEST(CpuReference, VarlenEqualsSeparateSequencesAndHandlesEmptyOnes) {
  const int heads = 2, d = 8;
  HostProblem p;
  p.heads = p.heads_kv = heads;
  p.head_dim = d;
  p.softmax_scale = 0.4;
  p.mask = BandMask::from_args(true, -1, -1);
  // Sequence 1 has no queries, sequence 2 has no keys (its queries see nothing).
  const std::vector<int> lq = {3, 0, 4, 5}, lk = {4, 2, 0, 6};
  p.cu_seqlens_q = {0, 3, 3, 7, 12};
  p.cu_seqlens_k = {0, 4, 6, 6, 12};
  const auto q = random_values(q_size(p), 20), k = random_values(k_size(p), 21), v = random_values(k_size(p), 22);
  const auto dout = random_values(q_size(p), 23);
  const ForwardResult r = forward(p, q, k, v);
  const BackwardResult g = backward(p, q, k, v, dout);
  for (int b = 0; b < 4; ++b) {
    HostProblem one = fixed_length_problem(1, lq[b], lk[b], heads, heads, d, 0.4, p.mask);
    auto rows = [&](const std::vector<double>& t, int first, int n) {
      return std::vector<double>(t.begin() + size_t(first) * heads * d, t.begin() + size_t(first + n) * heads * d);
    };
    const auto qb = rows(q, p.cu_seqlens_q[b], lq[b]), kb = rows(k, p.cu_seqlens_k[b], lk[b]);
    const auto vb = rows(v, p.cu_seqlens_k[b], lk[b]), dob = rows(dout, p.cu_seqlens_q[b], lq[b]);
    const ForwardResult rb = forward(one, qb, kb, vb);
    const BackwardResult gb = backward(one, qb, kb, vb, dob);
    EXPECT_EQ(rows(r.o, p.cu_seqlens_q[b], lq[b]), rb.o) << "sequence " << b;
    EXPECT_EQ(rows(g.dq, p.cu_seqlens_q[b], lq[b]), gb.dq) << "sequence " << b;
    EXPECT_EQ(rows(g.dk, p.cu_seqlens_k[b], lk[b]), gb.dk) << "sequence " << b;
    EXPECT_EQ(rows(g.dv, p.cu_seqlens_k[b], lk[b]), gb.dv) << "sequence " << b;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < lq[b]; ++i) EXPECT_EQ(r.lse[h * p.total_q() + p.cu_seqlens_q[b] + i], rb.lse[h * lq[b] + i]);
  }
  // Sequence 2 sees no keys: O = 0, LSE = -inf, dQ = 0.
  for (int e = 3 * heads * d; e < 7 * heads * d; ++e) {
    EXPECT_EQ(r.o[e], 0.0);
    EXPECT_EQ(g.dq[e], 0.0);
  }
  EXPECT_EQ(r.lse[3], -INFINITY);
}

// Varlen rows past seqused read as rows that see no key (O = 0, LSE = -inf) and get zero gradients.
TEST(CpuReference, VarlenRowsPastSequsedSeeNoKeyAndGetZeroGradients) {
  HostProblem p;
  p.heads = p.heads_kv = 1;
  p.head_dim = 8;
  p.softmax_scale = 0.3;
  p.cu_seqlens_q = {0, 6};
  p.cu_seqlens_k = {0, 8};
  p.seqused_q = {4};
  p.seqused_k = {5};
  const auto q = random_values(q_size(p), 30), k = random_values(k_size(p), 31), v = random_values(k_size(p), 32);
  const auto dout = random_values(q_size(p), 33);
  const ForwardResult r = forward(p, q, k, v);
  const BackwardResult g = backward(p, q, k, v, dout);
  HostProblem truncated = fixed_length_problem(1, 4, 5, 1, 1, 8, 0.3, BandMask{});
  const auto head = [](const std::vector<double>& t, int n) {
    return std::vector<double>(t.begin(), t.begin() + n * 8);
  };
  const ForwardResult rt = forward(truncated, head(q, 4), head(k, 5), head(v, 5));
  const BackwardResult gt = backward(truncated, head(q, 4), head(k, 5), head(v, 5), head(dout, 4));
  EXPECT_EQ(head(r.o, 4), rt.o);
  EXPECT_EQ(head(g.dk, 5), gt.dk);
  for (int e = 4 * 8; e < 6 * 8; ++e) EXPECT_TRUE(r.o[e] == 0.0 && g.dq[e] == 0.0);
  for (int e = 5 * 8; e < 8 * 8; ++e) EXPECT_TRUE(g.dk[e] == 0.0 && g.dv[e] == 0.0);
  EXPECT_EQ(r.lse[5], -std::numeric_limits<double>::infinity());
}

// Gradients of L = sum(O * G) against central finite differences, for q, k, v and the sinks.
struct GradCase {
  const char* name;
  int batch, seqlen_q, seqlen_k, heads, heads_kv;
  BandMask mask;
  double softcap = 0;
  bool sinks = false;
  int head_dim_v = 0;
};

class CpuReferenceGradients : public ::testing::TestWithParam<GradCase> {};

TEST_P(CpuReferenceGradients, MatchFiniteDifferences) {
  const GradCase c = GetParam();
  const int d = 8;
  HostProblem p = fixed_length_problem(c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads_kv, d, 0.35, c.mask);
  p.softcap = c.softcap;
  p.head_dim_v = c.head_dim_v;
  if (c.sinks) p.sinks = random_values(size_t(c.heads), 44);
  const size_t o_size = size_t(p.total_q() * p.heads * p.value_dim());
  std::vector<double> q = random_values(q_size(p), 40), k = random_values(k_size(p), 41);
  std::vector<double> v = random_values(size_t(p.total_k() * p.heads_kv * p.value_dim()), 42);
  const auto dout = random_values(o_size, 43);
  const BackwardResult g = backward(p, q, k, v, dout);
  ASSERT_EQ(g.dsink.size(), p.sinks.size());
  auto loss = [&] {
    const ForwardResult r = forward(p, q, k, v);
    double l = 0;
    for (size_t e = 0; e < r.o.size(); ++e) l += r.o[e] * dout[e];
    return l;
  };
  const double h = 1e-5;
  std::mt19937 rng(7);
  for (auto [tensor, grad, name] :
       {std::tuple{&q, &g.dq, "dq"}, {&k, &g.dk, "dk"}, {&v, &g.dv, "dv"}, {&p.sinks, &g.dsink, "dsink"}}) {
    if (tensor->empty()) continue;
    for (int sample = 0; sample < 24; ++sample) {
      const size_t e = std::uniform_int_distribution<size_t>(0, tensor->size() - 1)(rng);
      const double saved = (*tensor)[e];
      (*tensor)[e] = saved + h;
      const double up = loss();
      (*tensor)[e] = saved - h;
      const double down = loss();
      (*tensor)[e] = saved;
      EXPECT_NEAR((*grad)[e], (up - down) / (2 * h), 1e-7) << c.name << " " << name << "[" << e << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Masks, CpuReferenceGradients,
    ::testing::Values(GradCase{"full", 2, 5, 7, 2, 2, BandMask{}},
                      GradCase{"causal_more_keys", 1, 5, 9, 2, 1, BandMask::from_args(true, -1, -1)},
                      GradCase{"causal_more_queries", 1, 9, 4, 2, 2, BandMask::from_args(true, -1, -1)},
                      GradCase{"window", 2, 8, 8, 4, 2, BandMask{2, 1}},
                      GradCase{"gqa_local", 1, 6, 10, 4, 1, BandMask::from_args(true, 3, -1)},
                      GradCase{"softcap", 2, 5, 7, 2, 1, BandMask{}, 1.5},
                      GradCase{"sinks_window", 1, 8, 8, 4, 2, BandMask{2, 0}, 0, true},
                      GradCase{"sinks_causal_more_queries", 1, 9, 4, 2, 2, BandMask::from_args(true, -1, -1), 0, true},
                      GradCase{"value_dim_4", 2, 5, 7, 4, 2, BandMask::from_args(true, -1, -1), 0, false, 4},
                      GradCase{"all_features", 1, 6, 10, 4, 1, BandMask::from_args(true, 3, -1), 2.0, true, 16}),
    [](const auto& info) { return std::string(info.param.name); });

// The new features against what they must reduce to: a cap far above every score, sinks of -inf
// and a value dim equal to head_dim change nothing; a row that sees no key takes LSE = sink, O = 0.
TEST(CpuReference, SoftcapSinksAndValueDimReduceToPlainAttention) {
  HostProblem p = fixed_length_problem(1, 9, 4, 2, 1, 8, 0.3, BandMask::from_args(true, -1, -1));
  const auto q = random_values(q_size(p), 50), k = random_values(k_size(p), 51), v = random_values(k_size(p), 52);
  const ForwardResult plain = forward(p, q, k, v);
  HostProblem capped = p;
  capped.softcap = 1e7;
  HostProblem no_sinks = p;
  no_sinks.sinks = {-kInf, -kInf};
  HostProblem same_dim = p;
  same_dim.head_dim_v = 8;
  for (const HostProblem* variant : {&capped, &no_sinks, &same_dim}) {
    const ForwardResult r = forward(*variant, q, k, v);
    for (size_t e = 0; e < r.o.size(); ++e) {
      if (std::isnan(plain.o[e])) continue;
      EXPECT_NEAR(r.o[e], plain.o[e], 1e-9) << e;
    }
    for (size_t e = 0; e < r.lse.size(); ++e) {
      if (std::isinf(plain.lse[e])) {
        EXPECT_EQ(r.lse[e], plain.lse[e]) << e;
      } else {
        EXPECT_NEAR(r.lse[e], plain.lse[e], 1e-9) << e;
      }
    }
  }
  HostProblem with_sinks = p;
  with_sinks.sinks = {0.5, -2.0};
  const ForwardResult r = forward(with_sinks, q, k, v);
  // seqlen_q 9 > seqlen_k 4 under causal: queries 0..4 see no key.
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(r.lse[size_t(h) * 9], with_sinks.sinks[h]);
    for (int d = 0; d < 8; ++d) EXPECT_EQ(r.o[(size_t(0) * 2 + h) * 8 + d], 0.0);
  }
  // A row that sees keys: LSE grows by exactly the sink's term.
  const size_t last = 1 * 9 + 8;  // head 1, query 8
  EXPECT_NEAR(std::exp(r.lse[last]), std::exp(plain.lse[last]) + std::exp(-2.0), 1e-12);
}

// Each row of x (dim entries) followed by zeros up to padded_dim entries.
std::vector<double> zero_padded(const std::vector<double>& x, int dim, int padded_dim) {
  std::vector<double> padded;
  for (size_t at = 0; at < x.size(); at += dim) {
    padded.insert(padded.end(), x.begin() + at, x.begin() + at + dim);
    padded.insert(padded.end(), padded_dim - dim, 0.0);
  }
  return padded;
}

// The first dim entries of each row of x (padded_dim entries).
std::vector<double> leading(const std::vector<double>& x, int padded_dim, int dim) {
  std::vector<double> lead;
  for (size_t at = 0; at < x.size(); at += padded_dim) lead.insert(lead.end(), x.begin() + at, x.begin() + at + dim);
  return lead;
}

void expect_equal(const std::vector<double>& got, const std::vector<double>& want, const char* name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t e = 0; e < got.size(); ++e) EXPECT_DOUBLE_EQ(got[e], want[e]) << name << "[" << e << "]";
}

// A value dim of its own against plain attention with equal dims: zero columns change no score and
// no output, so padding the narrower of Q/K and V (and dO with V) with zeros to the wider one's dim
// must give the same O and LSE, and gradients whose leading columns are the unpadded ones.
TEST(CpuReference, ValueDimMatchesZeroPaddingToEqualDims) {
  for (const auto& [qk_dim, v_dim] : {std::pair{16, 8}, std::pair{8, 16}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << qk_dim << ", head_dim_v " << v_dim);
    HostProblem p = fixed_length_problem(2, 5, 7, 4, 2, qk_dim, 0.3, BandMask::from_args(true, 3, -1));
    p.head_dim_v = v_dim;
    const int wide = std::max(qk_dim, v_dim);
    HostProblem padded = p;  // the same explicit softmax_scale
    padded.head_dim = padded.head_dim_v = wide;
    const auto q = random_values(q_size(p), 60), k = random_values(k_size(p), 61);
    const auto v = random_values(size_t(p.total_k() * p.heads_kv * v_dim), 62);
    const auto dout = random_values(size_t(p.total_q() * p.heads * v_dim), 63);
    const auto q_wide = zero_padded(q, qk_dim, wide), k_wide = zero_padded(k, qk_dim, wide);
    const auto v_wide = zero_padded(v, v_dim, wide), dout_wide = zero_padded(dout, v_dim, wide);

    const ForwardResult r = forward(p, q, k, v);
    const ForwardResult r_wide = forward(padded, q_wide, k_wide, v_wide);
    expect_equal(r.o, leading(r_wide.o, wide, v_dim), "o");
    expect_equal(r.lse, r_wide.lse, "lse");
    const BackwardResult g = backward(p, q, k, v, dout);
    const BackwardResult g_wide = backward(padded, q_wide, k_wide, v_wide, dout_wide);
    expect_equal(g.dq, leading(g_wide.dq, wide, qk_dim), "dq");
    expect_equal(g.dk, leading(g_wide.dk, wide, qk_dim), "dk");
    expect_equal(g.dv, leading(g_wide.dv, wide, v_dim), "dv");
  }
}

// Softcap values against the formula for one pair: S = c * tanh(scale * q.k / c).
TEST(CpuReference, SoftcapCapsTheScore) {
  HostProblem p = fixed_length_problem(1, 1, 2, 1, 1, 8, 0.5, BandMask{});
  p.softcap = 2.0;
  std::vector<double> q(8, 0.0), k(16, 0.0), v(16, 0.0);
  q[0] = 3;
  k[0] = 4;   // scale * q.k = 6
  k[8] = -1;  // -1.5
  v[0] = 1;
  v[8 + 1] = 1;
  const ForwardResult r = forward(p, q, k, v);
  const double s0 = 2.0 * std::tanh(6.0 / 2.0), s1 = 2.0 * std::tanh(-1.5 / 2.0);
  const double lse = std::log(std::exp(s0) + std::exp(s1));
  EXPECT_NEAR(r.lse[0], lse, 1e-14);
  EXPECT_NEAR(r.o[0], std::exp(s0 - lse), 1e-14);
  EXPECT_NEAR(r.o[1], std::exp(s1 - lse), 1e-14);
}

TEST(CpuReference, RoundingEmulationRoundsToTheDtype) {
  EXPECT_EQ(round_to(Rounding::kNone, 1.0 + 1e-9), 1.0 + 1e-9);
  EXPECT_EQ(round_to(Rounding::kBFloat16, 1.0 + 1.0 / 512), 1.0);             // below half an ulp (2^-7)
  EXPECT_EQ(round_to(Rounding::kFloat16, 1.0 + 1.0 / 512), 1.0 + 1.0 / 512);  // fp16 ulp is 2^-10
}

}  // namespace
}  // namespace hopattn::cpu_reference
