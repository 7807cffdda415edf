// Softcapping in the kernels (ScoreVariant::kSoftcap): S = c * tanh(s * softmax_scale / c) for the
// raw score s = q.k. The forward keeps t = tanh(s * softmax_scale / c) as the score and folds c
// into the softmax's exp2 factor (c * log2(e)), so the online softmax runs unchanged on t; the
// backward computes P from t and needs dS_raw = dS * (1 - t^2) * softmax_scale, whose scale the
// plain backward already applies to dQ and dK at the end; it recovers t from P for that.
#pragma once

#include <cute/config.hpp>

namespace hopattn {

// tanh as one MUFU.TANH (sm_75+): absolute error about 2^-11, below the bf16/fp16 rounding of P
// that follows (FlashAttention-3 uses the same instruction for its softcap).
CUTE_DEVICE float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2 as one MUFU.LG2, denormal inputs flushed to zero (-inf out).
CUTE_DEVICE float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace hopattn
