// The C ABI: converts the POD argument structs to the C++ ones and keeps the last error message.
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "api/build_config.hpp"
#include "git_commit.hpp"
#include "hopattn/hopattn.h"
#include "hopattn/hopattn.hpp"

namespace hopattn {
namespace {

thread_local std::string g_last_error;

// Larger sizes are garbage (an uninitialised struct), not a future version.
constexpr size_t kMaxStructSize = size_t{1} << 16;

int report(const Status& status) {
  g_last_error = status.message();
  return static_cast<int>(status.code());
}

// Copies the caller's struct over a default-initialised one, so that a caller built against an
// older, shorter struct gets defaults for the fields it does not know.
template <typename CArgs>
Status read_args(const CArgs* user, void (*init)(CArgs*, size_t), const char* name, CArgs* out) {
  if (user == nullptr) return Status(StatusCode::kInvalidArgument, std::string(name) + " is null");
  init(out, sizeof(CArgs));
  const size_t size = user->struct_size;
  if (size < sizeof(size_t) || size > kMaxStructSize) {
    return Status(StatusCode::kInvalidArgument, std::string(name) + "->struct_size is " + std::to_string(size) +
                                                    "; initialise " + name +
                                                    " with its hopattn_*_args_init function first");
  }
  const size_t known = size < sizeof(CArgs) ? size : sizeof(CArgs);
  std::memcpy(static_cast<void*>(out), user, known);
  out->struct_size = sizeof(CArgs);
  return Status();
}

// An entry point's frame: the caller's `args` read (read_args), `call(args)` on them, and the
// outcome reported (the status code, the message kept for hopattn_last_error).
template <typename CArgs, typename Call>
int call_with_args(const CArgs* user, void (*init)(CArgs*, size_t), Call&& call) {
  CArgs args;
  Status s = read_args(user, init, "args", &args);
  if (s.ok()) s = call(args);
  return report(s);
}

Tensor to_tensor(const hopattn_tensor& t) {
  Tensor out;
  out.data = t.data;
  out.dtype = static_cast<DType>(t.dtype);
  out.rank = t.rank;
  for (int d = 0; d < Tensor::kMaxRank; ++d) {
    out.shape[d] = t.shape[d];
    out.stride[d] = t.stride[d];
  }
  return out;
}

IntArray to_int_array(const hopattn_int_array& a) { return IntArray{a.data, a.size}; }

Varlen to_varlen(const hopattn_varlen& v) {
  return Varlen{to_int_array(v.cu_seqlens_q),
                to_int_array(v.cu_seqlens_k),
                to_int_array(v.seqused_q),
                to_int_array(v.seqused_k),
                v.max_seqlen_q,
                v.max_seqlen_k};
}

PageTable to_page_table(const hopattn_page_table& t) { return PageTable{t.data, t.batch, t.max_pages, t.row_stride}; }

// Defaults of every argument struct (zeros, unbounded window, default scale, pack_gqa auto where
// it has one) into the caller's `size` bytes: the fields that fit, zeros past the ones this
// library knows.
template <typename CArgs>
void init_args(CArgs* args, size_t size) {
  if (args == nullptr || size < sizeof(size_t)) return;
  CArgs defaults;
  std::memset(static_cast<void*>(&defaults), 0, sizeof(defaults));
  defaults.softmax_scale = kDefaultSoftmaxScale;
  defaults.window_left = -1;
  defaults.window_right = -1;
  if constexpr (!std::is_same_v<CArgs, hopattn_backward_args>) {
    defaults.pack_gqa = static_cast<int32_t>(PackGqa::kAuto);
  }
  const size_t known = size < sizeof(CArgs) ? size : sizeof(CArgs);
  std::memcpy(static_cast<void*>(args), &defaults, known);
  if (size > known) std::memset(reinterpret_cast<char*>(args) + known, 0, size - known);
  args->struct_size = size;
}

// The fields forward and backward arguments share.
template <typename CArgs, typename Args>
Args common_args(const CArgs& a) {
  Args out;
  out.q = to_tensor(a.q);
  out.k = to_tensor(a.k);
  out.v = to_tensor(a.v);
  out.o = to_tensor(a.o);
  out.lse = to_tensor(a.lse);
  out.softmax_scale = a.softmax_scale;
  out.mask = Mask{a.causal != 0, a.window_left, a.window_right};
  out.varlen = to_varlen(a.varlen);
  return out;
}

ForwardArgs to_forward_args(const hopattn_forward_args& a) {
  ForwardArgs out = common_args<hopattn_forward_args, ForwardArgs>(a);
  out.num_splits = a.num_splits;
  out.pack_gqa = static_cast<PackGqa>(a.pack_gqa);
  out.page_table = to_page_table(a.page_table);
  out.sinks = to_tensor(a.sinks);
  out.softcap = a.softcap;
  out.q_descale = to_tensor(a.q_descale);
  out.k_descale = to_tensor(a.k_descale);
  out.v_descale = to_tensor(a.v_descale);
  return out;
}

KVCacheArgs to_kvcache_args(const hopattn_kvcache_args& a) {
  KVCacheArgs out;
  out.q = to_tensor(a.q);
  out.k_cache = to_tensor(a.k_cache);
  out.v_cache = to_tensor(a.v_cache);
  out.page_table = to_page_table(a.page_table);
  out.cache_seqlens = to_int_array(a.cache_seqlens);
  out.cache_batch_idx = to_int_array(a.cache_batch_idx);
  out.cache_leftpad = to_int_array(a.cache_leftpad);
  out.k_new = to_tensor(a.k_new);
  out.v_new = to_tensor(a.v_new);
  out.cu_seqlens_new = to_int_array(a.cu_seqlens_new);
  out.rotary.cos = to_tensor(a.rotary.cos);
  out.rotary.sin = to_tensor(a.rotary.sin);
  out.rotary.interleaved = a.rotary.interleaved != 0;
  out.rotary.positions = to_int_array(a.rotary.positions);
  out.cu_seqlens_q = to_int_array(a.cu_seqlens_q);
  out.max_seqlen_q = a.max_seqlen_q;
  out.o = to_tensor(a.o);
  out.lse = to_tensor(a.lse);
  out.softmax_scale = a.softmax_scale;
  out.mask = Mask{a.causal != 0, a.window_left, a.window_right};
  out.num_splits = a.num_splits;
  out.pack_gqa = static_cast<PackGqa>(a.pack_gqa);
  out.sinks = to_tensor(a.sinks);
  out.softcap = a.softcap;
  out.q_descale = to_tensor(a.q_descale);
  out.k_descale = to_tensor(a.k_descale);
  out.v_descale = to_tensor(a.v_descale);
  return out;
}

BackwardArgs to_backward_args(const hopattn_backward_args& a) {
  BackwardArgs out = common_args<hopattn_backward_args, BackwardArgs>(a);
  out.dout = to_tensor(a.dout);
  out.dq = to_tensor(a.dq);
  out.dk = to_tensor(a.dk);
  out.dv = to_tensor(a.dv);
  out.deterministic = a.deterministic != 0;
  out.sinks = to_tensor(a.sinks);
  out.dsinks = to_tensor(a.dsinks);
  out.softcap = a.softcap;
  return out;
}

}  // namespace
}  // namespace hopattn

using hopattn::Status;

extern "C" {

void hopattn_forward_args_init_sized(hopattn_forward_args* args, size_t size) { hopattn::init_args(args, size); }
void hopattn_backward_args_init_sized(hopattn_backward_args* args, size_t size) { hopattn::init_args(args, size); }
void hopattn_kvcache_args_init_sized(hopattn_kvcache_args* args, size_t size) { hopattn::init_args(args, size); }

// The first versions' structs ended before the first field appended since: 0.1.0's forward and
// backward arguments, and the KV-cache call's as it was introduced. (Parenthesised names: not the
// header's macros.)
void(hopattn_forward_args_init)(hopattn_forward_args* args) {
  hopattn::init_args(args, offsetof(hopattn_forward_args, num_splits));
}
void(hopattn_backward_args_init)(hopattn_backward_args* args) {
  hopattn::init_args(args, offsetof(hopattn_backward_args, sinks));
}
void(hopattn_kvcache_args_init)(hopattn_kvcache_args* args) {
  hopattn::init_args(args, offsetof(hopattn_kvcache_args, sinks));
}

int hopattn_forward(const hopattn_forward_args* user, void* stream) {
  return hopattn::call_with_args(user, hopattn_forward_args_init_sized, [&](const hopattn_forward_args& args) {
    return hopattn::forward(hopattn::to_forward_args(args), static_cast<hopattn::Stream>(stream));
  });
}

int hopattn_forward_workspace_size(const hopattn_forward_args* user, size_t* bytes) {
  return hopattn::call_with_args(user, hopattn_forward_args_init_sized, [&](const hopattn_forward_args& args) {
    return hopattn::forward_workspace_size(hopattn::to_forward_args(args), bytes);
  });
}

int hopattn_forward_with_workspace(const hopattn_forward_args* user, void* workspace, size_t workspace_bytes,
                                   void* stream) {
  return hopattn::call_with_args(user, hopattn_forward_args_init_sized, [&](const hopattn_forward_args& args) {
    return hopattn::forward(hopattn::to_forward_args(args), hopattn::Workspace{workspace, workspace_bytes},
                            static_cast<hopattn::Stream>(stream));
  });
}

int hopattn_forward_kvcache_workspace_size(const hopattn_kvcache_args* user, size_t* bytes) {
  return hopattn::call_with_args(user, hopattn_kvcache_args_init_sized, [&](const hopattn_kvcache_args& args) {
    return hopattn::forward_kvcache_workspace_size(hopattn::to_kvcache_args(args), bytes);
  });
}

int hopattn_forward_kvcache(const hopattn_kvcache_args* user, void* workspace, size_t workspace_bytes, void* stream) {
  return hopattn::call_with_args(user, hopattn_kvcache_args_init_sized, [&](const hopattn_kvcache_args& args) {
    return hopattn::forward_kvcache(hopattn::to_kvcache_args(args), hopattn::Workspace{workspace, workspace_bytes},
                                    static_cast<hopattn::Stream>(stream));
  });
}

int hopattn_backward_workspace_size(const hopattn_backward_args* user, size_t* bytes) {
  return hopattn::call_with_args(user, hopattn_backward_args_init_sized, [&](const hopattn_backward_args& args) {
    return hopattn::backward_workspace_size(hopattn::to_backward_args(args), bytes);
  });
}

int hopattn_backward(const hopattn_backward_args* user, void* workspace, size_t workspace_bytes, void* stream) {
  return hopattn::call_with_args(user, hopattn_backward_args_init_sized, [&](const hopattn_backward_args& args) {
    return hopattn::backward(hopattn::to_backward_args(args), hopattn::Workspace{workspace, workspace_bytes},
                             static_cast<hopattn::Stream>(stream));
  });
}

const char* hopattn_last_error(void) { return hopattn::g_last_error.c_str(); }

const char* hopattn_version(void) { return hopattn::build_config::kVersion; }

const char* hopattn_build_commit(void) { return HOPATTN_GIT_COMMIT; }

}  // extern "C"
