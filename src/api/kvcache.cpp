// forward_kvcache(): validate, append the new keys (with rotary embedding) into the cache, then
// the forward over the cache. The workspace holds what the append hands the forward: each
// sequence's key count after the append and the rotated q, then the forward's own workspace.
#include <cuda_runtime.h>

#include "api/device.hpp"
#include "api/forward_dispatch.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"

namespace hopattn {
namespace {

constexpr size_t kWorkspaceAlignment = 16;

size_t aligned(size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

// Byte offsets into forward_kvcache's workspace.
struct KVCacheWorkspace {
  size_t key_end = 0;    // int32 per sequence (with an append)
  size_t q_rotated = 0;  // q's shape, contiguous (with rotary)
  size_t forward = 0;    // the forward's workspace
  size_t bytes = 0;
};

// q_rotated's layout: contiguous (batch, seqlen_q, heads, head_dim), or (total_q, heads, head_dim).
RowTensor contiguous_q(const Problem& p, void* data) {
  const int64_t row = static_cast<int64_t>(p.heads) * p.head_dim;
  if (p.varlen()) return RowTensor{data, 0, row, p.head_dim};
  return RowTensor{data, row * p.max_seqlen_q, row, p.head_dim};
}

// `call` as the forward will run it: key counts from the append where there is one, q rotated.
void point_at_workspace(KVCacheCall* call, const KVCacheWorkspace& layout, char* base) {
  if (!call->appends()) return;
  AppendKVParams& append = call->append;
  append.key_end = reinterpret_cast<int32_t*>(base + layout.key_end);
  call->problem.keys.seqused = append.key_end;
  call->problem.after_append = true;
  if (append.rotary_dim > 0) {
    append.q_rotated = contiguous_q(call->problem, base + layout.q_rotated);
    call->tensors.q = append.q_rotated;
  }
}

KVCacheWorkspace workspace_layout(const KVCacheCall& validated) {
  KVCacheWorkspace layout;
  size_t at = 0;
  if (validated.appends()) {
    layout.key_end = at;
    at += aligned(sizeof(int32_t) * validated.problem.batch);
    if (validated.append.rotary_dim > 0) {
      layout.q_rotated = at;
      const Problem& p = validated.problem;
      at += aligned(2 * static_cast<size_t>(p.total_q()) * p.heads * p.head_dim);
    }
  }
  layout.forward = at;
  // The forward's workspace depends on the shapes only: the problem as it will run, with
  // cache_seqlens standing in for the append's key counts and q's own pointer for the rotated q.
  KVCacheCall call = validated;
  call.problem.after_append = call.appends();
  if (call.append.rotary_dim > 0) call.tensors.q = contiguous_q(call.problem, call.tensors.q.data);
  layout.bytes = at + forward_workspace_bytes(call.problem, call.tensors);
  return layout;
}

}  // namespace

Status forward_kvcache_workspace_size(const KVCacheArgs& args, size_t* bytes) {
  if (bytes == nullptr) return Status(StatusCode::kInvalidArgument, "bytes is null");
  KVCacheCall call;
  if (Status s = validate_kvcache(args, &call); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  if (Status s = check_forward_kernel_built(call.problem); !s.ok()) return s;
  *bytes = workspace_layout(call).bytes;
  return Status();
}

Status forward_kvcache(const KVCacheArgs& args, Workspace workspace, Stream stream) {
  KVCacheCall call;
  if (Status s = validate_kvcache(args, &call); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  // Before the append: an error must leave the cache as it was.
  if (Status s = check_forward_kernel_built(call.problem); !s.ok()) return s;
  const KVCacheWorkspace layout = workspace_layout(call);
  if (Status s = validate_workspace(workspace, layout.bytes, "forward_kvcache"); !s.ok()) return s;
  char* base = static_cast<char*>(workspace.data);
  point_at_workspace(&call, layout, base);
  if (call.appends()) {
    if (Status s = cuda_status(launch_append_kv(call.append, stream), "KV cache append launch"); !s.ok()) return s;
  }
  const bool forward_workspace = layout.bytes > layout.forward;
  return run_forward(call.problem, call.tensors, forward_workspace ? base + layout.forward : nullptr, stream);
}

}  // namespace hopattn
