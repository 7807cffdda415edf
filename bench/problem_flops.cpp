#include "problem_flops.hpp"

#include "kernels/common/block_range.hpp"
#include "kernels/common/mask.hpp"

namespace hopattn::bench {
namespace {

double visible_pairs(BandMask mask, int seqlen_q, int seqlen_k) {
  if (mask.unbounded()) return double(seqlen_q) * seqlen_k;
  if (mask.left < 0 && mask.right == 0) return double(seqlen_q) * seqlen_k / 2;  // FA's causal convention
  double pairs = 0;
  for (int i = 0; i < seqlen_q; ++i) pairs += n_block_range(mask, i, 1, 1, seqlen_q, seqlen_k).size();
  return pairs;
}

}  // namespace

double forward_flops(const testing::CaseSpec& s) {
  const BandMask mask = BandMask::from_args(s.causal, s.window_left, s.window_right);
  double pairs = 0;
  if (s.varlen()) {
    for (size_t b = 0; b < s.varlen_seqlens_q.size(); ++b) {
      pairs += visible_pairs(mask, s.varlen_seqlens_q[b], s.varlen_seqlens_k[b]);
    }
  } else {
    pairs = s.batch * visible_pairs(mask, s.seqlen_q, s.seqlen_k);
  }
  return 2.0 * s.heads * (s.head_dim + s.value_dim()) * pairs;
}

// Five matmuls, 2 * (3 * head_dim + 2 * head_dim_v) per pair: S, dQ and dK in head_dim, dP and dV
// in head_dim_v; 2.5x the forward for equal head dims.
double backward_flops(const testing::CaseSpec& s) {
  return forward_flops(s) * (3.0 * s.head_dim + 2.0 * s.value_dim()) / (s.head_dim + s.value_dim());
}

}  // namespace hopattn::bench
