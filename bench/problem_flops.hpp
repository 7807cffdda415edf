// FLOP counts of docs/benchmarking.md: forward 4 * heads * head_dim * (visible query-key pairs),
// with plain causal counted as half of seqlen_q * seqlen_k (the FlashAttention convention);
// backward 2.5 times the forward.
#pragma once

#include "testing/attention_case.hpp"

namespace hopattn::bench {

double forward_flops(const testing::CaseSpec& spec);
double backward_flops(const testing::CaseSpec& spec);

}  // namespace hopattn::bench
