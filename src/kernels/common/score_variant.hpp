// The kernels' variant axis: what is done to a score before the softmax, in both directions. A
// template parameter of the forward and backward kernels, chosen at dispatch from the problem, so
// that the plain kernels keep their code and a variant costs compile time only where a build asks
// for it (CMake HOPATTN_SOFTCAP). A later score feature is one more value here and one more
// branch of the score functions (softcap.cuh), not edits across the mainloops.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"
#include "kernels/common/problem.hpp"

namespace hopattn {

enum class ScoreVariant : int32_t {
  kPlain = 0,    // S = softmax_scale * q.k
  kSoftcap = 1,  // S = softcap * tanh(softmax_scale * q.k / softcap)
};

HOPATTN_HOST_DEVICE ScoreVariant score_variant(const Problem& p) {
  return p.softcap > 0.f ? ScoreVariant::kSoftcap : ScoreVariant::kPlain;
}

}  // namespace hopattn
