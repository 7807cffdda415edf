// Writes a finished forward tile straight from the accumulator registers (store_accumulator_rows),
// bounded by the sequence's last row and the real head dim of V. With no staging buffer, Q's shared
// memory is free for the next tile as soon as the last S GEMM is done. LSE goes straight from the
// registers that hold each row's statistics. A piece of a split tile (key splits) leaves its rows
// in the workspace instead, for the combine kernel (fwd_split_combine.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/accumulator_store.cuh"
#include "kernels/common/log_sum_exp.hpp"
#include "kernels/fwd/fwd_tile_info.cuh"
#include "kernels/fwd/fwd_workspace.cuh"

namespace hopattn {

// Whether a tile row is a real (query, head) row (rows before the first, see query_block_pad, and
// past the sequence are not): one unsigned compare for both bounds.
CUTE_DEVICE bool is_query(const ForwardTile& t, int row, const FastDivisor& pack) {
  return static_cast<unsigned>(row) < static_cast<unsigned>(t.rows(pack));
}

// Two NaN elements of type Element as one 32-bit word.
template <class Element>
CUTE_DEVICE uint32_t nan_pattern() {
  const Element nan = static_cast<Element>(NAN);
  const uint16_t bits = reinterpret_cast<const uint16_t&>(nan);
  return static_cast<uint32_t>(bits) * 0x10001u;
}

// `pack` below: the tile's rows per query (params.pack; a constant 1 where the caller knows it).
template <class Traits>
CUTE_DEVICE typename Traits::OutputElement* output_row(const ForwardParams<Traits>& params, const ForwardTile& t,
                                                       int row, const FastDivisor& pack) {
  return params.o.template at<typename Traits::OutputElement>(
      t.batch, static_cast<long long>(t.q_offset) + t.query_of(row, pack), t.head_of(row, pack));
}

template <class Traits>
CUTE_DEVICE void store_lse(const ForwardParams<Traits>& params, const ForwardTile& t, int row, float value,
                           const FastDivisor& pack) {
  const RowTensor& lse = params.lse;
  if (lse.data == nullptr || !is_query(t, row, pack)) return;
  *lse.at<float>(t.batch, static_cast<long long>(t.q_offset) + t.query_of(row, pack), t.head_of(row, pack)) = value;
}

// Where a real tile row's partial from key split `split` goes (fwd_workspace.cuh).
template <class Traits>
CUTE_DEVICE long long split_row(const ForwardParams<Traits>& params, const ForwardTile& t, int split, int row,
                                const FastDivisor& pack) {
  return static_cast<long long>(split) * params.split_output_rows +
         split_output_row(params.problem, t.batch, t.q_offset, t.query_of(row, pack), t.head_of(row, pack));
}

// A piece of a split tile that saw no key: its rows' LSE is -inf, which tells the combine kernel
// to skip their (unwritten) O, or NaN for a faulted KV cache sequence, which the combine kernel
// passes on. Consumer thread `thread` writes row `thread` (no loop: ptxas hoisted a strided
// loop's bounds to the kernel's start and spilled them).
template <class Traits>
CUTE_DEVICE void store_empty_split_partial(const ForwardParams<Traits>& params, const ForwardTile& t, int split,
                                           const FastDivisor& pack, float lse, int thread) {
  static_assert(Traits::kConsumerThreads >= Traits::kBlockM, "a consumer thread per tile row");
  const int row = t.first_row + thread;
  if (thread < Traits::kBlockM && is_query(t, row, pack)) {
    __stcg(params.split_lse + split_row(params, t, split, row, pack), lse);
  }
}

// A piece of a split tile: its real rows' normalised O (fp32) and LSE into the workspace. Each
// thread holds pairs of adjacent columns: one 8-byte store per pair, a quad's four pairs of a
// row 32 contiguous bytes. thr_pv: the thread's slice of the P V MMA, which gives the (row,
// column) tile coordinates of tOrO's entries (made here: held through the main loop, the
// coordinates of every entry cost the consumers hundreds of bytes of spills).
template <class Traits, class AccO, class ThreadMma, int kRows>
CUTE_DEVICE void store_split_partial(const ForwardParams<Traits>& params, const ForwardTile& t, int split,
                                     const FastDivisor& pack, AccO const& tOrO, ThreadMma const& thr_pv,
                                     const float (&lse)[kRows], int thread) {
  cute::Tensor o = as_row_col(tOrO);
  cute::Tensor coords = as_row_col(thr_pv.partition_C(
      cute::make_identity_tensor(cute::Shape<typename Traits::BlockM, typename Traits::HeadDimV>{})));
  static_assert(decltype(cute::size<0>(o))::value == kRows, "one LSE per accumulator row");
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = t.first_row + cute::get<0>(coords(r, 0));
    if (!is_query(t, row, pack)) continue;
    const long long at = split_row(params, t, split, row, pack);
    float* out = params.split_o + at * Traits::kHeadDimV;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(o); c += 2) {
      __stcg(reinterpret_cast<float2*>(out + cute::get<1>(coords(r, c))), make_float2(o(r, c), o(r, c + 1)));
    }
    if (thread % 4 == 0) __stcg(params.split_lse + at, lse[r]);
  }
}

// A tile whose rows see no key at all: O = 0, LSE = -inf, nothing loaded; with lse = NaN (a
// faulted KV cache sequence) both are NaN. Written by `threads` threads, `thread` being this
// one's index among them.
template <class Traits>
CUTE_DEVICE void store_empty_tile(const ForwardParams<Traits>& params, const ForwardTile& t, const FastDivisor& pack,
                                  float lse, int thread, int threads) {
  constexpr int kElementsPerChunk = 16 / sizeof(typename Traits::OutputElement);
  constexpr int kChunksPerRow = Traits::kHeadDimV / kElementsPerChunk;
  const int chunks = params.problem.head_dim_v / kElementsPerChunk;
  for (int i = thread; i < Traits::kBlockM * kChunksPerRow; i += threads) {
    const int row = t.first_row + i / kChunksPerRow;
    const int chunk = i % kChunksPerRow;
    if (is_query(t, row, pack) && chunk < chunks) {
      const uint32_t bits = lse == lse ? 0u : nan_pattern<typename Traits::OutputElement>();
      *reinterpret_cast<uint4*>(output_row(params, t, row, pack) + chunk * kElementsPerChunk) =
          make_uint4(bits, bits, bits, bits);
    }
  }
  for (int r = thread; r < Traits::kBlockM; r += threads) {
    const int row = t.first_row + r;
    // A row that sees no key but a sink: LSE = sink (O = 0 all the same).
    const bool sink = lse == -INFINITY && params.sinks != nullptr && is_query(t, row, pack);
    store_lse(params, t, row, sink ? params.sinks[t.head_of(row, pack)] : lse, pack);
  }
}

// Attention sinks on a finished row (the whole of its keys): its LSE takes its head's sink in and
// O shrinks by the keys' share, exp(lse_keys - lse). A row that saw no key gets LSE = sink; its O
// is 0 already. A NaN row (a faulted KV cache sequence) stays NaN. tile_sink: the sink of the
// tile's head, which the publisher put in shared memory tiles ahead; packed GQA heads (pack > 1)
// load theirs here. Loaded here, the logit's latency comes after the tile's last GEMM, which a
// tile with a 128-key window (one or two key blocks) feels (H100, d128: sinks at 0.89-0.92 of no
// sinks with that load, 0.91-0.92 with a prefetch into L1 at the tile's start, 0.925-0.927 with
// the publisher's copy; d64 0.96-0.98 -> 0.97-0.985).
template <class Traits, class AccO, class RowCoords, int kRows>
CUTE_DEVICE void add_sinks(const ForwardParams<Traits>& params, const ForwardTile& t, float tile_sink, AccO& tOrO,
                           RowCoords const& tScS, float (&lse)[kRows], const FastDivisor& pack) {
  float keys_share[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = t.first_row + cute::get<0>(tScS(r, 0));
    keys_share[r] = 1.f;
    if (!is_query(t, row, pack)) continue;
    LogSumExp total;
    total.add(lse[r]);
    total.add(pack.divisor() == 1 ? tile_sink : params.sinks[t.head_of(row, pack)]);
    const float with_sink = total.value();
    keys_share[r] = lse[r] == -INFINITY ? 0.f : piece_weight(lse[r], with_sink);
    lse[r] = with_sink;
  }
  scale_rows(tOrO, keys_share);
}

template <class Traits, class AccO, class RowCoords, int kRows>
CUTE_DEVICE void store_tile(const ForwardParams<Traits>& params, const ForwardTile& t, AccO const& tOrO,
                            RowCoords const& tScS, const float (&lse)[kRows], const FastDivisor& pack, int thread) {
  const int q = thread % 4;
  auto row_pointer = [&](int tile_row) -> typename Traits::OutputElement* {
    const int row = t.first_row + tile_row;
    return is_query(t, row, pack) ? output_row(params, t, row, pack) : nullptr;
  };
  store_accumulator_rows<typename Traits::OutputElement>(tOrO, tScS, 0, params.problem.head_dim_v, row_pointer, q);
  if (q == 0) {  // the four threads of a quad share their rows' statistics
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) store_lse(params, t, t.first_row + cute::get<0>(tScS(r, 0)), lse[r], pack);
  }
}

}  // namespace hopattn
