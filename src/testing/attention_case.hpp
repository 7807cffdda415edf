// One attention problem with random inputs on the device and host copies for the references:
// what every GPU test and the benchmark start from.
#pragma once

#include <cstdint>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "reference/cpu_reference.hpp"
#include "testing/device_buffer.hpp"

namespace hopattn::testing {

struct CaseSpec {
  DType dtype = DType::kBFloat16;  // of Q, K, V (and, 16-bit, of O, dO and the gradients)
  int batch = 2;  // ignored in varlen mode (the number of sequences)
  int seqlen_q = 128;
  int seqlen_k = 128;
  int heads = 4;
  int heads_kv = 4;
  int head_dim = 64;   // of Q and K (and dQ, dK)
  int head_dim_v = 0;  // of V, O, dO and dV; 0: head_dim
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softmax_scale = kDefaultSoftmaxScale;
  // Varlen mode when non-empty: the length of each sequence (seqlen_q/seqlen_k then unused).
  std::vector<int> varlen_seqlens_q;
  std::vector<int> varlen_seqlens_k;
  std::vector<int> seqused_q;  // optional, varlen only
  std::vector<int> seqused_k;
  int row_padding = 0;  // extra elements in every row stride (multiple of 8): non-contiguous tensors
  uint64_t seed = 0;
  // The forward's layout options (ForwardArgs): key splits and packed GQA heads.
  int num_splits = 0;
  PackGqa pack_gqa = PackGqa::kAuto;
  std::vector<float> sinks;  // attention sinks, one logit per query head; empty: none
  float softcap = 0.0f;      // > 0: scores capped at softcap * tanh(score / softcap)
  // FP8 inputs (dtype kFloat8E4M3, forward only): O's dtype (and dO's), and whether q, k and v get
  // random descale factors, fp32 (batch, heads_kv) in [1/4, 4), or none (factors of 1).
  DType fp8_out_dtype = DType::kBFloat16;
  bool fp8_descales = true;

  bool varlen() const { return !varlen_seqlens_q.empty(); }
  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool fp8() const { return dtype == DType::kFloat8E4M3; }
  DType out_dtype() const { return fp8() ? fp8_out_dtype : dtype; }
};

// Output buffers, poisoned with NaN bit patterns so that any element a kernel forgets (or writes
// where it must not) shows.
struct Outputs {
  DeviceBuffer o, lse, dq, dk, dv, dsinks;
};

enum class Field { kQ, kK, kV, kDout, kO, kLse, kDq, kDk, kDv, kDsinks };

// Device values in the packed host layout of cpu_reference; elements still holding the poison
// pattern read as NaN and are flagged.
struct Downloaded {
  std::vector<double> values;
  std::vector<bool> untouched;
  size_t padding_writes = 0;  // elements written in the padding between rows (never allowed)
};

class AttentionCase {
 public:
  explicit AttentionCase(const CaseSpec& spec);

  const CaseSpec& spec() const { return spec_; }
  const cpu_reference::HostProblem& host_problem() const { return host_; }

  Outputs new_outputs() const;
  ForwardArgs forward_args(const Outputs& out) const;
  // Backward of the forward that wrote `forward` (its O and LSE), gradients into `grads`.
  BackwardArgs backward_args(const Outputs& forward, const Outputs& grads) const;

  // Inputs as float64 in the packed layout: exactly the values they stand for (FP8 ones times their
  // descale factor, which float64 holds exactly).
  std::vector<double> input(Field field) const;
  Downloaded download(const Outputs& out, Field field) const;

 private:
  // The row layouts: Q (Q, dQ) and O (O, dO) have one row per query of `heads` heads, K (K, dK)
  // and V (V, dV) one per key of `heads_kv` heads; Q and K heads hold head_dim entries, O and V
  // heads head_dim_v. Device rows are row_padding elements longer than that.
  enum class Rows { kQ, kK, kV, kO };
  Tensor row_tensor(void* data, Rows layout) const;
  Tensor lse_tensor(void* data) const;
  int64_t rows(Rows layout) const;
  int heads(Rows layout) const;
  int dim(Rows layout) const;
  int64_t row_elements(Rows layout) const;  // heads * dim: one packed row
  int64_t row_stride(Rows layout) const;    // one device row
  DType dtype(Rows layout) const;           // O's rows have O's dtype, the others the inputs'
  size_t element_bytes(Rows layout) const;
  size_t row_buffer_bytes(Rows layout) const;
  Varlen varlen_args() const;
  // The descale factor of `field`'s element at (packed row, head): 1 without FP8 descales.
  double descale(Field field, int64_t row, int head) const;

  CaseSpec spec_;
  cpu_reference::HostProblem host_;
  // Packed layout, element_bytes() per element: 2 for 16-bit dtypes, 1 for FP8.
  std::vector<uint8_t> q_bytes_, k_bytes_, v_bytes_, dout_bytes_;
  DeviceBuffer q_, k_, v_, dout_;
  DeviceBuffer cu_seqlens_q_, cu_seqlens_k_, seqused_q_, seqused_k_, sinks_;
  std::vector<float> q_descale_, k_descale_, v_descale_;  // FP8 with fp8_descales: (batch, heads_kv)
  DeviceBuffer q_descale_buffer_, k_descale_buffer_, v_descale_buffer_;
};

}  // namespace hopattn::testing
