// The forward's decode layout on the host side: which problems get packed GQA heads and how many
// key splits (fwd_split_plan.hpp), the key blocks of a packed tile against the mask's definition,
// each piece of a split tile's keys, the scheduler handing every piece out exactly once, and the
// whole decomposition of random problems into tiles (fwd_tile.hpp): every output row in exactly
// the tiles of its pieces, every visible key of it in exactly one of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/block_range.hpp"
#include "kernels/common/log_sum_exp.hpp"
#include "kernels/common/tile_scheduler.hpp"
#include "kernels/fwd/fwd_split_plan.hpp"
#include "kernels/fwd/fwd_tile.hpp"
#include "reference/mask_definition.hpp"

namespace hopattn {
namespace {

constexpr int kH200Ctas = 132;

ForwardSplitInputs decode(int batch, int heads, int heads_kv, int seqlen_q, int seqlen_k) {
  ForwardSplitInputs in;
  in.batch = batch;
  in.heads = heads;
  in.heads_kv = heads_kv;
  in.max_seqlen_q = seqlen_q;
  in.max_seqlen_k = seqlen_k;
  in.block_m = 128;
  in.block_n = 128;
  in.ctas = kH200Ctas;
  in.workspace = true;
  return in;
}

// None, causal, causal with a left window, or a two-sided window, windows up to `widest` keys.
template <class Pick>
BandMask random_mask(Pick& pick, int widest) {
  switch (pick(0, 3)) {
    case 0:
      return BandMask{};
    case 1:
      return BandMask::from_args(true, -1, -1);
    case 2:
      return BandMask::from_args(true, pick(0, widest), -1);
    default:
      return BandMask{pick(0, widest), pick(0, widest / 6)};
  }
}

long long pieces(const ForwardSplitInputs& in, const ForwardSplitPlan& plan) {
  return forward_tiles(in, plan.pack) * plan.splits;
}

TEST(ForwardSplitPlan, DecodePacksTheGroupAndSplitsTheKeysOverTheSms) {
  // 32/8 heads, one query row, 8k keys: 8 packed tiles of 64 key blocks.
  const ForwardSplitInputs in = decode(1, 32, 8, 1, 8192);
  const ForwardSplitPlan plan = choose_forward_split(in);
  EXPECT_EQ(plan.pack, 4);
  EXPECT_GT(plan.splits, 8);
  EXPECT_LE(pieces(in, plan), kH200Ctas);  // one wave
  // MQA: one tile, split into many pieces, but not into as many as the SMs hold: each piece adds
  // to the combine's reads (at 32k keys the H100 ran 0.50-0.51 TB/s with 32-64 pieces, 0.41 with
  // 128).
  const ForwardSplitPlan mqa = choose_forward_split(decode(1, 32, 1, 1, 131072));
  EXPECT_EQ(mqa.pack, 32);
  EXPECT_GT(mqa.splits, 64);
  EXPECT_LT(mqa.splits, ForwardSplitModel::kMaxSplits);
  const ForwardSplitPlan mqa_32k = choose_forward_split(decode(1, 32, 1, 1, 32768));
  EXPECT_GE(mqa_32k.splits, 32);
  EXPECT_LE(mqa_32k.splits, 64);
  // A batch that fills the GPU on its own is not split.
  const ForwardSplitPlan busy = choose_forward_split(decode(64, 32, 8, 1, 8192));
  EXPECT_EQ(busy.pack, 4);
  EXPECT_EQ(busy.splits, 1);
}

TEST(ForwardSplitPlan, PrefillKeepsItsTiles) {
  const ForwardSplitPlan plan = choose_forward_split(decode(2, 32, 8, 4096, 4096));
  EXPECT_EQ(plan.pack, 1);  // 32 query blocks a head either way
  EXPECT_EQ(plan.splits, 1);
}

TEST(ForwardSplitPlan, CallerChoicesAreHonoured) {
  ForwardSplitInputs in = decode(1, 32, 8, 1, 8192);
  in.num_splits = 1;
  EXPECT_EQ(choose_forward_split(in).splits, 1);
  in.num_splits = 5;
  EXPECT_EQ(choose_forward_split(in).splits, 5);
  in.num_splits = 1000;  // capped at the key blocks (64)
  EXPECT_EQ(choose_forward_split(in).splits, 64);
  in.workspace = false;  // no workspace, no splits
  EXPECT_EQ(choose_forward_split(in).splits, 1);
  in = decode(1, 32, 8, 1, 8192);
  in.pack_gqa = PackGqa::kOff;
  EXPECT_EQ(choose_forward_split(in).pack, 1);
  in = decode(2, 32, 8, 4096, 4096);
  in.pack_gqa = PackGqa::kOn;
  EXPECT_EQ(choose_forward_split(in).pack, 4);
  in = decode(1, 8, 8, 1, 8192);  // MHA: nothing to pack
  in.pack_gqa = PackGqa::kOn;
  EXPECT_EQ(choose_forward_split(in).pack, 1);
  in = decode(1, 8, 8, 1, 100);  // a single key block cannot be split
  in.num_splits = 4;
  EXPECT_EQ(choose_forward_split(in).splits, 1);
}

TEST(ForwardSplitPlan, PiecesNeverOverflowTheKernelsInt) {
  ForwardSplitInputs in = decode(4096, 64, 64, 16384, 1 << 20);
  in.num_splits = 128;
  const ForwardSplitPlan plan = choose_forward_split(in);
  EXPECT_LE(pieces(in, plan), ForwardSplitModel::kMaxPieces);
}

TEST(ForwardSplitPlan, KeySplitPiecesCoverTheRangeInOrder) {
  for (int begin = 0; begin < 5; ++begin) {
    for (int size = 0; size < 40; ++size) {
      for (int splits = 1; splits < 50; ++splits) {
        const BlockRange visible{begin, begin + size};
        int next = begin;
        for (int s = 0; s < splits; ++s) {
          const BlockRange piece = key_split_piece(visible, s, FastDivisor(splits));
          ASSERT_EQ(piece.begin, next);
          ASSERT_GE(piece.end, piece.begin);
          ASSERT_LE(piece.size(), size / splits + 1);
          ASSERT_GE(piece.size(), size / splits);
          next = piece.end;
        }
        ASSERT_EQ(next, visible.end);
      }
    }
  }
}

TEST(ForwardSplitPlan, SchedulerHandsOutEveryPieceOnce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const int m_blocks = 1 + static_cast<int>(rng() % 6), heads = 1 + static_cast<int>(rng() % 8);
    const int batch = 1 + static_cast<int>(rng() % 4), splits = 1 + static_cast<int>(rng() % 20);
    TileScheduler s = TileScheduler::make(m_blocks, heads, batch, 1, static_cast<long long>(rng() % 4), 0);
    s.split_keys(splits);
    std::vector<int> count(static_cast<size_t>(m_blocks) * heads * batch * splits, 0);
    for (int linear = 0; linear < s.total_tiles(); ++linear) {
      const WorkTile w = s.tile(linear);
      ASSERT_EQ(w.split, linear % splits);
      ++count[((static_cast<size_t>(w.batch) * heads + w.head) * m_blocks + w.m_block) * splits + w.split];
    }
    for (int c : count) ASSERT_EQ(c, 1) << "trial " << trial;
  }
}

// The merge rule of split pieces: the running log-sum-exp agrees with the float64 one whatever
// the order and grouping of the pieces, and pieces that saw no key (-inf) weigh nothing.
TEST(ForwardSplitPlan, LogSumExpMergesPiecesInAnyGrouping) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 20.f);
  for (int trial = 0; trial < 1000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<float> lse(n);
    for (float& x : lse) x = rng() % 5 == 0 ? -INFINITY : normal(rng);
    double top = -INFINITY;
    for (float x : lse) top = std::max(top, static_cast<double>(x));
    double sum = 0;
    for (float x : lse) sum += std::isinf(x) ? 0.0 : std::exp(x - top);
    const double exact = std::isinf(top) ? -INFINITY : top + std::log(sum);
    LogSumExp in_order, first_half, second_half;
    for (int i = 0; i < n; ++i) {
      in_order.add(lse[i]);
      (i < n / 2 ? first_half : second_half).add(lse[i]);
    }
    second_half.merge(first_half);
    for (const LogSumExp& acc : {in_order, second_half}) {
      if (std::isinf(exact)) {
        EXPECT_EQ(acc.value(), -INFINITY);
      } else {
        EXPECT_NEAR(acc.value(), exact, 1e-5 * std::max(1.0, std::abs(exact))) << "trial " << trial;
        double weights = 0;
        for (float x : lse) weights += std::isinf(x) ? 0.0 : piece_weight(x, acc.value());
        EXPECT_NEAR(weights, 1.0, 1e-5);
      }
    }
  }
}

// Packed tiles: rows are (query, head) pairs, `pack` per query; the key blocks a packed query
// block visits, and those it can skip the mask for, against the mask's definition.
TEST(ForwardSplitPlan, PackedBlockRangesMatchTheMask) {
  std::mt19937 rng(5);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 3000; ++trial) {
    const int seqlen_q = pick(0, 40), seqlen_k = pick(0, 300), pack = pick(1, 9);
    const int block_m = 64 * pick(1, 3), block_n = 16 * pick(1, 11);
    const BandMask mask = random_mask(pick, 100);
    const int rows = seqlen_q * pack;
    const int pad = query_block_pad(mask, block_m, rows);
    const int m_blocks = (rows + pad + block_m - 1) / block_m;
    const int n_blocks = (seqlen_k + block_n - 1) / block_n;
    const FastDivisor packed(pack);
    for (int m = 0; m < m_blocks; ++m) {
      const BlockRange range = n_block_range(mask, m, block_m, block_n, seqlen_q, seqlen_k, pad, packed);
      const BlockRange unmasked = n_block_range_unmasked(mask, m, block_m, block_n, seqlen_q, seqlen_k, pad, packed);
      const int first = std::max(m * block_m - pad, 0), last = std::min((m + 1) * block_m - pad, rows);
      for (int n = 0; n < n_blocks; ++n) {
        bool any = false, all = true;
        for (int row = first; row < last; ++row) {
          for (int j = n * block_n; j < (n + 1) * block_n; ++j) {
            const bool seen = j < seqlen_k && is_visible(mask, row / pack, j, seqlen_q, seqlen_k);
            any |= seen;
            all &= seen;
          }
        }
        const bool in_range = n >= range.begin && n < range.end;
        ASSERT_EQ(in_range, any) << "trial " << trial << " m=" << m << " n=" << n;
        const bool in_unmasked = n >= unmasked.begin && n < unmasked.end;
        ASSERT_EQ(in_unmasked, in_range && all) << "trial " << trial << " m=" << m << " n=" << n;
      }
    }
  }
}

// Every scheduled tile of a random problem (fixed or varlen with seqused, any mask, packed or not,
// split or not), row by row as the kernel's epilogue and key block by key block as its main loop
// sees them: each real (batch, query, head) row is in exactly key_splits tiles, its KV head is
// the tile's, each key visible to it lies in exactly one of those tiles' key blocks, and the
// blocks a tile runs unmasked hold only keys visible to every real row.
TEST(ForwardSplitPlan, TilesCoverEveryRowAndVisibleKeyOnce) {
  std::mt19937 rng(17);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int blocks_m[] = {64, 128, 192}, blocks_n[] = {16, 64, 128, 176};
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = pick(1, 3), heads_kv = pick(1, 3), group = pick(1, 5);
    const int heads = heads_kv * group;
    const bool varlen = pick(0, 1) == 1;
    std::vector<int> lengths_q(batch), lengths_k(batch), cu_q{0}, cu_k{0}, used_k;
    for (int b = 0; b < batch; ++b) {
      lengths_q[b] = pick(0, 3) == 0 ? pick(0, 2) : pick(1, 40);
      lengths_k[b] = pick(0, 4) == 0 ? pick(0, 3) : pick(1, 400);
    }
    if (!varlen) {
      std::fill(lengths_q.begin(), lengths_q.end(), lengths_q[0]);
      std::fill(lengths_k.begin(), lengths_k.end(), lengths_k[0]);
    }
    for (int b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + lengths_q[b]);
      cu_k.push_back(cu_k.back() + lengths_k[b]);
    }
    const bool seqused = varlen && pick(0, 1) == 1;
    for (int b = 0; seqused && b < batch; ++b) used_k.push_back(pick(0, lengths_k[b]));
    Problem p;
    p.batch = batch;
    p.heads = heads;
    p.heads_kv = heads_kv;
    p.max_seqlen_q = *std::max_element(lengths_q.begin(), lengths_q.end());
    p.max_seqlen_k = *std::max_element(lengths_k.begin(), lengths_k.end());
    if (varlen) {
      p.queries = SequenceLayout{cu_q.data(), nullptr, 0, cu_q.back()};
      p.keys = SequenceLayout{cu_k.data(), seqused ? used_k.data() : nullptr, 0, cu_k.back()};
    } else {
      p.queries = SequenceLayout{nullptr, nullptr, p.max_seqlen_q, static_cast<long long>(batch) * p.max_seqlen_q};
      p.keys = SequenceLayout{nullptr, nullptr, p.max_seqlen_k, static_cast<long long>(batch) * p.max_seqlen_k};
    }
    const BandMask mask = random_mask(pick, 60);
    p.mask = mask.without_vacuous_bounds(p.max_seqlen_q, p.max_seqlen_k);
    const int block_m = blocks_m[pick(0, 2)], block_n = blocks_n[pick(0, 3)];
    const int pack = pick(0, 1) == 1 ? group : 1;
    const FastDivisor packed(pack);
    TileScheduler scheduler = TileScheduler::make((p.max_seqlen_q * pack + block_m - 1) / block_m, heads / pack, batch,
                                                  group / pack, pick(0, 3), 0);
    scheduler.split_keys(pick(1, 6));
    const auto describe = [&] {
      return ::testing::Message() << "trial " << trial << " batch " << batch << " heads " << heads << "/" << heads_kv
                                  << (varlen ? " varlen" : "") << " mask(" << p.mask.left << "," << p.mask.right
                                  << ") bm " << block_m << " bn " << block_n << " pack " << pack << " splits "
                                  << scheduler.key_splits();
    };
    // Per batch entry: row (query, head) -> tiles seen; (query, head, key) -> times covered.
    std::vector<std::vector<int>> row_tiles(batch), key_cover(batch);
    for (int b = 0; b < batch; ++b) {
      row_tiles[b].assign(static_cast<size_t>(lengths_q[b]) * heads, 0);
      key_cover[b].assign(static_cast<size_t>(lengths_q[b]) * heads * std::max(lengths_k[b], 1), 0);
    }
    for (int linear = 0; linear < scheduler.total_tiles(); ++linear) {
      ScheduledTile s;
      s.linear = linear;
      const ForwardTile t = forward_tile(p, scheduler, packed, block_m, block_n, s);
      const int b = t.batch;
      for (int r = 0; r < block_m; ++r) {
        const int row = t.first_row + r;
        if (row < 0 || row >= t.rows(packed)) continue;
        const int q = t.query_of(row, packed), h = t.head_of(row, packed);
        ASSERT_LT(q, p.queries.sequence(b).length) << describe();
        ASSERT_EQ(h / group, t.head_kv) << describe() << " row " << row;
        ++row_tiles[b][static_cast<size_t>(q) * heads + h];
        for (int n = t.n_blocks.begin; n < t.n_blocks.end; ++n) {
          const bool unmasked = n >= t.unmasked.begin && n < t.unmasked.end;
          for (int j = n * block_n; j < (n + 1) * block_n; ++j) {
            const bool seen = j < t.seqlen_k && is_visible(p.mask, q, j, t.seqlen_q, t.seqlen_k);
            if (unmasked) ASSERT_TRUE(seen) << describe() << " unmasked block " << n << " hides key " << j;
            if (seen) ++key_cover[b][(static_cast<size_t>(q) * heads + h) * std::max(lengths_k[b], 1) + j];
          }
        }
      }
    }
    for (int b = 0; b < batch; ++b) {
      const Sequence sq = p.queries.sequence(b), sk = p.keys.sequence(b);
      for (int q = 0; q < sq.length; ++q) {
        for (int h = 0; h < heads; ++h) {
          ASSERT_EQ(row_tiles[b][static_cast<size_t>(q) * heads + h], scheduler.key_splits())
              << describe() << " batch " << b << " query " << q << " head " << h;
          for (int j = 0; j < sk.length; ++j) {
            const int expected = is_visible(p.mask, q, j, sq.length, sk.length) ? 1 : 0;
            ASSERT_EQ(key_cover[b][(static_cast<size_t>(q) * heads + h) * std::max(lengths_k[b], 1) + j], expected)
                << describe() << " batch " << b << " query " << q << " head " << h << " key " << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace hopattn
