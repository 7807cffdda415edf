// Which tiles a CTA visits, and which of them need the mask applied.
//
// A CTA owns one block of an "outer" axis (query rows in the forward, key rows in the backward)
// and loops over blocks of the "inner" axis. For a band mask the inner positions visible to the
// real rows of an outer block form one contiguous interval (consecutive rows see intervals shifted
// by one), so both answers are half-open block ranges. The backward uses the transposed mask.
#pragma once

#include "kernels/common/fast_divisor.hpp"
#include "kernels/common/host_device.hpp"
#include "kernels/common/mask.hpp"

namespace hopattn {

struct BlockRange {
  int begin = 0;
  int end = 0;  // exclusive

  HOPATTN_HOST_DEVICE bool empty() const { return begin >= end; }
  HOPATTN_HOST_DEVICE int size() const { return empty() ? 0 : end - begin; }
};

HOPATTN_HOST_DEVICE BlockRange intersect(const BlockRange& a, const BlockRange& b) {
  return BlockRange{a.begin > b.begin ? a.begin : b.begin, a.end < b.end ? a.end : b.end};
}

namespace detail {

HOPATTN_HOST_DEVICE long long floor_div(long long a, long long b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
HOPATTN_HOST_DEVICE long long ceil_div(long long a, long long b) { return -floor_div(-a, b); }
HOPATTN_HOST_DEVICE long long max_ll(long long a, long long b) { return a > b ? a : b; }
HOPATTN_HOST_DEVICE long long min_ll(long long a, long long b) { return a < b ? a : b; }

// The real rows of `outer_block`: [first, last], empty when first > last. Outer block b covers
// tile rows [b * size - pad, (b + 1) * size - pad); `pack` consecutive tile rows share one outer
// position (the forward's packed GQA heads: one query row of every head of a KV group), so tile
// row r is outer position r / pack, and a sequence of outer_len positions has outer_len * pack rows.
struct RealRows {
  long long first, last;
};
HOPATTN_HOST_DEVICE RealRows real_rows(int outer_block, int outer_block_size, int outer_pad, int outer_len,
                                       const FastDivisor& pack) {
  const long long start = static_cast<long long>(outer_block) * outer_block_size - outer_pad;
  const long long first = max_ll(start, 0);
  const long long last = min_ll(start + outer_block_size, static_cast<long long>(outer_len) * pack.divisor()) - 1;
  if (first > last) return RealRows{1, 0};
  if (pack.divisor() == 1) return RealRows{first, last};
  // Packed rows fit in int (fwd_split_plan.hpp packs only then).
  return RealRows{pack.divide(static_cast<int>(first)), pack.divide(static_cast<int>(last))};
}

// Inner blocks holding at least one position visible to a real row of `outer_block`: the band's
// edges only grow with the row, so from the first real row's lo to the last real row's hi.
// Without bounds every real row sees every inner position: only whether the block has a real row
// is asked (the forward's decode and unmasked tiles; the general form's arithmetic, 64-bit and
// twice per tile, was a large part of a decode tile's start).
HOPATTN_HOST_DEVICE BlockRange visible_inner_blocks(const BandView& view, int outer_block, int outer_block_size,
                                                    int outer_pad, int inner_block_size, const FastDivisor& pack) {
  if (view.band.unbounded()) {
    const long long start = static_cast<long long>(outer_block) * outer_block_size - outer_pad;
    const long long rows = static_cast<long long>(view.outer_len) * pack.divisor();
    if (rows <= 0 || start >= rows || start + outer_block_size <= 0 || view.inner_len <= 0) return BlockRange{};
    return BlockRange{0, (view.inner_len - 1) / inner_block_size + 1};
  }
  const RealRows rows = real_rows(outer_block, outer_block_size, outer_pad, view.outer_len, pack);
  if (rows.first > rows.last || view.inner_len <= 0) return BlockRange{};
  const long long lo = view.lo(rows.first);
  const long long hi = view.hi(rows.last);
  if (lo > hi) return BlockRange{};
  return BlockRange{static_cast<int>(lo / inner_block_size), static_cast<int>(hi / inner_block_size + 1)};
}

// Inner blocks (within visible_inner_blocks) in which every position is real and visible to every
// real row of `outer_block`: these run without the mask. When there are none the range is empty
// and placed at the end of the visible range, so [visible.begin, unmasked.begin) and
// [unmasked.end, visible.end) are always exactly the blocks that need masking.
HOPATTN_HOST_DEVICE BlockRange unmasked_inner_blocks(const BandView& view, int outer_block, int outer_block_size,
                                                     int outer_pad, int inner_block_size, const FastDivisor& pack) {
  const BlockRange visible =
      visible_inner_blocks(view, outer_block, outer_block_size, outer_pad, inner_block_size, pack);
  if (visible.empty()) return visible;
  if (view.band.unbounded()) {  // the blocks without padding keys
    const int whole = view.inner_len / inner_block_size;
    return whole > 0 ? BlockRange{0, whole} : BlockRange{visible.end, visible.end};
  }
  const RealRows rows = real_rows(outer_block, outer_block_size, outer_pad, view.outer_len, pack);
  // The block must start at or after the last row's lo and end by the first row's hi.
  const long long begin = ceil_div(view.lo(rows.last), inner_block_size);
  const long long end = floor_div(view.hi(rows.first) + 1, inner_block_size);
  if (begin >= end) return BlockRange{visible.end, visible.end};
  return BlockRange{static_cast<int>(begin), static_cast<int>(end)};
}

}  // namespace detail

// Forward: how many rows the query blocks start before the first query, so that the one partial
// block of a sequence is its cheapest. Under a mask bounded on the right (causal) the first
// queries see the fewest keys: a partial last block would cost nearly a full block's key range
// for a fraction of its rows (at d64, 192-row blocks over 2k queries: 5% of all the work).
HOPATTN_HOST_DEVICE int query_block_pad(BandMask mask, int block_m, int seqlen_q) {
  if (mask.right < 0 || seqlen_q <= 0) return 0;
  return (block_m - seqlen_q % block_m) % block_m;
}

// Forward: key blocks (kBlockN) that query block m_block (kBlockM rows from m_block * kBlockM -
// pad) must visit. With packed GQA heads (pack > 1) its rows are (query, head) pairs, `pack` per
// query row, and pad counts rows.
HOPATTN_HOST_DEVICE BlockRange n_block_range(BandMask mask, int m_block, int block_m, int block_n, int seqlen_q,
                                             int seqlen_k, int pad = 0, const FastDivisor& pack = FastDivisor()) {
  return detail::visible_inner_blocks(BandView::from_queries(mask, seqlen_q, seqlen_k), m_block, block_m, pad, block_n,
                                      pack);
}

// Forward: the key blocks of n_block_range that need no masking.
HOPATTN_HOST_DEVICE BlockRange n_block_range_unmasked(BandMask mask, int m_block, int block_m, int block_n,
                                                      int seqlen_q, int seqlen_k, int pad = 0,
                                                      const FastDivisor& pack = FastDivisor()) {
  return detail::unmasked_inner_blocks(BandView::from_queries(mask, seqlen_q, seqlen_k), m_block, block_m, pad, block_n,
                                       pack);
}

// Forward with key splits: piece `split` of `splits` of a tile's visible key blocks, near-equal
// runs in key order, the first n % splits of them a block longer (empty ones where there are
// fewer blocks than pieces).
HOPATTN_HOST_DEVICE BlockRange key_split_piece(const BlockRange& visible, int split, const FastDivisor& splits) {
  const int n = visible.size();
  const int run = splits.divide(n), longer = n - run * splits.divisor();
  const int begin = visible.begin + split * run + (split < longer ? split : longer);
  return BlockRange{begin, begin + run + (split < longer ? 1 : 0)};
}

// Backward: query blocks (kBlockM) that key block n_block (kBlockN keys) must visit.
HOPATTN_HOST_DEVICE BlockRange m_block_range(BandMask mask, int n_block, int block_m, int block_n, int seqlen_q,
                                             int seqlen_k) {
  return detail::visible_inner_blocks(BandView::from_keys(mask, seqlen_q, seqlen_k), n_block, block_n, 0, block_m,
                                      FastDivisor());
}

// Backward: the query blocks of m_block_range that need no masking.
HOPATTN_HOST_DEVICE BlockRange m_block_range_unmasked(BandMask mask, int n_block, int block_m, int block_n,
                                                      int seqlen_q, int seqlen_k) {
  return detail::unmasked_inner_blocks(BandView::from_keys(mask, seqlen_q, seqlen_k), n_block, block_n, 0, block_m,
                                       FastDivisor());
}

}  // namespace hopattn
