// Merging the pieces of a softmax row that were computed apart (the forward's split tail and its
// key splits): each piece gives its normalised output O_s and its LSE lse_s (natural log), and
//   lse = log(sum_s exp(lse_s)),   O = sum_s exp(lse_s - lse) * O_s.
// LogSumExp accumulates lse one piece (or one partial accumulator) at a time, as a running maximum
// and the sum of exp(lse_s - maximum); a piece that saw no key has lse_s = -inf and weight 0. The
// result depends on the order of the additions, so callers add in a fixed order.
#pragma once

#include <cmath>

#include "kernels/common/host_device.hpp"

namespace hopattn {

struct LogSumExp {
  float top = -INFINITY;  // the largest lse_s so far
  float sum = 0.f;        // sum of exp(lse_s - top)

  HOPATTN_HOST_DEVICE void add(float lse) { merge(LogSumExp{lse, 1.f}); }

  // Adds another accumulator's pieces.
  HOPATTN_HOST_DEVICE void merge(const LogSumExp& other) {
    if (other.top == -INFINITY) return;
    if (top == -INFINITY) {
      *this = other;
      return;
    }
    if (other.top > top) {
      sum = sum * expf(top - other.top) + other.sum;
      top = other.top;
    } else {
      sum += other.sum * expf(other.top - top);
    }
  }

  // lse of all pieces added (-inf if none saw a key).
  HOPATTN_HOST_DEVICE float value() const { return top == -INFINITY ? -INFINITY : top + logf(sum); }
};

// The weight of a piece with LSE `piece_lse` in a row whose merged LSE is `row_lse` (finite).
HOPATTN_HOST_DEVICE float piece_weight(float piece_lse, float row_lse) { return expf(piece_lse - row_lse); }

}  // namespace hopattn
