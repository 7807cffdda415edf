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
  DType dtype = DType::kBFloat16;
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

  bool varlen() const { return !varlen_seqlens_q.empty(); }
  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
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

  // Inputs as float64 in the packed layout (exactly the values on the device).
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
  size_t row_buffer_bytes(Rows layout) const;
  Varlen varlen_args() const;

  CaseSpec spec_;
  cpu_reference::HostProblem host_;
  std::vector<uint16_t> q_bits_, k_bits_, v_bits_, dout_bits_;  // packed layout
  DeviceBuffer q_, k_, v_, dout_;
  DeviceBuffer cu_seqlens_q_, cu_seqlens_k_, seqused_q_, seqused_k_, sinks_;
};

}  // namespace hopattn::testing
