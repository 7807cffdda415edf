#include "api/forward_dispatch.hpp"

#include <string>

#include "api/device.hpp"
#include "api/kernel_choice.hpp"
#include "kernels/common/clear_uncovered_rows.hpp"
#include "kernels/fwd/forward_kernels.hpp"
#include "kernels/reference/reference_attention.hpp"

namespace hopattn {
namespace {

using ForwardLauncher = cudaError_t (*)(const Problem&, const ForwardTensors&, const DeviceLimits&, void*,
                                        cudaStream_t);
using ForwardWorkspaceSizer = size_t (*)(const Problem&, const DeviceLimits&);

struct ForwardKernelEntry {
  DType dtype;
  HeadDimPair head_dims;
  ScoreVariant scores;
  ForwardLauncher launch;
  ForwardWorkspaceSizer workspace_bytes;
};

// One entry per instantiation this build compiled (generated from HOPATTN_HEADDIMS/HOPATTN_DTYPES
// and HOPATTN_SOFTCAP).
constexpr ForwardKernelEntry kForwardKernels[] = {
#define HOPATTN_KERNEL(dtype, head_dim, head_dim_v, scores)                                         \
  {DType::dtype, {head_dim, head_dim_v}, ScoreVariant::scores,                                      \
   &launch_forward_kernel<DType::dtype, head_dim, head_dim_v, ScoreVariant::scores>,                \
   &forward_workspace_bytes<DType::dtype, head_dim, head_dim_v, ScoreVariant::scores>},
#include "kernels/instantiations/kernel_list.inc"
#undef HOPATTN_KERNEL
};

const ForwardKernelEntry* find_forward_kernel(const Problem& p) { return smallest_kernel_holding(kForwardKernels, p); }

}  // namespace

Status check_forward_kernel_built(const Problem& problem) {
  return find_forward_kernel(problem) != nullptr ? Status() : missing_kernel("forward", problem);
}

namespace {

// The Hopper kernel (kNotSupported when this build did not compile one for the problem).
Status run_forward_kernel(const Problem& problem, const ForwardTensors& tensors, void* workspace, cudaStream_t stream) {
  if (Status s = check_forward_kernel_built(problem); !s.ok()) return s;
  const ForwardKernelEntry* kernel = find_forward_kernel(problem);
  return cuda_status(kernel->launch(problem, tensors, current_device_limits(), workspace, stream),
                     "forward kernel launch");
}

}  // namespace

bool has_broadcast_input(const Problem& p, const RowTensor& q, const RowTensor& k, const RowTensor& v) {
  auto broadcast = [&](const RowTensor& x, long long rows, int heads) {
    return (!p.varlen() && p.batch > 1 && x.batch_stride == 0) || (rows > 1 && x.row_stride == 0) ||
           (heads > 1 && x.head_stride == 0);
  };
  const long long q_rows = p.varlen() ? p.total_q() : p.max_seqlen_q;
  const long long k_rows = p.varlen() ? p.total_k() : p.max_seqlen_k;
  return broadcast(q, q_rows, p.heads) || broadcast(k, k_rows, p.heads_kv) || broadcast(v, k_rows, p.heads_kv);
}

namespace {

// FP8 inputs run the Hopper FP8 kernel where this build has one for the head dims (HOPATTN_FP8)
// and O is bf16, its only output type so far; else the simple kernel.
bool fp8_takes_kernel(const Problem& problem) {
  return find_forward_kernel(problem) != nullptr && problem.out_dtype == DType::kBFloat16;
}

}  // namespace

// Without a single key there is nothing to load (and no valid TMA descriptor for K/V): every row
// is O = 0, LSE = -inf, which the simple kernel writes; it also takes broadcast inputs, and FP8
// inputs that the FP8 kernel does not (fp8_takes_kernel). Never a KV cache's problem, which it
// does not know: caches have positions and distinct rows (validate.cpp), their q is not
// broadcast, and they take no FP8 yet.
bool takes_simple_path(const Problem& problem, const ForwardTensors& tensors) {
  if (problem.key_cache.enabled()) return false;
  return problem.total_k() == 0 || (problem.dtype == DType::kFloat8E4M3 && !fp8_takes_kernel(problem)) ||
         has_broadcast_input(problem, tensors.q, tensors.k, tensors.v);
}

size_t forward_workspace_bytes(const Problem& problem, const ForwardTensors& tensors) {
  if (problem.total_q() == 0 || takes_simple_path(problem, tensors)) return 0;
  const ForwardKernelEntry* kernel = find_forward_kernel(problem);
  return kernel == nullptr ? 0 : kernel->workspace_bytes(problem, current_device_limits());
}

Status run_forward(const Problem& problem, const ForwardTensors& tensors, void* workspace, cudaStream_t stream) {
  if (problem.total_q() == 0) return Status();  // nothing to write
  // Varlen: O = 0 and LSE = -inf on the rows no sequence covers. Not for a KV cache's call, whose
  // forward overlaps the append kernel before it (grid_dependency.cuh) and whose caller fills them.
  if (!problem.key_cache.enabled()) {
    if (Status s = cuda_status(clear_uncovered_output_rows(problem, tensors, stream), "forward kernel launch");
        !s.ok()) {
      return s;
    }
  }
  if (takes_simple_path(problem, tensors)) {
    return cuda_status(reference_forward(problem, tensors, ReferencePrecision::kFloat32, stream),
                       "forward kernel launch");
  }
  return run_forward_kernel(problem, tensors, workspace, stream);
}

}  // namespace hopattn
