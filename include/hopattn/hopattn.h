/* hopattn: exact fused attention for NVIDIA Hopper GPUs. C ABI.
 *
 * A mirror of hopattn.hpp for callers without C++ (Python ctypes, Rust, ...). Every argument
 * struct starts with `struct_size`: call the matching *_init function first, which sets it and
 * every default. Fields added in later versions go at the end, so a caller built against an older
 * header keeps working (the library takes the defaults for fields it did not pass).
 *
 * Functions return a hopattn_status; on failure hopattn_last_error() returns a message naming the
 * argument and the rule it broke (thread-local, valid until the next hopattn call on the thread).
 */
#ifndef HOPATTN_H_
#define HOPATTN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hopattn_status {
  HOPATTN_OK = 0,
  HOPATTN_ERROR_INVALID_ARGUMENT = 1,
  HOPATTN_ERROR_NOT_SUPPORTED = 2,
  HOPATTN_ERROR_DEVICE_UNAVAILABLE = 3,
  HOPATTN_ERROR_CUDA = 4
} hopattn_status;

typedef enum hopattn_dtype { HOPATTN_FLOAT16 = 0, HOPATTN_BFLOAT16 = 1, HOPATTN_FLOAT32 = 2 } hopattn_dtype;

#define HOPATTN_MAX_RANK 4

typedef struct hopattn_tensor {
  void* data;
  int32_t dtype; /* hopattn_dtype */
  int32_t rank;
  int64_t shape[HOPATTN_MAX_RANK];
  int64_t stride[HOPATTN_MAX_RANK]; /* in elements */
} hopattn_tensor;

typedef struct hopattn_int_array {
  const int32_t* data; /* device memory */
  int64_t size;
} hopattn_int_array;

typedef struct hopattn_varlen {
  hopattn_int_array cu_seqlens_q;
  hopattn_int_array cu_seqlens_k;
  hopattn_int_array seqused_q;
  hopattn_int_array seqused_k;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
} hopattn_varlen;

typedef struct hopattn_forward_args {
  size_t struct_size;
  hopattn_tensor q, k, v, o, lse;
  float softmax_scale; /* 0 selects 1/sqrt(head_dim) */
  int32_t causal;
  int32_t window_left;  /* -1: unbounded */
  int32_t window_right; /* -1: unbounded */
  hopattn_varlen varlen;
  /* Added after 0.1.0 (see hopattn.hpp, ForwardArgs): key splits per query tile (0: chosen, 1: never,
   * n > 1: up to n; splits need the workspace) and GQA head packing (-1: chosen, 0: off, 1: on). */
  int32_t num_splits;
  int32_t pack_gqa;
} hopattn_forward_args;

typedef struct hopattn_backward_args {
  size_t struct_size;
  hopattn_tensor q, k, v, o, lse, dout, dq, dk, dv;
  float softmax_scale;
  int32_t causal;
  int32_t window_left;
  int32_t window_right;
  hopattn_varlen varlen;
  int32_t deterministic;
} hopattn_backward_args;

void hopattn_forward_args_init(hopattn_forward_args* args);
void hopattn_backward_args_init(hopattn_backward_args* args);

/* `stream` is a cudaStream_t (NULL: the legacy default stream). */
int hopattn_forward(const hopattn_forward_args* args, void* stream);
/* Optional workspace that lets the forward balance its tiles across the SMs (see hopattn.hpp). */
int hopattn_forward_workspace_size(const hopattn_forward_args* args, size_t* bytes);
int hopattn_forward_with_workspace(const hopattn_forward_args* args, void* workspace, size_t workspace_bytes,
                                   void* stream);
int hopattn_backward_workspace_size(const hopattn_backward_args* args, size_t* bytes);
int hopattn_backward(const hopattn_backward_args* args, void* workspace, size_t workspace_bytes, void* stream);

const char* hopattn_last_error(void);
const char* hopattn_version(void);
/* The git commit the library was built from (12 hex digits, "-dirty" when the tree had local
 * changes, "unknown" outside a git checkout): results can name the exact code that produced them. */
const char* hopattn_build_commit(void);

#ifdef __cplusplus
}
#endif

#endif /* HOPATTN_H_ */
