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
constexpr int kBlocksPerGap = 4;  // a gap's rows are spread over this many CTAs
constexpr uint32_t kFloatMinusInfinity = 0xff800000u;

// Grid (batch + 1 gaps, kBlocksPerGap, targets).
__global__ void __launch_bounds__(kThreads) clear_uncovered_rows_kernel(const __grid_constant__ ClearParams p) {
  const ClearTarget& t = p.targets[blockIdx.z];
  const RowSpan gap = uncovered_rows(t.side, p.batch, static_cast<int>(blockIdx.x));
  const long long per_row = static_cast<long long>(t.heads) * t.row_elems;
  const long long elements = (gap.end - gap.begin) * per_row;
  for (long long i = static_cast<long long>(blockIdx.y) * kThreads + threadIdx.x; i < elements;
       i += static_cast<long long>(kBlocksPerGap) * kThreads) {
    const long long row = gap.begin + i / per_row;
    const long long within = i % per_row;
    const int head = static_cast<int>(within / t.row_elems), element = static_cast<int>(within % t.row_elems);
    if (t.element_bytes == 2) {
      t.tensor.at<uint16_t>(0, row, head)[element] = static_cast<uint16_t>(t.fill);
    } else {
      t.tensor.at<uint32_t>(0, row, head)[element] = t.fill;
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
