// The float64 CPU reference: attention computed straight from its definition, for every feature
// (masks, GQA, varlen, seqused) and for the score and shape features the kernels are getting
// (softcap, attention sinks, a value head dim of its own). It is the ground truth of the test suite.
//
// Tensors are host vectors in the packed layout: Q/dQ (total_q, heads, head_dim), K/dK (total_k,
// heads_kv, head_dim), V/dV (total_k, heads_kv, value_dim), O/dO (total_q, heads, value_dim), LSE
// (heads, total_q). A fixed-length batch is the varlen batch with cu_seqlens = {0, s, 2s, ...}.
// Rows that are not real (past seqused) come back as NaN: an implementation must leave them
// untouched.
//
// With softcap c > 0 the score of a visible pair is S = c * tanh(softmax_scale * q.k / c) (Gemma 2);
// with sinks, query head h's softmax has one more term exp(sinks[h]) in its denominator, a logit
// that no key and no value belongs to (gpt-oss): LSE = log(sum_j exp(S_j) + exp(sink)), so a row
// that sees no key gets LSE = sink and O = 0.
#pragma once

#include <cstdint>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/seqlen.hpp"

namespace hopattn::cpu_reference {

struct HostProblem {
  int heads = 1;
  int heads_kv = 1;
  int head_dim = 8;
  std::vector<int32_t> cu_seqlens_q;  // batch + 1
  std::vector<int32_t> cu_seqlens_k;  // batch + 1
  std::vector<int32_t> seqused_q;     // empty or batch
  std::vector<int32_t> seqused_k;     // empty or batch
  double softmax_scale = 1.0;
  BandMask mask;
  int head_dim_v = 0;          // of V, O, dO and dV; 0: head_dim
  double softcap = 0;          // > 0: scores are capped (see above)
  std::vector<double> sinks;   // empty, or one logit per query head (see above)

  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  int batch() const { return static_cast<int>(cu_seqlens_q.size()) - 1; }
  int64_t total_q() const { return cu_seqlens_q.back(); }
  int64_t total_k() const { return cu_seqlens_k.back(); }
  SequenceLayout queries() const;
  SequenceLayout keys() const;
};

// A fixed-length batch as a HostProblem.
HostProblem fixed_length_problem(int batch, int seqlen_q, int seqlen_k, int heads, int heads_kv, int head_dim,
                                 double softmax_scale, BandMask mask);

// kNone computes in float64 throughout. kFloat16/kBFloat16 round every intermediate (S, P, O, dP,
// dS and the gradients) to that dtype: the naive low-precision computation whose error bounds an
// implementation's error in FA3's tolerance rule. FP8 inputs have a naive forward of their own
// (naive_fp8_forward below), which rounds each intermediate to a different dtype.
enum class Rounding { kNone, kFloat16, kBFloat16, kFloat8E4M3 };
Rounding rounding_for(DType dtype);
// Round to nearest even in the dtype. kFloat8E4M3 (OCP e4m3: 3 mantissa bits, subnormals below
// 2^-6 in steps of 2^-9) saturates at +-448, its largest finite value, as FP8 kernels convert.
double round_to(Rounding rounding, double x);

// What the naive forward rounds each intermediate to.
struct ForwardRounding {
  Rounding scores = Rounding::kNone;         // S (after the scale, and after the cap)
  Rounding probabilities = Rounding::kNone;  // P
  Rounding output = Rounding::kNone;         // O
};
// Every intermediate in one dtype (the 16-bit inputs' naive computation, or none).
ForwardRounding uniform_rounding(Rounding rounding);
// The naive computation of an FP8 forward (docs/semantics.md, "FP8"), FlashAttention-3's: FP8
// GEMMs with 16-bit results, so S rounded to O's dtype (bf16 or fp16), P in [0, 1] rounded to e4m3
// (the operand of the P V GEMM), O rounded to its dtype.
ForwardRounding naive_fp8_forward(DType out_dtype);

struct ForwardResult {
  std::vector<double> o;
  std::vector<double> lse;  // -inf for a row that sees no key
};

struct BackwardResult {
  std::vector<double> dq, dk, dv;
  std::vector<double> dsink;  // with sinks: the gradient of each query head's sink (summed over rows)
};

// FP8 inputs come dequantized (element * descale), so that kNone gives the exact attention of the
// values they stand for.
ForwardResult forward(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, ForwardRounding rounding);
ForwardResult forward(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, Rounding rounding = Rounding::kNone);

// Gradients of sum(O * dout), recomputing the forward from q, k, v.
BackwardResult backward(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout,
                        Rounding rounding = Rounding::kNone);

}  // namespace hopattn::cpu_reference
