// Argument validation: every rule of the public API, checked on the host before anything launches.
// On success the arguments are normalised into a Problem plus row-tensor views.
#pragma once

#include "hopattn/hopattn.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/kvcache/append_kv.hpp"

namespace hopattn {

Status validate_forward(const ForwardArgs& args, Problem* problem, ForwardTensors* tensors);

// forward_kvcache's arguments, normalised: the attention over the cache (its key counts read from
// cache_seqlens until forward_kvcache points them at the append's), its tensors, and the append
// step; the append's workspace pointers (key_end, q_rotated) are left null.
struct KVCacheCall {
  Problem problem;
  ForwardTensors tensors;
  AppendKVParams append;

  // Whether the call writes new keys or rotates q, i.e. runs the append kernel first.
  bool appends() const { return append.k_new.data != nullptr || append.rotary_dim > 0; }
};
Status validate_kvcache(const KVCacheArgs& args, KVCacheCall* call);
Status validate_backward(const BackwardArgs& args, Problem* problem, BackwardTensors* tensors);

// Checks a caller's workspace against the bytes that `call` ("forward", "backward") needs.
Status validate_workspace(const Workspace& workspace, size_t required_bytes, const char* call);

}  // namespace hopattn
