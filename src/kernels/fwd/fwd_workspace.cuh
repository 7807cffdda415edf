// The forward's optional workspace (caller-allocated, sized by forward_workspace_size()). Without
// one the forward runs a static schedule; with one it takes its tiles from a counter (tile lengths
// vary: masked or varlen problems) or splits the last round's tiles (equal tiles, see
// TileScheduler). Layout, from a 256-byte aligned start:
//   counters  int32, zeroed by a one-warp kernel ahead of the forward kernel, which starts under
//             it (programmatic dependent launch) and waits for it only where it first touches one:
//             [0]          the next tile to hand out, less gridDim.x (dynamic schedule)
//             [1, 1+ctas)  per split-tail slot, how many consumer threads of its CTA have left
//                          their partial in it
//   partials  (ctas, kSlotFloats) fp32, split tail only: slot c holds CTA c's partial, each
//             consumer thread's normalised O fragment and its rows' LSE (natural log),
//             value-major so that a warp's stores and loads of one value are 128 contiguous bytes
//   split O   (splits, output rows, kHeadDimV) fp32, key splits only: each piece's normalised O of
//             every real output row, an output row being a (query token, head) pair in the order
//             split_output_row() gives; only real rows are written, so a decode problem's workspace
//             holds its few rows rather than whole tiles
//   split LSE (splits, output rows) fp32: their LSE (natural log; -inf where the piece saw no key)
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/grid_dependency.cuh"
#include "kernels/fwd/fwd_params.cuh"

namespace hopattn {

// The index of output row (query token, head) among the key splits' rows of one piece: query
// `query` of batch entry `batch`, whose sequence starts at token q_offset in varlen mode.
HOPATTN_HOST_DEVICE long long split_output_row(const Problem& p, int batch, long long q_offset, int query, int head) {
  const long long token = p.varlen() ? q_offset + query : static_cast<long long>(batch) * p.max_seqlen_q + query;
  return token * p.heads + head;
}

template <class Traits>
struct ForwardWorkspace {
  static constexpr int kRowsPerThread = 2;  // of a 64-row WGMMA accumulator
  static constexpr long long kOFloats = static_cast<long long>(Traits::kBlockM) * Traits::kHeadDimV;
  static constexpr long long kSlotFloats = kOFloats + kRowsPerThread * Traits::kConsumerThreads;
  static constexpr size_t kAlignment = 256;

  static int counters(int ctas, bool split) { return 1 + (split ? ctas : 0); }
  static size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
  static size_t counters_bytes(int ctas, bool split) { return aligned(counters(ctas, split) * sizeof(int32_t)); }
  static size_t tail_bytes(int ctas, bool split) { return split ? ctas * kSlotFloats * sizeof(float) : 0; }
  // The key splits' partials: `splits` pieces of `output_rows` rows (0 splits: none).
  static size_t split_o_bytes(int splits, long long output_rows) {
    return aligned(static_cast<size_t>(splits) * output_rows * Traits::kHeadDimV * sizeof(float));
  }
  static size_t split_lse_bytes(int splits, long long output_rows) {
    return aligned(static_cast<size_t>(splits) * output_rows * sizeof(float));
  }
  static size_t bytes_for(int ctas, bool split, int key_splits = 0, long long output_rows = 0) {
    return counters_bytes(ctas, split) + aligned(tail_bytes(ctas, split)) + split_o_bytes(key_splits, output_rows) +
           split_lse_bytes(key_splits, output_rows) + kAlignment;
  }

  // Points `params` into `base` (16-byte aligned, bytes_for() bytes for the same arguments): the
  // tile counter where `dynamic`, the split tail's flags and partials where `split`, the key
  // splits' partials where key_splits > 1.
  static void carve(void* base, int ctas, bool dynamic, bool split, int key_splits, long long output_rows,
                    ForwardParams<Traits>& params) {
    const uintptr_t at = (reinterpret_cast<uintptr_t>(base) + kAlignment - 1) / kAlignment * kAlignment;
    params.workspace_counters = reinterpret_cast<int32_t*>(at);
    params.workspace_counter_count = counters(ctas, split);
    if (dynamic) params.tile_counter = params.workspace_counters;
    const uintptr_t tail_at = at + counters_bytes(ctas, split);
    if (split) {
      params.tail_flags = params.workspace_counters + 1;
      params.tail_partials = reinterpret_cast<float*>(tail_at);
    }
    if (key_splits > 1) {
      const uintptr_t o_at = tail_at + aligned(tail_bytes(ctas, split));
      params.split_o = reinterpret_cast<float*>(o_at);
      params.split_lse = reinterpret_cast<float*>(o_at + split_o_bytes(key_splits, output_rows));
      params.split_output_rows = output_rows;
    }
  }
};

// Zeroes the workspace's counters, letting the forward kernel start at once (see above). A
// template like the kernel it serves, so that each instantiation unit has its own. Launched
// overlapping a KV cache's append (Problem::after_append), it ends by waiting for it, so that
// the forward's wait for this kernel covers the append too (no-op otherwise).
template <class Traits>
__global__ void __launch_bounds__(32) reset_forward_counters_kernel(int32_t* counters, int count) {
  allow_next_kernel_to_start();
  for (int i = threadIdx.x; i < count; i += blockDim.x) counters[i] = 0;
  wait_for_previous_kernel();
}

}  // namespace hopattn
