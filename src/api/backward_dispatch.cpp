#include "api/backward_dispatch.hpp"

#include <string>

#include "api/device.hpp"
#include "api/forward_dispatch.hpp"
#include "api/kernel_choice.hpp"
#include "kernels/bwd/backward_kernels.hpp"
#include "kernels/common/clear_uncovered_rows.hpp"
#include "kernels/reference/reference_attention.hpp"

namespace hopattn {
namespace {

using BackwardLauncher = cudaError_t (*)(const Problem&, const BackwardTensors&, void*, bool, const DeviceLimits&,
                                         cudaStream_t);

struct BackwardKernelEntry {
  DType dtype;
  HeadDimPair head_dims;
  ScoreVariant scores;
  BackwardLauncher launch;
};

// One entry per backward instantiation this build compiled (HOPATTN_HEADDIMS/HOPATTN_DTYPES and
// HOPATTN_SOFTCAP).
constexpr BackwardKernelEntry kBackwardKernels[] = {
#define HOPATTN_KERNEL(dtype, head_dim, head_dim_v, scores)          \
  {DType::dtype, {head_dim, head_dim_v}, ScoreVariant::scores,       \
   &launch_backward_kernels<DType::dtype, head_dim, head_dim_v, ScoreVariant::scores>},
#include "kernels/instantiations/backward_kernel_list.inc"
#undef HOPATTN_KERNEL
    {DType::kFloat32, {}, ScoreVariant::kPlain, nullptr},  // end marker: a build may compile no backward kernel
};

// Grid limits: the pre- and postprocess kernels put heads and batch on grid dimensions y and z
// (at most 65535 each); the main kernel's one-dimensional grid of (key block, head slice, KV head,
// batch) must stay below 2^31 CTAs (key blocks of at least 64 keys, at most heads / heads_kv
// slices).
constexpr int kMaxGridYZ = 65535;
bool fits_grid(const Problem& p) {
  const long long key_blocks = (static_cast<long long>(p.max_seqlen_k) + 63) / 64;
  return p.heads <= kMaxGridYZ && p.batch <= kMaxGridYZ && key_blocks * p.heads * p.batch < (1LL << 31);
}

struct BackwardPlan {
  bool reference = false;                      // the simple kernels at fp32
  const BackwardKernelEntry* kernel = nullptr;  // else the Hopper kernels; null: not built
};

BackwardPlan plan_backward(const Problem& p, const BackwardTensors& t) {
  BackwardPlan plan;
  // Without queries or keys there is nothing to stream (and no valid TMA descriptor); broadcast
  // inputs are not given to TMA; grids past the launch limits: all take the simple kernels.
  if (p.total_q() == 0 || p.total_k() == 0 || has_broadcast_input(p, t.q, t.k, t.v) ||
      has_broadcast_input(p, t.dout, t.k, t.v) || !fits_grid(p)) {
    plan.reference = true;
    return plan;
  }
  plan.kernel = smallest_kernel_holding(kBackwardKernels, p);
  return plan;
}

constexpr ReferencePrecision kReferencePrecision = ReferencePrecision::kFloat32;

}  // namespace

size_t backward_workspace_bytes(const Problem& problem, const BackwardTensors& tensors) {
  const BackwardPlan plan = plan_backward(problem, tensors);
  if (plan.reference) return reference_backward_workspace_bytes(problem, kReferencePrecision);
  return plan.kernel ? BackwardWorkspace::bytes_for(problem, plan.kernel->head_dims) : 0;
}

Status run_backward(const Problem& problem, const BackwardTensors& tensors, void* workspace, bool deterministic,
                    cudaStream_t stream) {
  const BackwardPlan plan = plan_backward(problem, tensors);
  if (plan.reference || plan.kernel != nullptr) {
    if (Status s = cuda_status(clear_uncovered_gradient_rows(problem, tensors, stream), "backward kernel launch");
        !s.ok()) {
      return s;
    }
  }
  if (plan.reference) {
    // The reference has no atomics: it is deterministic either way.
    return cuda_status(reference_backward(problem, tensors, workspace, kReferencePrecision, stream),
                       "backward kernel launch");
  }
  if (plan.kernel == nullptr) return missing_kernel("backward", problem);
  return cuda_status(plan.kernel->launch(problem, tensors, workspace, deterministic, current_device_limits(), stream),
                     "backward kernel launch");
}

}  // namespace hopattn
