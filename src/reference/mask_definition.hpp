// The mask exactly as docs/semantics.md defines it, for the references (the float64 CPU reference
// and the GPU oracle) and for tests that check the kernels' tile ranges. The kernels derive their
// ranges in kernels/common/block_range.hpp; an oracle must not share the code it checks, so nothing
// here calls into that file.
#pragma once

#include "kernels/common/host_device.hpp"
#include "kernels/common/mask.hpp"

namespace hopattn {

// Whether key j (of seqlen_k) is visible to query i (of seqlen_q): with shift = seqlen_k -
// seqlen_q, iff  i + shift - left <= j <= i + shift + right, a negative bound being unbounded.
// Out-of-range indices are hidden.
HOPATTN_HOST_DEVICE bool is_visible(BandMask mask, long long i, long long j, long long seqlen_q, long long seqlen_k) {
  if (i < 0 || i >= seqlen_q || j < 0 || j >= seqlen_k) return false;
  const long long shift = seqlen_k - seqlen_q;
  if (mask.left >= 0 && j < i + shift - mask.left) return false;
  if (mask.right >= 0 && j > i + shift + mask.right) return false;
  return true;
}

// An inclusive index interval; empty when first > last.
struct IndexInterval {
  long long first = 0;
  long long last = -1;
  HOPATTN_HOST_DEVICE bool empty() const { return first > last; }
};

// The keys visible to query i: the inequality above solved for j, clipped to [0, seqlen_k).
HOPATTN_HOST_DEVICE IndexInterval visible_keys(BandMask mask, long long i, long long seqlen_q, long long seqlen_k) {
  if (i < 0 || i >= seqlen_q) return IndexInterval{};
  const long long shift = seqlen_k - seqlen_q;
  IndexInterval keys{0, seqlen_k - 1};
  if (mask.left >= 0 && i + shift - mask.left > keys.first) keys.first = i + shift - mask.left;
  if (mask.right >= 0 && i + shift + mask.right < keys.last) keys.last = i + shift + mask.right;
  return keys;
}

// The queries that see key j: the inequality solved for i, clipped to [0, seqlen_q).
HOPATTN_HOST_DEVICE IndexInterval visible_queries(BandMask mask, long long j, long long seqlen_q, long long seqlen_k) {
  if (j < 0 || j >= seqlen_k) return IndexInterval{};
  const long long shift = seqlen_k - seqlen_q;
  IndexInterval queries{0, seqlen_q - 1};
  if (mask.right >= 0 && j - shift - mask.right > queries.first) queries.first = j - shift - mask.right;
  if (mask.left >= 0 && j - shift + mask.left < queries.last) queries.last = j - shift + mask.left;
  return queries;
}

}  // namespace hopattn
