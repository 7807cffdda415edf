// Argument validation: every rule of the public API, checked on the host before anything launches.
// On success the arguments are normalised into a Problem plus row-tensor views.
#pragma once

#include "kernels/common/problem.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {

Status validate_forward(const ForwardArgs& args, Problem* problem, ForwardTensors* tensors);
Status validate_backward(const BackwardArgs& args, Problem* problem, BackwardTensors* tensors);

// Checks a caller's workspace against the bytes that `call` ("forward", "backward") needs.
Status validate_workspace(const Workspace& workspace, size_t required_bytes, const char* call);

}  // namespace hopattn
