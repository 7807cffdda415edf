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

/* HOPATTN_FLOAT8_E4M3: q, k and v of the FP8 forward (OCP e4m3; hopattn.hpp, DType). */
typedef enum hopattn_dtype {
  HOPATTN_FLOAT16 = 0,
  HOPATTN_BFLOAT16 = 1,
  HOPATTN_FLOAT32 = 2,
  HOPATTN_FLOAT8_E4M3 = 3
} hopattn_dtype;

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

/* A paged KV cache's page table (hopattn.hpp, PageTable): key j of sequence b is row
 * j % page_size of page data[b * row_stride + j / page_size]. data == NULL: no paging. */
typedef struct hopattn_page_table {
  const int32_t* data; /* device memory, (batch, max_pages) */
  int64_t batch;       /* rows: one per sequence (or per cache_batch_idx value) */
  int64_t max_pages;   /* columns: pages a sequence can own */
  int64_t row_stride;  /* elements between rows; 0 means max_pages */
} hopattn_page_table;

typedef struct hopattn_forward_args {
  size_t struct_size;
  /* As in hopattn.hpp's ForwardArgs: q and k end in head_dim, v and o in head_dim_v (v's last
   * dimension, which may differ from head_dim). With varlen and no page table, rows that no
   * sequence's real tokens cover get o = 0 and lse = -inf. */
  hopattn_tensor q, k, v, o, lse;
  float softmax_scale; /* 0 selects 1/sqrt(head_dim) (q's) */
  int32_t causal;
  int32_t window_left;  /* -1: unbounded */
  int32_t window_right; /* -1: unbounded */
  hopattn_varlen varlen;
  /* Added after 0.1.0 (see hopattn.hpp, ForwardArgs): key splits per query tile (0: chosen, 1: never,
   * n > 1: up to n; splits need the workspace) and GQA head packing (-1: chosen, 0: off, 1: on). */
  int32_t num_splits;
  int32_t pack_gqa;
  /* Added after 0.1.0: paged K/V (chunked prefill). With page_table.data set, k is
   * (num_pages, page_size, heads_kv, head_dim) and v (num_pages, page_size, heads_kv, head_dim_v),
   * varlen.cu_seqlens_k must be null and varlen.seqused_k counts each sequence's keys (default:
   * max_pages * page_size). */
  hopattn_page_table page_table;
  /* Added after 0.1.0: attention sinks (hopattn.hpp, ForwardArgs; docs/semantics.md, "Attention
   * sinks"). Optional float32 (heads,), one logit per query head added to every row's softmax
   * denominator (not scaled by softmax_scale): o shrinks by the sink's share and lse includes it; a
   * row that sees no key gets o = 0 and lse = sink. sinks.data == NULL: no sinks. */
  hopattn_tensor sinks;
  /* Added after 0.1.0: softcapping (Gemma 2; hopattn.hpp, ForwardArgs; docs/semantics.md, "Softcap").
   * > 0 caps every score at softcap * tanh(softmax_scale * q.k / softcap); 0 (the default) leaves
   * the scores alone; a negative, NaN or infinite softcap is HOPATTN_ERROR_INVALID_ARGUMENT. */
  float softcap;
  /* Added after 0.1.0: FP8 inputs (hopattn.hpp, ForwardArgs; docs/semantics.md, "FP8"). With q, k, v
   * of HOPATTN_FLOAT8_E4M3, o is float16 or bfloat16 and each of these optional float32
   * (batch, heads_kv) factors scales its input: an element of batch b and KV head g stands for
   * element * descale[b][g] (q's heads take their KV head's). data == NULL: 1. FP8 has no backward. */
  hopattn_tensor q_descale, k_descale, v_descale;
} hopattn_forward_args;

typedef struct hopattn_backward_args {
  size_t struct_size;
  /* q, k, dq, dk end in head_dim; v, o, dout, dv in head_dim_v (v's last dimension). With varlen,
   * rows of dq, dk, dv that no sequence's real tokens cover are set to 0. */
  hopattn_tensor q, k, v, o, lse, dout, dq, dk, dv;
  float softmax_scale;
  int32_t causal;
  int32_t window_left;
  int32_t window_right;
  hopattn_varlen varlen;
  int32_t deterministic;
  /* Added after 0.1.0: the forward's attention sinks (optional float32 (heads,)) and their gradient
   * dsinks, float32 (heads,), written: d loss / d sinks[h], summed over the batch and the query
   * rows. dsinks is required exactly when sinks is given. */
  hopattn_tensor sinks, dsinks;
  /* Added after 0.1.0: the forward's softcap (as in hopattn_forward_args; 0: off). */
  float softcap;
} hopattn_backward_args;

/* Rotary embedding of q and the new keys in hopattn_forward_kvcache (hopattn.hpp, RotaryEmbedding):
 * the first rotary_dim = 2 * cos.shape[1] entries of each head are rotated by pairs. */
typedef struct hopattn_rotary {
  hopattn_tensor cos;          /* (max_position, rotary_dim / 2) of q's dtype; cos.data == NULL: no rotary */
  hopattn_tensor sin;          /* like cos */
  int32_t interleaved;         /* nonzero: pairs (2i, 2i + 1) (GPT-J); 0: (i, i + rotary_dim / 2) (GPT-NeoX) */
  hopattn_int_array positions; /* optional (batch): position of each sequence's first new key;
                                  default cache_seqlens */
} hopattn_rotary;

/* hopattn.hpp's KVCacheArgs, field by field: FlashAttention's flash_attn_with_kvcache. The new
 * keys and values (if any) are written into the cache at cache_seqlens, rotary embedding applied to
 * them and to q (if given), then q attends to each sequence's cache
 * [cache_leftpad[b], cache_seqlens[b] + new keys). See docs/semantics.md, "KV caches". */
typedef struct hopattn_kvcache_args {
  size_t struct_size;
  hopattn_tensor q; /* (batch, seqlen_q, heads, head_dim), or (total_q, heads, head_dim) with cu_seqlens_q */
  /* (cache_rows, capacity, heads_kv, head_dim), or (num_pages, page_size, heads_kv, head_dim) with a
   * page table; updated in place where k_new/v_new are given. v_cache likewise with its own last
   * dimension, head_dim_v. */
  hopattn_tensor k_cache;
  hopattn_tensor v_cache;
  hopattn_page_table page_table;     /* optional: a paged cache */
  hopattn_int_array cache_seqlens;   /* (batch): tokens in each sequence's cache before this call */
  hopattn_int_array cache_batch_idx; /* optional (batch): the cache row (or page table row) of sequence b */
  hopattn_int_array cache_leftpad;   /* optional (batch): first cache position of sequence b */
  /* Optional new keys/values, appended at cache_seqlens[b]: (batch, seqlen_new, heads_kv, head_dim),
   * or (total_new, heads_kv, head_dim) with cu_seqlens_new; v_new ends in head_dim_v. Both or
   * neither. */
  hopattn_tensor k_new;
  hopattn_tensor v_new;
  hopattn_int_array cu_seqlens_new; /* optional (batch + 1) */
  hopattn_rotary rotary;            /* optional; needs k_new/v_new */
  hopattn_int_array cu_seqlens_q;   /* optional (batch + 1): varlen queries (chunked prefill) */
  int32_t max_seqlen_q;             /* with cu_seqlens_q: >= every query sequence's length */
  hopattn_tensor o;                 /* like q but ending in head_dim_v, written */
  hopattn_tensor lse;               /* optional, float32 (batch, heads, seqlen_q) or (heads, total_q), written */
  float softmax_scale;              /* 0 selects 1/sqrt(head_dim) (q's) */
  int32_t causal;
  int32_t window_left;  /* -1: unbounded */
  int32_t window_right; /* -1: unbounded */
  int32_t num_splits;   /* as in hopattn_forward_args */
  int32_t pack_gqa;     /* as in hopattn_forward_args */
  /* Added after 0.1.0: optional float32 (heads,) attention sinks, as in hopattn_forward_args. */
  hopattn_tensor sinks;
  /* Added after 0.1.0: softcapping, as in hopattn_forward_args (0: off). */
  float softcap;
  /* Added after 0.1.0: FP8 caches. With q, k_cache, v_cache (and k_new, v_new) of
   * HOPATTN_FLOAT8_E4M3, o is bfloat16 and these optional float32 (batch, heads_kv) factors scale
   * q, the keys and the values as in hopattn_forward_args. data == NULL: 1. */
  hopattn_tensor q_descale, k_descale, v_descale;
} hopattn_kvcache_args;

/* Sets every field of the caller's struct to its default and struct_size to `size`, the caller's
 * sizeof: a struct from an older header (smaller) gets the fields it has, one from a newer header
 * (larger) zeros past the fields this library knows. Call it through the macros below. */
void hopattn_forward_args_init_sized(hopattn_forward_args* args, size_t size);
void hopattn_backward_args_init_sized(hopattn_backward_args* args, size_t size);
void hopattn_kvcache_args_init_sized(hopattn_kvcache_args* args, size_t size);

/* The first versions' entry points (for programs built against those headers): they set the
 * fields their struct had then, nothing past it. Source code reaches the sized ones above. */
void hopattn_forward_args_init(hopattn_forward_args* args);
void hopattn_backward_args_init(hopattn_backward_args* args);
void hopattn_kvcache_args_init(hopattn_kvcache_args* args);
#define hopattn_forward_args_init(args) hopattn_forward_args_init_sized((args), sizeof(*(args)))
#define hopattn_backward_args_init(args) hopattn_backward_args_init_sized((args), sizeof(*(args)))
#define hopattn_kvcache_args_init(args) hopattn_kvcache_args_init_sized((args), sizeof(*(args)))

/* `stream` is a cudaStream_t (NULL: the legacy default stream). */
int hopattn_forward(const hopattn_forward_args* args, void* stream);
/* Optional workspace that lets the forward balance its tiles across the SMs (see hopattn.hpp). */
int hopattn_forward_workspace_size(const hopattn_forward_args* args, size_t* bytes);
int hopattn_forward_with_workspace(const hopattn_forward_args* args, void* workspace, size_t workspace_bytes,
                                   void* stream);
/* Device workspace that hopattn_forward_kvcache needs for these arguments (may be 0). */
int hopattn_forward_kvcache_workspace_size(const hopattn_kvcache_args* args, size_t* bytes);
/* Appends k_new/v_new to the cache (with rotary embedding), then computes o (and lse). Nothing is
 * launched, and the cache is untouched, when the arguments are rejected. */
int hopattn_forward_kvcache(const hopattn_kvcache_args* args, void* workspace, size_t workspace_bytes, void* stream);
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
