// GPU reference backward, deterministic by construction (no atomics):
//   1. one warp per (query row, head): D = rowsum(dO * O) into the workspace, then
//      dQ = scale * sum_j dS_ij k_j with P recomputed from the forward's LSE;
//   2. one warp per (key row, kv head): dV = sum_i P_ij dO_i and dK = scale * sum_i dS_ij q_i over
//      the visible queries of every query head of the GQA group.
// Q, K, dQ and dK rows have head_dim entries; V, O, dO and dV rows head_dim_v, so D and
// dP_ij = dO_i . v_j are sums over head_dim_v, S_ij = q_i . k_j over head_dim.
#include "kernels/reference/reference_attention.hpp"
#include "kernels/reference/reference_common.cuh"

namespace hopattn {
namespace {

using namespace reference_detail;

constexpr size_t kWorkspaceAlignment = 16;

struct BackwardParams {
  Problem problem;
  BackwardTensors tensors;
  void* row_dot;  // D: (heads, token) of Acc
  bool round_to_input;
};

// P_ij and dS_ij for one (query row, key) pair, shared by both kernels.
template <typename Acc>
struct PairGradients {
  Acc prob;
  Acc dscore;
};

template <typename T, typename Acc>
__device__ PairGradients<Acc> pair_gradients(const BackwardParams& params, const WarpRow<Acc>& q,
                                             const WarpRow<Acc>& dout, const T* k, const T* v, Acc lse, Acc row_dot,
                                             int lane) {
  const Problem& p = params.problem;
  const bool rnd = params.round_to_input;
  const Acc qk = maybe_round<T>(q.dot(k, p.head_dim, lane), rnd);
  Acc s = maybe_round<T>(qk * static_cast<Acc>(p.softmax_scale), rnd);
  // Softcap: S = c tanh(s / c), dS/ds = 1 - tanh^2 (the softmax scale is applied to dQ/dK after).
  Acc dtanh = 1;
  if (p.softcap > 0) {
    const Acc c = p.softcap;
    const Acc t = tanh(s / c);
    dtanh = 1 - t * t;
    s = maybe_round<T>(c * t, rnd);
  }
  const Acc prob = maybe_round<T>(exp(s - lse), rnd);
  const Acc dprob = maybe_round<T>(dout.dot(v, p.head_dim_v, lane), rnd);
  return {prob, maybe_round<T>(prob * (dprob - row_dot) * dtanh, rnd)};
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreadsPerBlock) reference_dq_kernel(const BackwardParams params) {
  const Problem& p = params.problem;
  const BackwardTensors& t = params.tensors;
  const int lane = threadIdx.x % kWarpSize;
  for_each_warp_row(p.queries, p.batch, p.heads, [&](const RowLocation& q_at, int head) {
    const int b = q_at.batch;
    const int head_kv = head / (p.heads / p.heads_kv);

    WarpRow<Acc> q, dout, o;
    q.load(row_pointer<const T>(t.q, q_at, head), p.head_dim, lane);
    dout.load(row_pointer<const T>(t.dout, q_at, head), p.head_dim_v, lane);
    o.load(row_pointer<const T>(t.o, q_at, head), p.head_dim_v, lane);
    // Entries past head_dim_v were loaded as 0: summing every lane's entries is the sum over head_dim_v.
    Acc row_dot = 0;
#pragma unroll
    for (int c = 0; c < kElemsPerLane; ++c) row_dot += dout.x[c] * o.x[c];
    row_dot = warp_sum(row_dot);
    if (lane == 0) static_cast<Acc*>(params.row_dot)[head * p.total_q() + q_at.token] = row_dot;

    const Acc lse = *row_pointer<const float>(t.lse, q_at, head);
    const int seqlen_q = p.queries.sequence(b).length;
    const int seqlen_k = p.keys.sequence(b).length;
    const IndexInterval keys = visible_keys(p.mask, q_at.index, seqlen_q, seqlen_k);
    WarpRow<Acc> dq;
    dq.zero();
    for (long long j = keys.first; j <= keys.last; ++j) {
      const RowLocation k_at = at_position(p.keys, b, j);
      const T* k = row_pointer<const T>(t.k, k_at, head_kv);
      const T* v = row_pointer<const T>(t.v, k_at, head_kv);
      const PairGradients<Acc> g = pair_gradients<T, Acc>(params, q, dout, k, v, lse, row_dot, lane);
      dq.axpy(g.dscore, k, p.head_dim, lane);
    }
    dq.store(row_pointer<T>(t.dq, q_at, head), p.head_dim, lane, static_cast<Acc>(p.softmax_scale));
  });
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreadsPerBlock) reference_dkdv_kernel(const BackwardParams params) {
  const Problem& p = params.problem;
  const BackwardTensors& t = params.tensors;
  const int lane = threadIdx.x % kWarpSize;
  const int group = p.heads / p.heads_kv;
  for_each_warp_row(p.keys, p.batch, p.heads_kv, [&](const RowLocation& k_at, int head_kv) {
    const int b = k_at.batch;
    const T* k = row_pointer<const T>(t.k, k_at, head_kv);
    const T* v = row_pointer<const T>(t.v, k_at, head_kv);
    const int seqlen_q = p.queries.sequence(b).length;
    const int seqlen_k = p.keys.sequence(b).length;
    const IndexInterval queries = visible_queries(p.mask, k_at.index, seqlen_q, seqlen_k);

    WarpRow<Acc> dk, dv;
    dk.zero();
    dv.zero();
    for (int head = head_kv * group; head < (head_kv + 1) * group; ++head) {
      for (long long i = queries.first; i <= queries.last; ++i) {
        const RowLocation q_at = at_position(p.queries, b, i);
        WarpRow<Acc> q, dout;
        q.load(row_pointer<const T>(t.q, q_at, head), p.head_dim, lane);
        dout.load(row_pointer<const T>(t.dout, q_at, head), p.head_dim_v, lane);
        const Acc lse = *row_pointer<const float>(t.lse, q_at, head);
        const Acc row_dot = static_cast<const Acc*>(params.row_dot)[head * p.total_q() + q_at.token];
        const PairGradients<Acc> g = pair_gradients<T, Acc>(params, q, dout, k, v, lse, row_dot, lane);
#pragma unroll
        for (int c = 0; c < kElemsPerLane; ++c) {
          dv.x[c] += g.prob * dout.x[c];
          dk.x[c] += g.dscore * q.x[c];
        }
      }
    }
    dk.store(row_pointer<T>(t.dk, k_at, head_kv), p.head_dim, lane, static_cast<Acc>(p.softmax_scale));
    dv.store(row_pointer<T>(t.dv, k_at, head_kv), p.head_dim_v, lane, Acc(1));
  });
}

// d loss / d sink_h = -sum over the real rows of head h of exp(sink_h - LSE) * D: the sink has no
// value, so it reaches the loss only through each row's normalisation. One warp per head, its
// lanes over the rows in a fixed order.
template <typename Acc>
__global__ void __launch_bounds__(kThreadsPerBlock) reference_dsinks_kernel(const BackwardParams params) {
  const Problem& p = params.problem;
  const BackwardTensors& t = params.tensors;
  const int lane = threadIdx.x % kWarpSize;
  const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / kWarpSize;
  for (long long head = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / kWarpSize; head < p.heads;
       head += warps) {
    const Acc sink = t.sinks[head];
    Acc sum = 0;
    for (int b = 0; b < p.batch; ++b) {
      const int length = p.queries.sequence(b).length;
      for (int i = lane; i < length; i += kWarpSize) {
        const RowLocation q_at = at_position(p.queries, b, i);
        const Acc lse = *row_pointer<const float>(t.lse, q_at, head);
        // A row of LSE -inf (no key and a sink of -inf) has O = 0 and D = 0: nothing to add.
        if (lse == -INFINITY) continue;
        sum -= exp(sink - lse) * static_cast<const Acc*>(params.row_dot)[head * p.total_q() + q_at.token];
      }
    }
    sum = warp_sum(sum);
    if (lane == 0) t.dsinks[head] = static_cast<float>(sum);
  }
}

}  // namespace

size_t reference_backward_workspace_bytes(const Problem& problem, ReferencePrecision precision) {
  const size_t element = precision == ReferencePrecision::kFloat64 ? sizeof(double) : sizeof(float);
  const size_t bytes = static_cast<size_t>(problem.heads) * static_cast<size_t>(problem.total_q()) * element;
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

cudaError_t reference_backward(const Problem& problem, const BackwardTensors& tensors, void* workspace,
                               ReferencePrecision precision, cudaStream_t stream) {
  const BackwardParams params{problem, tensors, workspace, precision == ReferencePrecision::kNaiveLowPrecision};
  const long long q_work = problem.total_q() * problem.heads;
  const long long k_work = problem.total_k() * problem.heads_kv;
  return dispatch_types(problem.dtype, precision, [&](auto element, auto accumulator) {
    using T = typename decltype(element)::type;
    using Acc = typename decltype(accumulator)::type;
    // dQ first: its kernel also writes D, which the dK/dV kernel reads (stream order).
    if (q_work > 0) {
      reference_dq_kernel<T, Acc><<<grid_for(q_work), kThreadsPerBlock, 0, stream>>>(params);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    if (k_work > 0) {
      reference_dkdv_kernel<T, Acc><<<grid_for(k_work), kThreadsPerBlock, 0, stream>>>(params);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    if (tensors.dsinks != nullptr) {  // after the dQ kernel, which writes D
      if (q_work == 0) return cudaMemsetAsync(tensors.dsinks, 0, sizeof(float) * problem.heads, stream);
      reference_dsinks_kernel<Acc><<<grid_for(problem.heads), kThreadsPerBlock, 0, stream>>>(params);
    }
    return cudaGetLastError();
  });
}

}  // namespace hopattn
