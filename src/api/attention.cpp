// forward(), backward() and the workspace query: validate, check the device, dispatch.
#include <cuda_runtime.h>

#include "api/backward_dispatch.hpp"
#include "api/build_config.hpp"
#include "api/device.hpp"
#include "api/forward_dispatch.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

Status forward_workspace_size(const ForwardArgs& args, size_t* bytes) {
  if (bytes == nullptr) return Status(StatusCode::kInvalidArgument, "bytes is null");
  Problem problem;
  ForwardTensors tensors;
  if (Status s = validate_forward(args, &problem, &tensors); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  *bytes = forward_workspace_bytes(problem, tensors);
  return Status();
}

Status forward(const ForwardArgs& args, Workspace workspace, Stream stream) {
  Problem problem;
  ForwardTensors tensors;
  if (Status s = validate_forward(args, &problem, &tensors); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  if (workspace.data == nullptr) return run_forward(problem, tensors, nullptr, stream);
  const size_t required = forward_workspace_bytes(problem, tensors);
  if (Status s = validate_workspace(workspace, required, "forward"); !s.ok()) return s;
  return run_forward(problem, tensors, required > 0 ? workspace.data : nullptr, stream);
}

Status forward(const ForwardArgs& args, Stream stream) { return forward(args, Workspace{}, stream); }

Status backward_workspace_size(const BackwardArgs& args, size_t* bytes) {
  if (bytes == nullptr) return Status(StatusCode::kInvalidArgument, "bytes is null");
  Problem problem;
  BackwardTensors tensors;
  if (Status s = validate_backward(args, &problem, &tensors); !s.ok()) return s;
  *bytes = backward_workspace_bytes(problem, tensors);
  return Status();
}

Status backward(const BackwardArgs& args, Workspace workspace, Stream stream) {
  Problem problem;
  BackwardTensors tensors;
  if (Status s = validate_backward(args, &problem, &tensors); !s.ok()) return s;
  if (Status s = validate_workspace(workspace, backward_workspace_bytes(problem, tensors), "backward"); !s.ok()) {
    return s;
  }
  if (Status s = check_current_device(); !s.ok()) return s;
  return run_backward(problem, tensors, workspace.data, args.deterministic, stream);
}

BuildInfo build_info() {
  BuildInfo info;
  info.head_dims.assign(std::begin(build_config::kHeadDims), std::end(build_config::kHeadDims));
  info.kernel_head_dims.assign(std::begin(build_config::kKernelHeadDims), std::end(build_config::kKernelHeadDims));
  info.dtypes.assign(std::begin(build_config::kDTypes), std::end(build_config::kDTypes));
  info.softcap = build_config::kSoftcapKernels;
  info.version = build_config::kVersion;
  return info;
}

}  // namespace hopattn
