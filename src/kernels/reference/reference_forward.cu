// GPU reference forward: one warp per (query row, head), two passes over the visible keys
// (LSE first, then O = sum_j exp(s_j - LSE) v_j), so P is formed exactly as the definition says.
// Scores are dot products over head_dim (Q, K), O's rows have head_dim_v entries (V's).
// FP8 inputs are read as they are and their descale factors applied to the products they scale
// (q.k by q's and k's, O by v's), which in fp64 is the attention of the dequantized inputs.
#include "kernels/reference/reference_attention.hpp"
#include "kernels/reference/reference_common.cuh"

namespace hopattn {
namespace {

using namespace reference_detail;

struct ForwardParams {
  Problem problem;
  ForwardTensors tensors;
  bool round_to_input;
};

// T: Q, K and V's element type; Out: O's (T but for FP8 inputs); Acc: the accumulator.
template <typename T, typename Out, typename Acc>
__global__ void __launch_bounds__(kThreadsPerBlock) reference_forward_kernel(const ForwardParams params) {
  using Score = typename NaiveRounding<T, Out>::Score;
  using Probability = typename NaiveRounding<T, Out>::Probability;
  const Problem& p = params.problem;
  const ForwardTensors& t = params.tensors;
  const int lane = threadIdx.x % kWarpSize;
  for_each_warp_row(p.queries, p.batch, p.heads, [&](const RowLocation& q_at, int head) {
    const int b = q_at.batch;
    const int head_kv = head / (p.heads / p.heads_kv);
    const int seqlen_q = p.queries.sequence(b).length;
    const int seqlen_k = p.keys.sequence(b).length;
    const IndexInterval keys = visible_keys(p.mask, q_at.index, seqlen_q, seqlen_k);

    WarpRow<Acc> q;
    q.load(row_pointer<const T>(t.q, q_at, head), p.head_dim, lane);
    const Acc qk_descale = static_cast<Acc>(t.q_descale.at(b, head_kv)) * static_cast<Acc>(t.k_descale.at(b, head_kv));
    const Acc scale = p.softmax_scale;
    const Acc softcap = p.softcap;
    auto score = [&](int j) {
      const T* k = row_pointer<const T>(t.k, at_position(p.keys, b, j), head_kv);
      const Acc qk = maybe_round<Score>(q.dot(k, p.head_dim, lane) * qk_descale, params.round_to_input);
      const Acc s = maybe_round<Score>(qk * scale, params.round_to_input);
      return softcap > 0 ? maybe_round<Score>(softcap * tanh(s / softcap), params.round_to_input) : s;
    };

    Acc row_max = -INFINITY;
    Acc row_sum = 0;
    for (long long j = keys.first; j <= keys.last; ++j) {
      const Acc s = score(j);
      const Acc new_max = s > row_max ? s : row_max;
      row_sum = row_sum * exp(row_max - new_max) + exp(s - new_max);
      row_max = new_max;
    }
    // An attention sink is one more term of the denominator, without a value.
    if (t.sinks != nullptr && t.sinks[head] > -INFINITY) {  // -inf: no sink
      const Acc sink = t.sinks[head];
      const Acc new_max = sink > row_max ? sink : row_max;
      row_sum = row_sum * exp(row_max - new_max) + exp(sink - new_max);
      row_max = new_max;
    }
    const Acc lse = row_sum > 0 ? row_max + log(row_sum) : Acc(-INFINITY);

    WarpRow<Acc> o;
    o.zero();
    for (long long j = keys.first; j <= keys.last; ++j) {
      const Acc prob = maybe_round<Probability>(exp(score(j) - lse), params.round_to_input);
      o.axpy(prob, row_pointer<const T>(t.v, at_position(p.keys, b, j), head_kv), p.head_dim_v, lane);
    }
    o.store(row_pointer<Out>(t.o, q_at, head), p.head_dim_v, lane, static_cast<Acc>(t.v_descale.at(b, head_kv)));
    if (t.lse.data != nullptr && lane == 0) {
      *row_pointer<float>(t.lse, q_at, head) = static_cast<float>(lse);
    }
  });
}

}  // namespace

cudaError_t reference_forward(const Problem& problem, const ForwardTensors& tensors, ReferencePrecision precision,
                              cudaStream_t stream) {
  const long long work = problem.total_q() * problem.heads;
  if (work == 0) return cudaSuccess;
  const ForwardParams params{problem, tensors, precision == ReferencePrecision::kNaiveLowPrecision};
  return dispatch_forward_types(problem.dtype, problem.out_dtype, precision, [&](auto element, auto output,
                                                                                auto accumulator) {
    using T = typename decltype(element)::type;
    using Out = typename decltype(output)::type;
    using Acc = typename decltype(accumulator)::type;
    reference_forward_kernel<T, Out, Acc><<<grid_for(work), kThreadsPerBlock, 0, stream>>>(params);
    return cudaGetLastError();
  });
}

}  // namespace hopattn
