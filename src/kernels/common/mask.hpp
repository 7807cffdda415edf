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

  // The same mask without the bounds that hide nothing in any sequence of at most max_seqlen_q
  // queries and max_seqlen_k keys: the left bound hides keys only while left < seqlen_k - 1, the
  // right one only while right < seqlen_q - 1. Causal with one query row (decode) and windows as
  // wide as the keys are then unbounded, and the kernels take their unmasked paths (the forward
  // its wider key blocks and split tail) for them.
  HOPATTN_HOST_DEVICE BandMask without_vacuous_bounds(int max_seqlen_q, int max_seqlen_k) const {
    BandMask m = *this;
    if (m.left >= 0 && m.left >= max_seqlen_k - 1) m.left = -1;
    if (m.right >= 0 && m.right >= max_seqlen_q - 1) m.right = -1;
    return m;
  }

  // The same mask seen from the keys: query i is visible to key j. Used by the backward, which
  // iterates over query blocks for a fixed key block.
  HOPATTN_HOST_DEVICE BandMask transposed() const { return BandMask{right, left}; }
};

// The band seen from one axis of a tile: "outer" positions (a tile's rows) and the "inner"
// positions (its columns) each of them sees. The forward looks from the queries, the backward
// (whose score tiles are S^T) from the keys through the transposed band; tile ranges
// (block_range.hpp) and the element masks of both mainloops (mask_fragment.cuh) all come from
// lo/hi below, so a change to the mask is made here once.
struct BandView {
  BandMask band;  // in this view's orientation
  int outer_len = 0;
  int inner_len = 0;

  HOPATTN_HOST_DEVICE static BandView from_queries(BandMask mask, int seqlen_q, int seqlen_k) {
    return BandView{mask, seqlen_q, seqlen_k};
  }
  HOPATTN_HOST_DEVICE static BandView from_keys(BandMask mask, int seqlen_q, int seqlen_k) {
    return BandView{mask.transposed(), seqlen_k, seqlen_q};
  }

  // Bottom-right alignment: the diagonal of outer position o is inner position o + shift.
  HOPATTN_HOST_DEVICE long long shift() const { return static_cast<long long>(inner_len) - outer_len; }
  HOPATTN_HOST_DEVICE bool real_outer(long long outer) const { return outer >= 0 && outer < outer_len; }
  // The band's edges for outer position `outer`, unclipped (meaningful where that side is bounded).
  HOPATTN_HOST_DEVICE long long left_edge(long long outer) const { return outer + shift() - band.left; }
  HOPATTN_HOST_DEVICE long long right_edge(long long outer) const { return outer + shift() + band.right; }
  // The first and last inner position the band lets outer position `outer` see, within
  // [0, inner_len) (empty when lo > hi). Both only grow with `outer`.
  HOPATTN_HOST_DEVICE long long lo(long long outer) const {
    return band.left >= 0 && left_edge(outer) > 0 ? left_edge(outer) : 0;
  }
  HOPATTN_HOST_DEVICE long long hi(long long outer) const {
    return band.right >= 0 && right_edge(outer) < inner_len - 1 ? right_edge(outer) : inner_len - 1LL;
  }
};

}  // namespace hopattn
