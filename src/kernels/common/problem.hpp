// The validated, normalised description of one attention call: what the API layer hands the
// launchers. Lives beside the kernels so that the dependency runs one way (api -> kernels).
#pragma once

#include <cstdint>

#include "hopattn/hopattn.hpp"
#include "kernels/common/host_device.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/seqlen.hpp"

namespace hopattn {

// A (batch, row, head, dim) or varlen (row, head, dim) tensor as base pointer plus element strides;
// the last dimension is contiguous. In varlen mode batch_stride is 0 and rows are packed tokens.
// LSE uses the same form with head_dim 1 ((batch, head, row) or (head, row)).
struct RowTensor {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;

  // The element at (batch, token, head, 0); token counts along the packed axis in varlen mode.
  template <typename T>
  HOPATTN_HOST_DEVICE T* at(long long batch, long long token, long long head) const {
    return static_cast<T*>(data) + batch * batch_stride + token * row_stride + head * head_stride;
  }
};

struct Problem {
  DType dtype = DType::kBFloat16;
  int batch = 0;
  int heads = 0;
  int heads_kv = 0;
  int head_dim = 0;
  // Fixed-length mode: the sequence lengths, and total_tokens = batch * length.
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  SequenceLayout queries;
  SequenceLayout keys;
  float softmax_scale = 0.0f;  // resolved: never 0
  BandMask mask;
  // Forward only: ForwardArgs::num_splits (>= 0) and pack_gqa, as the caller gave them.
  int num_splits = 0;
  PackGqa pack_gqa = PackGqa::kAuto;

  HOPATTN_HOST_DEVICE bool varlen() const { return queries.varlen(); }
  HOPATTN_HOST_DEVICE int64_t total_q() const { return queries.total_tokens; }
  HOPATTN_HOST_DEVICE int64_t total_k() const { return keys.total_tokens; }
};

struct ForwardTensors {
  RowTensor q, k, v, o, lse;  // lse.data may be null
};

struct BackwardTensors {
  RowTensor q, k, v, o, lse, dout, dq, dk, dv;
};

}  // namespace hopattn
