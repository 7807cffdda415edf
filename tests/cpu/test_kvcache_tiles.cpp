// The forward's view of a KV cache, checked on the host through the kernel's own host/device
// code: random calls validated as forward_kvcache validates them (validate_kvcache, with host
// arrays standing in for the device ones), then every tile of the schedule (forward_tile) and
// every key it reads located the way the producer warp locates it (key_block_coord for whole
// blocks by TMA, page_box_coord for boxes by TMA, gathered_block / gathered_page for gathered
// rows). Each must be the cache
// position that the definition in docs/semantics.md gives (cache row from cache_batch_idx,
// position after the left padding, page through the table), and a sequence must fault exactly
// where the definition says its keys are not in the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"
#include "kernels/common/tile_scheduler.hpp"
#include "kernels/fwd/fwd_tile.hpp"

namespace hopattn {
namespace {

// Never dereferenced: validation only checks that tensor pointers are set and aligned.
alignas(16) char stand_in[16];

// Where key j of sequence b lives by the definition: (cache row or page, position in it), or
// page -1 where the table names none.
struct CachePosition {
  long long row;
  long long position;
};

TEST(KVCacheTiles, EveryKeyReadComesFromItsCachePosition) {
  std::mt19937 rng(29);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int page_sizes[] = {0, 0, 1, 3, 16, 32, 48, 64, 128, 192, 256, 352};
  const int blocks_n[] = {64, 80, 96, 128, 176};
  int faulted_tiles = 0, gathered = 0, boxed = 0, wide_boxes = 0, tma_paged = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = pick(1, 4), heads_kv = pick(1, 3), group = pick(1, 4), seqlen_q = pick(1, 40);
    const int heads = heads_kv * group, head_dim = 64;
    const int page_size = page_sizes[pick(0, 11)];
    const bool paged = page_size > 0;
    const int max_pages = pick(1, 8);
    const int capacity = paged ? max_pages * page_size : pick(1, 600);
    const bool batch_index = pick(0, 2) == 0, leftpad = pick(0, 2) == 0;
    const int rows = batch_index ? 2 * batch : batch;
    const int num_pages = rows * max_pages + 2;

    std::vector<int32_t> lengths(batch), starts(batch), row_of(batch), table;
    for (int b = 0; b < batch; ++b) {
      lengths[b] = pick(0, 9) == 0 ? pick(-2, capacity + 2) : pick(0, capacity);
      starts[b] = leftpad ? (pick(0, 9) == 0 ? pick(-1, capacity + 1) : pick(0, std::max(lengths[b], 0))) : 0;
    }
    std::vector<int32_t> all_rows(rows);
    std::iota(all_rows.begin(), all_rows.end(), 0);
    std::shuffle(all_rows.begin(), all_rows.end(), rng);
    for (int b = 0; b < batch; ++b) row_of[b] = pick(0, 15) == 0 ? (pick(0, 1) ? -1 : rows) : all_rows[b];
    if (paged) {
      std::vector<int32_t> pages(num_pages);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      table.assign(pages.begin(), pages.begin() + rows * max_pages);
      for (int32_t& page : table) {
        if (pick(0, 40) == 0) page = pick(0, 1) ? -1 : num_pages + pick(0, 3);
      }
    }

    KVCacheArgs a;
    a.q = make_tensor(stand_in, DType::kBFloat16, {batch, seqlen_q, heads, head_dim});
    a.o = a.q;
    const int64_t cache_dim0 = paged ? num_pages : rows, cache_dim1 = paged ? page_size : capacity;
    a.k_cache = make_tensor(stand_in, DType::kBFloat16, {cache_dim0, cache_dim1, heads_kv, head_dim});
    a.v_cache = a.k_cache;
    if (paged) a.page_table = PageTable{table.data(), rows, max_pages, 0};
    a.cache_seqlens = IntArray{lengths.data(), batch};
    if (batch_index) a.cache_batch_idx = IntArray{row_of.data(), batch};
    if (leftpad) a.cache_leftpad = IntArray{starts.data(), batch};
    const int mask_kind = pick(0, 2);
    a.mask = Mask{mask_kind == 1, mask_kind == 2 ? pick(0, 50) : -1, mask_kind == 2 ? pick(0, 5) : -1};
    KVCacheCall call;
    const Status status = validate_kvcache(a, &call);
    ASSERT_TRUE(status.ok()) << status.message();
    Problem p = call.problem;
    const int block_m = 128, block_n = blocks_n[pick(0, 4)];
    choose_paged_loads(p.key_cache, leftpad, block_n);  // as make_forward_params does
    const int pack = pick(0, 1) == 1 ? group : 1;
    TileScheduler scheduler = TileScheduler::make((seqlen_q * pack + block_m - 1) / block_m, heads / pack, batch,
                                                  group / pack, pick(0, 3), 0);
    scheduler.split_keys(pick(1, 4));
    const auto describe = [&] {
      return ::testing::Message() << "trial " << trial << " batch " << batch << (paged ? " page " : " contiguous ")
                                  << page_size << " capacity " << capacity << " bn " << block_n
                                  << (batch_index ? " batch_idx" : "") << (leftpad ? " leftpad" : "")
                                  << (p.key_cache.gather ? " gather" : "") << (p.key_cache.page_box_rows > 0 ? " boxes" : "");
    };

    auto definition = [&](int b, long long key) -> CachePosition {
      const long long row = batch_index ? row_of[b] : b;
      const long long position = (leftpad ? starts[b] : 0) + key;
      if (!paged) return CachePosition{row, position};
      const int page = table[row * max_pages + position / page_size];
      if (page < 0 || page >= num_pages) return CachePosition{-1, 0};
      return CachePosition{page, position % page_size};
    };
    for (int linear = 0; linear < scheduler.total_tiles(); ++linear) {
      ScheduledTile s;
      s.linear = linear;
      const ForwardTile t = forward_tile(p, scheduler, FastDivisor(pack), block_m, block_n, s);
      const int b = t.batch;
      const int start = leftpad ? starts[b] : 0;
      const bool row_ok = !batch_index || (row_of[b] >= 0 && row_of[b] < rows);
      const bool lengths_ok = lengths[b] >= 0 && lengths[b] <= capacity && start >= 0 && start <= lengths[b];
      ASSERT_EQ(t.faulted, !(row_ok && lengths_ok)) << describe() << " batch " << b;
      if (t.faulted) {
        ASSERT_TRUE(t.n_blocks.empty()) << describe();
        ++faulted_tiles;
        continue;
      }
      ASSERT_EQ(t.seqlen_k, lengths[b] - start) << describe();
      for (int n = t.n_blocks.begin; n < t.n_blocks.end; ++n) {
        if (p.key_cache.gather) {
          ++gathered;
          // The producer's lookup: the block's table entries, then each row's entry and row.
          const GatheredBlock g = gathered_block(p.key_cache, t, n, block_n);
          ASSERT_LE(g.entries, block_n) << describe() << " block " << n;
          for (int r = 0; r < block_n; ++r) {
            const int key = n * block_n + r;
            ASSERT_EQ(g.real(r), key < t.seqlen_k) << describe() << " key " << key;
            if (!g.real(r)) continue;
            const int e = g.entry(r, p.key_cache.page_size);
            ASSERT_TRUE(e >= 0 && e < g.entries) << describe() << " key " << key;
            const CachePosition want = definition(b, key);
            ASSERT_EQ(gathered_page(p.key_cache, t, g, e), want.row) << describe() << " key " << key;
            if (want.row >= 0) ASSERT_EQ(g.row_in_page(r, p.key_cache.page_size), want.position) << describe() << " key " << key;
          }
          continue;
        }
        if (p.key_cache.page_box_rows > 0) {
          ++boxed;
          wide_boxes += p.key_cache.page_box_rows == kWidePageBoxRows;
          // Box by box, each on one page; boxes past the sequence's keys read zeros.
          const int rows = p.key_cache.page_box_rows;
          for (int box = 0; box < block_n / rows; ++box) {
            const KeyBlockCoord at = page_box_coord(p.key_cache, t, n, box, block_n);
            const int first_key = n * block_n + box * rows;
            if (first_key >= t.seqlen_k) {
              ASSERT_TRUE(at.batch == num_pages && !at.fault) << describe() << " box " << box << " of block " << n;
              continue;
            }
            ASSERT_EQ(at.fault, definition(b, first_key).row < 0) << describe() << " key " << first_key;
            if (at.fault) continue;
            for (int key = first_key; key < std::min(first_key + rows, t.seqlen_k); ++key) {
              const CachePosition want = definition(b, key);
              ASSERT_EQ(at.batch, want.row) << describe() << " key " << key;
              ASSERT_EQ(at.block * rows + (key - first_key), want.position) << describe() << " key " << key;
            }
          }
          continue;
        }
        const KeyBlockCoord at = key_block_coord(p.key_cache, t, n, block_n);
        if (paged) ++tma_paged;
        // A whole block's copy: one fault flag for it, taken from its first key's page, which
        // (pages holding whole blocks) is every key's page.
        const CachePosition first = definition(b, static_cast<long long>(n) * block_n);
        ASSERT_EQ(at.fault, first.row < 0) << describe() << " block " << n;
        if (at.fault) continue;
        for (int key = n * block_n; key < std::min((n + 1) * block_n, t.seqlen_k); ++key) {
          const CachePosition want = definition(b, key);
          const long long position = static_cast<long long>(t.k_offset) + static_cast<long long>(at.block) * block_n +
                                     (key - n * block_n);
          ASSERT_EQ(at.batch, want.row) << describe() << " key " << key;
          ASSERT_EQ(position, want.position) << describe() << " key " << key;
        }
      }
    }
  }
  // The random problems reach every path.
  EXPECT_GT(faulted_tiles, 0);
  EXPECT_GT(gathered, 0);
  EXPECT_GT(boxed, 0);
  EXPECT_GT(wide_boxes, 0);
  EXPECT_GT(tma_paged, 0);
}

}  // namespace
}  // namespace hopattn
