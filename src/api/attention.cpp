// forward(), backward() and the workspace query: validate, check the device, dispatch.
#include <cuda_runtime.h>

#include "api/build_config.hpp"
#include "api/device.hpp"
#include "api/forward_dispatch.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"
#include "kernels/reference/reference_attention.hpp"

namespace hopattn {
namespace {

// The precision backward() runs the reference in until the Hopper backward kernels land.
constexpr ReferencePrecision kApiPrecision = ReferencePrecision::kFloat32;

}  // namespace

Status forward(const ForwardArgs& args, Stream stream) {
  Problem problem;
  ForwardTensors tensors;
  if (Status s = validate_forward(args, &problem, &tensors); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  return run_forward(problem, tensors, stream);
}

Status backward_workspace_size(const BackwardArgs& args, size_t* bytes) {
  if (bytes == nullptr) return Status(StatusCode::kInvalidArgument, "bytes is null");
  Problem problem;
  BackwardTensors tensors;
  if (Status s = validate_backward(args, &problem, &tensors); !s.ok()) return s;
  *bytes = reference_backward_workspace_bytes(problem, kApiPrecision);
  return Status();
}

Status backward(const BackwardArgs& args, Workspace workspace, Stream stream) {
  Problem problem;
  BackwardTensors tensors;
  if (Status s = validate_backward(args, &problem, &tensors); !s.ok()) return s;
  const size_t required = reference_backward_workspace_bytes(problem, kApiPrecision);
  if (Status s = validate_workspace(workspace, required); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  return cuda_status(reference_backward(problem, tensors, workspace.data, kApiPrecision, stream),
                     "backward kernel launch");
}

BuildInfo build_info() {
  BuildInfo info;
  info.head_dims.assign(std::begin(build_config::kHeadDims), std::end(build_config::kHeadDims));
  info.dtypes.assign(std::begin(build_config::kDTypes), std::end(build_config::kDTypes));
  info.version = build_config::kVersion;
  return info;
}

}  // namespace hopattn
