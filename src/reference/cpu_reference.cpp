#include "reference/cpu_reference.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/mask_definition.hpp"

namespace hopattn::cpu_reference {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Addressing of the packed layout.
struct Packed {
  int64_t heads;
  int64_t head_dim;
  int64_t at(int64_t row, int64_t head) const { return (row * heads + head) * head_dim; }
};

// OCP e4m3: 3 mantissa bits, exponent bias 7, normals from 2^-6, subnormals in steps of 2^-9, and
// no infinity: magnitudes past 448 saturate. Computed on doubles, independently of CUDA's
// conversion, which the tests compare it with.
double round_to_e4m3(double x) {
  constexpr double kMaxFinite = 448.0;
  constexpr int kMantissaBits = 3;
  constexpr int kMinNormalExponent = -6;
  if (std::isnan(x) || x == 0) return x;
  if (std::isinf(x)) return std::copysign(kMaxFinite, x);
  const double magnitude = std::fabs(x);
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent - 1), 2^exponent)
  const int step_exponent = std::max(exponent - 1, kMinNormalExponent) - kMantissaBits;
  // Scaling by powers of 2 is exact; nearbyint rounds half to even in the default rounding mode.
  const double steps = std::nearbyint(std::ldexp(magnitude, -step_exponent));
  const double rounded = std::fmin(std::ldexp(steps, step_exponent), kMaxFinite);
  return std::copysign(rounded, x);
}

double dot(const double* a, const double* b, int n) {
  double sum = 0;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// One query row's scores and probabilities over the keys of its sequence (and its sink).
struct RowSoftmax {
  std::vector<int> keys;     // visible keys, in order
  std::vector<double> score; // S for each visible key (after the cap)
  std::vector<double> prob;  // P for each visible key
  double lse = -kInf;
  double sink_prob = 0;      // exp(sink - LSE): the share the sink takes
};

RowSoftmax row_softmax(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const ForwardRounding& r, int64_t q_row, int head, int64_t k_offset, int i, int seqlen_q,
                       int seqlen_k) {
  const Packed pq{p.heads, p.head_dim}, pk{p.heads_kv, p.head_dim};
  const int head_kv = head / (p.heads / p.heads_kv);
  RowSoftmax row;
  const bool has_sink = !p.sinks.empty();
  const double sink = has_sink ? p.sinks[head] : -kInf;
  double max_score = sink;
  for (int j = 0; j < seqlen_k; ++j) {
    if (!is_visible(p.mask, i, j, seqlen_q, seqlen_k)) continue;
    const double qk = round_to(r.scores, dot(&q[pq.at(q_row, head)], &k[pk.at(k_offset + j, head_kv)], p.head_dim));
    double s = round_to(r.scores, qk * p.softmax_scale);
    if (p.softcap > 0) s = round_to(r.scores, p.softcap * std::tanh(s / p.softcap));
    row.keys.push_back(j);
    row.score.push_back(s);
    max_score = std::fmax(max_score, s);
  }
  if (max_score == -kInf) return row;  // no key and no (finite) sink: LSE -inf, O = 0
  double sum = has_sink ? std::exp(sink - max_score) : 0;
  for (double s : row.score) sum += std::exp(s - max_score);
  row.lse = max_score + std::log(sum);
  for (double s : row.score) row.prob.push_back(round_to(r.probabilities, std::exp(s - row.lse)));
  if (has_sink) row.sink_prob = std::exp(sink - row.lse);
  return row;
}

}  // namespace

SequenceLayout HostProblem::queries() const {
  return SequenceLayout{cu_seqlens_q.data(), seqused_q.empty() ? nullptr : seqused_q.data(), 0, total_q()};
}

SequenceLayout HostProblem::keys() const {
  return SequenceLayout{cu_seqlens_k.data(), seqused_k.empty() ? nullptr : seqused_k.data(), 0, total_k()};
}

HostProblem fixed_length_problem(int batch, int seqlen_q, int seqlen_k, int heads, int heads_kv, int head_dim,
                                 double softmax_scale, BandMask mask) {
  HostProblem p;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.softmax_scale = softmax_scale;
  p.mask = mask;
  for (int b = 0; b <= batch; ++b) {
    p.cu_seqlens_q.push_back(b * seqlen_q);
    p.cu_seqlens_k.push_back(b * seqlen_k);
  }
  return p;
}

Rounding rounding_for(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return Rounding::kFloat16;
    case DType::kFloat8E4M3:
      return Rounding::kFloat8E4M3;
    default:
      return Rounding::kBFloat16;
  }
}

double round_to(Rounding rounding, double x) {
  switch (rounding) {
    case Rounding::kNone:
      return x;
    case Rounding::kFloat16:
      return static_cast<double>(__half2float(__float2half_rn(static_cast<float>(x))));
    case Rounding::kBFloat16:
      return static_cast<double>(__bfloat162float(__float2bfloat16_rn(static_cast<float>(x))));
    case Rounding::kFloat8E4M3:
      return round_to_e4m3(x);
  }
  return x;
}

ForwardRounding uniform_rounding(Rounding rounding) { return ForwardRounding{rounding, rounding, rounding}; }

ForwardRounding naive_fp8_forward(DType out_dtype) {
  return ForwardRounding{rounding_for(out_dtype), Rounding::kFloat8E4M3, rounding_for(out_dtype)};
}

ForwardResult forward(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, Rounding r) {
  return forward(p, q, k, v, uniform_rounding(r));
}

ForwardResult forward(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, ForwardRounding r) {
  const Packed po{p.heads, p.value_dim()}, pv{p.heads_kv, p.value_dim()};
  ForwardResult out;
  const SequenceLayout queries = p.queries(), keys = p.keys();
  // Varlen: the rows that no sequence's real tokens cover read as rows that see no key; fixed-
  // length rows past seqused stay NaN (untouched).
  const bool varlen = queries.varlen();
  out.o.assign(static_cast<size_t>(p.total_q() * p.heads * p.value_dim()), varlen ? 0.0 : kNaN);
  out.lse.assign(static_cast<size_t>(p.heads * p.total_q()),
                 varlen ? -std::numeric_limits<double>::infinity() : kNaN);
  for (int b = 0; b < p.batch(); ++b) {
    const Sequence sq = queries.sequence(b), sk = keys.sequence(b);
    for (int h = 0; h < p.heads; ++h) {
      const int head_kv = h / (p.heads / p.heads_kv);
      for (int i = 0; i < sq.length; ++i) {
        const int64_t row = sq.offset + i;
        const RowSoftmax sm = row_softmax(p, q, k, r, row, h, sk.offset, i, sq.length, sk.length);
        double* o = &out.o[po.at(row, h)];
        for (int d = 0; d < p.value_dim(); ++d) {
          double acc = 0;
          for (size_t n = 0; n < sm.keys.size(); ++n) acc += sm.prob[n] * v[pv.at(sk.offset + sm.keys[n], head_kv) + d];
          o[d] = round_to(r.output, acc);
        }
        out.lse[h * p.total_q() + row] = sm.lse;
      }
    }
  }
  return out;
}

BackwardResult backward(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout, Rounding r) {
  const Packed pq{p.heads, p.head_dim}, pk{p.heads_kv, p.head_dim};
  const Packed po{p.heads, p.value_dim()}, pv{p.heads_kv, p.value_dim()};
  const ForwardResult fwd = forward(p, q, k, v, r);
  BackwardResult out;
  const SequenceLayout queries = p.queries(), keys = p.keys();
  // Varlen: the rows that no sequence's real tokens cover get zero gradients; fixed-length rows
  // past seqused stay NaN (untouched).
  out.dq.assign(q.size(), queries.varlen() ? 0.0 : kNaN);
  out.dk.assign(k.size(), keys.varlen() ? 0.0 : kNaN);
  out.dv.assign(v.size(), keys.varlen() ? 0.0 : kNaN);
  if (!p.sinks.empty()) out.dsink.assign(p.sinks.size(), 0.0);
  std::vector<double> dk_acc, dv_acc, dq_acc(p.head_dim);
  for (int b = 0; b < p.batch(); ++b) {
    const Sequence sq = queries.sequence(b), sk = keys.sequence(b);
    dk_acc.assign(out.dk.size(), 0.0);
    dv_acc.assign(out.dv.size(), 0.0);
    for (int h = 0; h < p.heads; ++h) {
      const int head_kv = h / (p.heads / p.heads_kv);
      for (int i = 0; i < sq.length; ++i) {
        const int64_t row = sq.offset + i;
        const RowSoftmax sm = row_softmax(p, q, k, uniform_rounding(r), row, h, sk.offset, i, sq.length, sk.length);
        const double* qi = &q[pq.at(row, h)];
        const double* doi = &dout[po.at(row, h)];
        const double row_dot = dot(doi, &fwd.o[po.at(row, h)], p.value_dim());
        // The sink has no value: its share only shrinks O, d LSE / d sink = sink_prob.
        if (!p.sinks.empty()) out.dsink[h] -= sm.sink_prob * row_dot;
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (size_t n = 0; n < sm.keys.size(); ++n) {
          const int64_t key_at = pk.at(sk.offset + sm.keys[n], head_kv);
          const int64_t value_at = pv.at(sk.offset + sm.keys[n], head_kv);
          const double dprob = round_to(r, dot(doi, &v[value_at], p.value_dim()));
          double dscore = round_to(r, sm.prob[n] * (dprob - row_dot));
          // Through the cap: d(c tanh(x / c)) / dx = 1 - (S / c)^2.
          if (p.softcap > 0) {
            const double t = sm.score[n] / p.softcap;
            dscore = round_to(r, dscore * (1 - t * t));
          }
          for (int d = 0; d < p.head_dim; ++d) {
            dq_acc[d] += dscore * k[key_at + d];
            dk_acc[key_at + d] += dscore * qi[d];
          }
          for (int d = 0; d < p.value_dim(); ++d) dv_acc[value_at + d] += sm.prob[n] * doi[d];
        }
        for (int d = 0; d < p.head_dim; ++d) out.dq[pq.at(row, h) + d] = round_to(r, dq_acc[d] * p.softmax_scale);
      }
    }
    // Only the real key rows of this sequence get gradients here.
    for (int64_t e = sk.offset * p.heads_kv * p.head_dim; e < (sk.offset + sk.length) * p.heads_kv * p.head_dim; ++e) {
      out.dk[e] = round_to(r, dk_acc[e] * p.softmax_scale);
    }
    for (int64_t e = sk.offset * p.heads_kv * p.value_dim(); e < (sk.offset + sk.length) * p.heads_kv * p.value_dim();
         ++e) {
      out.dv[e] = round_to(r, dv_acc[e]);
    }
  }
  return out;
}

}  // namespace hopattn::cpu_reference
