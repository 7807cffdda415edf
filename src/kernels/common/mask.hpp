// The attention mask as one band: causal and sliding windows are all "key j is visible to query i
// iff  i + shift - left <= j <= i + shift + right", shift = seqlen_k - seqlen_q (bottom-right
// alignment), with a negative bound meaning unbounded on that side.
#pragma once

#include "kernels/common/host_device.hpp"

namespace hopattn {

struct BandMask {
  int left = -1;   // keys visible to the left of the diagonal; < 0: unbounded
  int right = -1;  // keys visible to the right of the diagonal; < 0: unbounded

  // causal is the band (window_left, 0); the API rejects causal with window_right > 0.
  HOPATTN_HOST_DEVICE static BandMask from_args(bool causal, int window_left, int window_right) {
    return BandMask{window_left, causal ? 0 : window_right};
  }

  HOPATTN_HOST_DEVICE bool unbounded() const { return left < 0 && right < 0; }

  // The same mask seen from the keys: query i is visible to key j. Used by the backward, which
  // iterates over query blocks for a fixed key block.
  HOPATTN_HOST_DEVICE BandMask transposed() const { return BandMask{right, left}; }
};

// Whether key j (of seqlen_k) is visible to query i (of seqlen_q). Out-of-range indices are hidden.
HOPATTN_HOST_DEVICE bool is_visible(BandMask mask, long long i, long long j, long long seqlen_q, long long seqlen_k) {
  if (i < 0 || i >= seqlen_q || j < 0 || j >= seqlen_k) return false;
  const long long diagonal = i + seqlen_k - seqlen_q;
  if (mask.left >= 0 && j < diagonal - mask.left) return false;
  if (mask.right >= 0 && j > diagonal + mask.right) return false;
  return true;
}

}  // namespace hopattn
