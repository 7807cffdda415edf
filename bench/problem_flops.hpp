// FLOP counts of docs/benchmarking.md: forward 2 * heads * (head_dim + head_dim_v) * (visible
// query-key pairs), i.e. 4 * heads * head_dim where V has Q/K's head dim, with plain causal counted as half of seqlen_q * seqlen_k (the FlashAttention convention);
// backward 2.5 times the forward (for V's own head dim, its five matmuls counted: problem_flops.cpp).
#pragma once

#include "testing/attention_case.hpp"

namespace hopattn::bench {

double forward_flops(const testing::CaseSpec& spec);
double backward_flops(const testing::CaseSpec& spec);

}  // namespace hopattn::bench
