// Where one (m_block, head, batch) tile of the forward lives, and which key blocks it visits:
// plain host/device code, so that the CPU tests check the whole decomposition of a problem into
// tiles (and packed rows, key pieces) against the mask's definition.
#pragma once

#include "kernels/common/block_range.hpp"
#include "kernels/common/host_device.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/common/tile_scheduler.hpp"

namespace hopattn {

struct ForwardTile {
  // Tile rows are query rows or, where the kernel packs GQA heads (params.pack > 1), (query row,
  // head) pairs: row r is query r / pack of head `head` + r % pack (see query_of / head_of). The
  // pack is the kernel's, not a field: the publisher warp builds the tile in 24 registers.
  int first_row;  // row of the tile's row 0: m_block * kBlockM - query_block_pad (may be < 0)
  int head;       // the tile's (first) query head
  int head_kv;
  int batch_coord;  // batch index of Q's TMA tensor (0 in varlen mode, where offsets locate sequences)
  int kv_batch;     // of K/V's: the same, or a KV cache's row (of the page table when paged)
  int batch;
  int q_offset;  // first token of the sequence along the packed axis (0 in fixed-length mode)
  int k_offset;  // first key along K/V's token axis (a KV cache's left padding)
  int seqlen_q;
  int seqlen_k;
  BlockRange n_blocks;  // key blocks to visit, all of them from n_blocks.end - 1 down
  BlockRange unmasked;  // the ones among them that need no mask
  // A KV cache's lengths or row index broke the cache's bounds: no key is read and the rows are NaN.
  bool faulted;

  HOPATTN_HOST_DEVICE int rows(const FastDivisor& pack) const { return seqlen_q * pack.divisor(); }
  HOPATTN_HOST_DEVICE bool has_rows(const FastDivisor& pack) const { return first_row < rows(pack); }
  // Row `row` (>= 0) of the sequence's rows: its query and head.
  HOPATTN_HOST_DEVICE int query_of(int row, const FastDivisor& pack) const { return pack.divide(row); }
  HOPATTN_HOST_DEVICE int head_of(int row, const FastDivisor& pack) const { return head + pack.remainder(row); }

  // What the publisher warp hands the consumers after the last tile (no tile has a negative head).
  HOPATTN_HOST_DEVICE static ForwardTile end_marker() {
    ForwardTile t{};
    t.head = -1;
    return t;
  }
  HOPATTN_HOST_DEVICE bool is_end_marker() const { return head < 0; }
};

// Where key block n of tile t lies in K/V's TMA tensors: (block along the token axis after the
// tile's k_offset, batch coordinate). Contiguous K/V: block n of the tile's batch (or cache) row.
// A paged KV cache whose pages hold whole key blocks (page_size a multiple of block_n, no left
// padding): block n % (page_size / block_n) of the page the table names. A page outside the cache
// is a fault, and the coordinate points past the tensor, where TMA reads nothing and fills zeros.
struct KeyBlockCoord {
  int block;
  int batch;
  bool fault;
};

HOPATTN_HOST_DEVICE KeyBlockCoord key_block_coord(const KeyCache& cache, const ForwardTile& t, int n, int block_n) {
  if (!cache.paged()) return KeyBlockCoord{n, t.kv_batch, false};
  const int page = cache.page(t.kv_batch, n * block_n);
  if (page < 0) return KeyBlockCoord{0, cache.num_pages, true};
  return KeyBlockCoord{cache.page_size.remainder(n * block_n) / block_n, page, false};
}

// Keys per TMA box where a paged KV cache's pages hold whole boxes but not whole key blocks
// (KeyCache::page_box_rows): two rows of 128-byte swizzle atoms, so that a box lands in a stage
// exactly as the same rows of a whole-block copy do; the page sizes engines use (16 and up, powers
// of two) are multiples of it. Where the page size and the key block are multiples of 64, boxes
// of 64 keys: a quarter of the copies (a 16-key box at d128 is two 2 KiB copies, and paged
// chunked prefill, whose consumers take a block every microsecond, ran at 0.73 of contiguous
// with 16-key boxes against 0.92 with whole blocks on the H100).
inline constexpr int kPageBoxRows = 16;
inline constexpr int kWidePageBoxRows = 64;

// Whether a helper warp loads V while the producer loads K and Q (forward_producer's V loader):
// with 16-key boxes, eight copies a block for each tensor at 128 keys, the producer alone limited
// paged chunked prefill (page 16: 0.896 -> 0.921 of contiguous with the V loader, H100); with
// 64-key boxes, two a block, the loader's handshake on the tile slots cost more than the split
// returned (page 64: 0.958 -> 0.943).
HOPATTN_HOST_DEVICE bool loads_v_beside_producer(const KeyCache& cache) {
  return cache.page_box_rows == kPageBoxRows;
}

// How the forward's producer loads a paged cache's key blocks of block_n keys (KeyCache::gather
// and page_box_rows; neither: one TMA copy a block), `left_padded` where the keys may start inside
// a page (cache_leftpad).
HOPATTN_HOST_DEVICE void choose_paged_loads(KeyCache& cache, bool left_padded, int block_n) {
  const int page_size = cache.page_size.divisor();
  cache.gather = cache.paged() && (left_padded || page_size % kPageBoxRows != 0);
  const bool boxes = cache.paged() && !cache.gather && page_size % block_n != 0;
  const bool wide = page_size % kWidePageBoxRows == 0 && block_n % kWidePageBoxRows == 0;
  cache.page_box_rows = boxes ? (wide ? kWidePageBoxRows : kPageBoxRows) : 0;
}

// Where box b of key block n lies in K/V's TMA tensors, for a paged cache whose pages hold whole
// boxes of `rows` = KeyCache::page_box_rows keys but not whole blocks: (box along the page's token
// axis, page). The box's keys are positions n * block_n + b * rows on of the cache row, all on one
// page. A box past the sequence's keys points past the tensor, where TMA reads
// nothing and fills zeros, as does one on a page outside the cache, which is a fault.
HOPATTN_HOST_DEVICE KeyBlockCoord page_box_coord(const KeyCache& cache, const ForwardTile& t, int n, int b,
                                                 int block_n) {
  const int rows = cache.page_box_rows;
  const int position = n * block_n + b * rows;
  if (position >= t.seqlen_k) return KeyBlockCoord{0, cache.num_pages, false};
  const int page = cache.page(t.kv_batch, position);
  if (page < 0) return KeyBlockCoord{0, cache.num_pages, true};
  // The box along the page: rows is one of two powers of two, so a shift, not a division.
  const int in_page = cache.page_size.remainder(position);
  return KeyBlockCoord{rows == kWidePageBoxRows ? in_page / kWidePageBoxRows : in_page / kPageBoxRows, page, false};
}

// Key block n of tile t in a paged cache whose rows are gathered one by one: its keys are the
// positions [first, end) of the cache row, so their pages are the consecutive table entries from
// first_entry on (the producer loads them all at once, then gives each row its entry's page).
struct GatheredBlock {
  int first;        // the block's first position in the cache row
  int end;          // past its last real key's position
  int first_entry;  // the table entry of `first`'s page
  int entries;      // table entries the block's keys span

  HOPATTN_HOST_DEVICE bool real(int r) const { return first + r < end; }
  // Row r's entry, counted from first_entry, and its row in that page.
  HOPATTN_HOST_DEVICE int entry(int r, const FastDivisor& page_size) const {
    return page_size.divide(first + r) - first_entry;
  }
  HOPATTN_HOST_DEVICE int row_in_page(int r, const FastDivisor& page_size) const {
    return page_size.remainder(first + r);
  }
};

HOPATTN_HOST_DEVICE GatheredBlock gathered_block(const KeyCache& cache, const ForwardTile& t, int n, int block_n) {
  GatheredBlock g;
  g.first = t.k_offset + n * block_n;
  const int block_end = (n + 1) * block_n;
  g.end = t.k_offset + (block_end < t.seqlen_k ? block_end : t.seqlen_k);  // a visited block has a real key
  g.first_entry = cache.page_size.divide(g.first);
  g.entries = cache.page_size.divide(g.end - 1) - g.first_entry + 1;
  return g;
}

// Entry e (< g.entries) of the block's table entries: its page, or -1 outside the cache.
HOPATTN_HOST_DEVICE int gathered_page(const KeyCache& cache, const ForwardTile& t, const GatheredBlock& g, int e) {
  const int page = cache.page_table[t.kv_batch * cache.page_table_stride + g.first_entry + e];
  return page >= 0 && page < cache.num_pages ? page : -1;
}

// The tile that `s` schedules, for tiles of block_m rows and key blocks of block_n keys, `pack`
// rows per query (fwd_split_plan.hpp).
HOPATTN_HOST_DEVICE ForwardTile forward_tile(const Problem& p, const TileScheduler& scheduler, const FastDivisor& pack,
                                             int block_m, int block_n, const ScheduledTile& s) {
  const WorkTile w = scheduler.tile(s.linear);
  const Sequence q = p.queries.sequence(w.batch);
  const Sequence k = p.keys.sequence(w.batch);
  ForwardTile t;
  const int pad = query_block_pad(p.mask, block_m, q.length * pack.divisor());
  t.first_row = w.m_block * block_m - pad;
  // Packed, the scheduler's head is the KV head (its group is 1) and the tile starts at its
  // group's first query head.
  t.head = w.head * pack.divisor();
  t.head_kv = scheduler.by_group.divide(w.head);
  t.batch = w.batch;
  t.batch_coord = p.varlen() ? 0 : w.batch;
  t.kv_batch = p.key_cache.enabled() ? p.key_cache.row(w.batch) : (p.keys.varlen() ? 0 : w.batch);
  t.faulted = k.faulted || t.kv_batch < 0;
  t.q_offset = static_cast<int>(q.offset);
  t.k_offset = static_cast<int>(k.offset);
  t.seqlen_q = q.length;
  t.seqlen_k = t.faulted ? 0 : k.length;
  t.n_blocks = n_block_range(p.mask, w.m_block, block_m, block_n, q.length, t.seqlen_k, pad, pack);
  t.unmasked = n_block_range_unmasked(p.mask, w.m_block, block_m, block_n, q.length, t.seqlen_k, pad, pack);
  if (scheduler.key_splits() > 1) {  // this piece's share of the visible blocks
    const BlockRange piece = key_split_piece(t.n_blocks, w.split, scheduler.by_key_splits);
    t.n_blocks = piece;
    t.unmasked = intersect(t.unmasked, piece);
  } else if (scheduler.split(s.linear)) {
    const BlockRange piece{t.n_blocks.begin + s.key_begin, t.n_blocks.begin + s.key_end};
    t.n_blocks = intersect(t.n_blocks, piece);
    t.unmasked = intersect(t.unmasked, piece);
  }
  return t;
}

}  // namespace hopattn
