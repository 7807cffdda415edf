#include "kernels/common/clear_uncovered_rows.hpp"

#include <cstdint>

#include "kernels/common/uncovered_rows.hpp"

namespace hopattn {
namespace {

// One output to clear: its rows along the packed axis of `side`, `heads` x `row_elems` elements
// of `element_bytes` (2: fp16/bf16, 4: fp32) each, set to the bit pattern `fill`.
struct ClearTarget {
  RowTensor tensor;
  SequenceLayout side;
  int heads = 0;
  int row_elems = 0;
  int element_bytes = 2;
  uint32_t fill = 0;
};

struct ClearParams {
  ClearTarget targets[3];
  int batch = 0;
};

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlocksPerGap = 4;  // a gap's rows are spread over this many CTAs
constexpr uint32_t kFloatMinusInfinity = 0xff800000u;

template <typename T>
__device__ void clear_row(const ClearTarget& t, long long row, int lane) {
  const T fill = static_cast<T>(t.fill);
  if (t.row_elems >= 32) {  // a head's elements side by side across the lanes
    for (int head = 0; head < t.heads; ++head) {
      T* out = t.tensor.at<T>(0, row, head);
      for (int e = lane; e < t.row_elems; e += 32) out[e] = fill;
    }
  } else {  // short rows (LSE: one value a head): the lanes take heads
    for (int head = lane; head < t.heads; head += 32) {
      T* out = t.tensor.at<T>(0, row, head);
      for (int e = 0; e < t.row_elems; ++e) out[e] = fill;
    }
  }
}

// Grid (batch + 1 gaps, kBlocksPerGap, targets). A warp clears a row at a time, walking the gap's
// rows, heads and elements without dividing: an index per element split by 64-bit division and
// remainder cost about a hundred instructions an element where seqused leaves long gaps.
__global__ void __launch_bounds__(kThreads) clear_uncovered_rows_kernel(const __grid_constant__ ClearParams p) {
  const ClearTarget& t = p.targets[blockIdx.z];
  const RowSpan gap = uncovered_rows(t.side, p.batch, static_cast<int>(blockIdx.x));
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const long long first = gap.begin + static_cast<long long>(blockIdx.y) * kWarps + threadIdx.x / 32;
  for (long long row = first; row < gap.end; row += static_cast<long long>(kBlocksPerGap) * kWarps) {
    if (t.element_bytes == 2) {
      clear_row<uint16_t>(t, row, lane);
    } else {
      clear_row<uint32_t>(t, row, lane);
    }
  }
}

// Collects the targets on a varlen side (and with data) and launches once for all of them.
class ClearLaunch {
 public:
  explicit ClearLaunch(int batch) { params_.batch = batch; }

  void add(const RowTensor& tensor, const SequenceLayout& side, int heads, int row_elems, int element_bytes,
           uint32_t fill) {
    if (side.varlen() && tensor.data != nullptr) {
      params_.targets[count_++] = ClearTarget{tensor, side, heads, row_elems, element_bytes, fill};
    }
  }

  cudaError_t launch(cudaStream_t stream) const {
    if (count_ == 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>(params_.batch) + 1, kBlocksPerGap, count_);
    clear_uncovered_rows_kernel<<<grid, kThreads, 0, stream>>>(params_);
    return cudaGetLastError();
  }

 private:
  ClearParams params_;
  int count_ = 0;
};

}  // namespace

cudaError_t clear_uncovered_output_rows(const Problem& problem, const ForwardTensors& tensors, cudaStream_t stream) {
  ClearLaunch clear(problem.batch);
  clear.add(tensors.o, problem.queries, problem.heads, problem.head_dim_v, 2, 0);
  clear.add(tensors.lse, problem.queries, problem.heads, 1, 4, kFloatMinusInfinity);
  return clear.launch(stream);
}

cudaError_t clear_uncovered_gradient_rows(const Problem& problem, const BackwardTensors& tensors, cudaStream_t stream) {
  ClearLaunch clear(problem.batch);
  clear.add(tensors.dq, problem.queries, problem.heads, problem.head_dim, 2, 0);
  clear.add(tensors.dk, problem.keys, problem.heads_kv, problem.head_dim, 2, 0);
  clear.add(tensors.dv, problem.keys, problem.heads_kv, problem.head_dim_v, 2, 0);
  return clear.launch(stream);
}

}  // namespace hopattn
