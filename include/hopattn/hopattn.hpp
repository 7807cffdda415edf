// hopattn: exact fused attention for NVIDIA Hopper GPUs. Public C++ API.
//
// The core takes device pointers with shapes and strides plus a CUDA stream; it owns no memory and
// depends on no framework. Semantics (masks, GQA, varlen, LSE) are those of docs/semantics.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

// Forward-declared so that this header does not pull in the CUDA runtime headers.
struct CUstream_st;

namespace hopattn {

using Stream = CUstream_st*;  // a cudaStream_t; nullptr is the legacy default stream

enum class DType : int32_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,     // LSE, sinks and FP8 descale factors
  kFloat8E4M3 = 3,  // Q, K and V of the FP8 forward (OCP e4m3, PyTorch's float8_e4m3fn)
};

const char* dtype_name(DType dtype);

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,    // the arguments break a documented rule; the message names it
  kNotSupported = 2,       // valid, but this build or device cannot run it
  kDeviceUnavailable = 3,  // no CUDA device, or not an sm_90 (Hopper) device
  kCudaError = 4,          // the CUDA runtime reported an error
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A strided view of device memory. Strides count elements, not bytes.
struct Tensor {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};
};

// A tensor with the given shape and row-major contiguous strides.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape);
// A tensor with explicit strides (one per dimension).
Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> stride);

// A device array of int32 with its length, so the library can check the length.
struct IntArray {
  const int32_t* data = nullptr;
  int64_t size = 0;
};

// Which keys a query sees. Bottom-right aligned when seqlen_q != seqlen_k:
//   key j is visible to query i iff  i + sk - sq - left <= j <= i + sk - sq + right,
// with -1 meaning unbounded on that side. causal is the same as right = 0.
struct Mask {
  bool causal = false;
  int32_t window_left = -1;
  int32_t window_right = -1;
};

// Variable-length batches: sequences packed along the token axis. Enabled when
// cu_seqlens_q.data is set; then Q/dQ are (total_q, H, d), O/dO (total_q, H, d_v), K/dK are
// (total_k, H_kv, d), V/dV (total_k, H_kv, d_v) and LSE is (H, total_q).
struct Varlen {
  IntArray cu_seqlens_q;     // batch + 1 prefix sums of the query lengths
  IntArray cu_seqlens_k;     // batch + 1 prefix sums of the key lengths
  IntArray seqused_q;        // optional, batch: how many tokens of each query sequence are real
  IntArray seqused_k;        // optional, batch: how many tokens of each key sequence are real
  int32_t max_seqlen_q = 0;  // must be >= every query sequence length
  int32_t max_seqlen_k = 0;  // must be >= every key sequence length

  bool enabled() const { return cu_seqlens_q.data != nullptr || cu_seqlens_k.data != nullptr; }
};

// softmax_scale == 0 selects 1/sqrt(head_dim), Q and K's head dim d.
inline constexpr float kDefaultSoftmaxScale = 0.0f;

// Whether the forward packs the query heads of a GQA group into the rows of one tile, so that
// each K/V block is loaded once for all of them (see docs/semantics.md, "Key splits and packed
// heads"). kAuto packs where that needs fewer tiles (a few query rows per sequence: decode).
enum class PackGqa : int32_t { kAuto = -1, kOff = 0, kOn = 1 };

// A paged KV cache's page table (docs/semantics.md, "KV caches"): K and V are pages of
// (num_pages, page_size, H_kv, d) (d_v for V), and key j of sequence b is row j % page_size of page
// data[b * row_stride + j / page_size]. Any page_size >= 1 works; page sizes that are a multiple
// of the kernel's key block (128 up to d128) load a block with one TMA copy, others gather rows.
// Page indices live on the device: one outside [0, num_pages) is never followed, and the rows of
// its sequence come out NaN.
struct PageTable {
  const int32_t* data = nullptr;  // device memory, (batch, max_pages) int32; null: no paging
  int64_t batch = 0;              // rows: one per sequence (or per cache_batch_idx value)
  int64_t max_pages = 0;          // columns: pages a sequence can own
  int64_t row_stride = 0;         // elements between rows; 0 means max_pages

  bool enabled() const { return data != nullptr; }
};

// Q and K have head dim d, V its own, d_v (its last dimension; V, O, dO and dV have it): each a
// multiple of 8 in [8, 256], d_v smaller than, equal to or larger than d (DeepSeek's MLA: 192, 128).
// FP8 inputs (q, k, v all kFloat8E4M3; docs/semantics.md, "FP8") need d and d_v multiples of 16
// and write O in its own dtype, bf16 or fp16; they have no backward.
struct ForwardArgs {
  Tensor q;    // (batch, seqlen_q, H, d)
  Tensor k;    // (batch, seqlen_k, H_kv, d)
  Tensor v;    // (batch, seqlen_k, H_kv, d_v)
  // Written; in varlen mode without a page table, rows that no sequence's real tokens cover get
  // O = 0 and LSE = -inf.
  Tensor o;    // (batch, seqlen_q, H, d_v)
  Tensor lse;  // fp32 (batch, H, seqlen_q); optional (data == nullptr skips it)
  float softmax_scale = kDefaultSoftmaxScale;
  Mask mask;
  Varlen varlen;
  // How one query tile's keys are spread over the GPU (see docs/semantics.md): 0 lets the library
  // choose, 1 never splits, n > 1 splits them into up to n pieces merged afterwards. Splits need
  // the workspace (forward_workspace_size() counts them); forward() without one never splits.
  // Results agree with the unsplit ones within rounding and are the same on every run.
  int32_t num_splits = 0;
  PackGqa pack_gqa = PackGqa::kAuto;
  // Paged K/V (chunked prefill, docs/semantics.md "KV caches"): with page_table set, k and v are
  // (num_pages, page_size, H_kv, d or d_v) and sequence b's keys are its pages in table order, as many as
  // varlen.seqused_k[b] says (all max_pages * page_size of them without it). Varlen queries then
  // take cu_seqlens_q and seqused_k, with no cu_seqlens_k.
  PageTable page_table;
  // Attention sinks (docs/semantics.md, "Attention sinks"): optional fp32 (H,), one logit per
  // query head added to every row's softmax denominator (not scaled by softmax_scale): O shrinks
  // by the sink's share and LSE includes it; a row that sees no key gets O = 0, LSE = sink.
  Tensor sinks;
  // Softcapping (Gemma 2; docs/semantics.md, "Softcap"): > 0 caps every score at
  // S = softcap * tanh(softmax_scale * q.k / softcap); 0 leaves the scores alone.
  float softcap = 0.0f;
  // Descale factors of FP8 inputs (FlashAttention-3's; docs/semantics.md, "FP8"): optional fp32
  // (batch, H_kv), only with kFloat8E4M3 q, k, v. An element of batch b and KV head g stands for
  // element * descale[b][g]; q's heads take the factor of their KV head, h / (H / H_kv). Absent
  // (data == nullptr): 1.
  Tensor q_descale;
  Tensor k_descale;
  Tensor v_descale;
};

// Rotary position embedding of q and the new keys in forward_kvcache (RoPE). The first
// rotary_dim = 2 * cos.shape[1] entries of each head are rotated, by pairs: (2i, 2i + 1) when
// interleaved (GPT-J), (i, i + rotary_dim / 2) otherwise (GPT-NeoX). The new key number t of
// sequence b takes row positions[b] + t of cos and sin; queries see docs/semantics.md.
struct RotaryEmbedding {
  Tensor cos;  // (max_position, rotary_dim / 2) of q's dtype; cos.data == nullptr: no rotary
  Tensor sin;  // like cos
  bool interleaved = false;
  IntArray positions;  // optional (batch): position of each sequence's first new key; default cache_seqlens

  bool enabled() const { return cos.data != nullptr; }
};

// One attention call against a KV cache, as FlashAttention's flash_attn_with_kvcache: the new
// keys and values (if any) are written into the cache at cache_seqlens, rotary embedding applied
// to them and to q (if given), then q attends to each sequence's cache
// [cache_leftpad[b], cache_seqlens[b] + new keys). See docs/semantics.md, "KV caches".
struct KVCacheArgs {
  Tensor q;  // (batch, seqlen_q, H, d), or (total_q, H, d) with cu_seqlens_q
  // The cache: (batch_cache, capacity, H_kv, d), or (num_pages, page_size, H_kv, d) with a
  // page table, d_v in place of d for v_cache. Updated in place where k_new/v_new are given.
  Tensor k_cache;
  Tensor v_cache;
  PageTable page_table;
  IntArray cache_seqlens;    // (batch): tokens in each sequence's cache before this call
  IntArray cache_batch_idx;  // optional (batch): the cache row (or page table row) of sequence b
  IntArray cache_leftpad;    // optional (batch): first cache position of sequence b (left padding)
  // Optional new keys/values, appended at cache_seqlens[b]: (batch, seqlen_new, H_kv, d), or
  // (total_new, H_kv, d) with cu_seqlens_new (d_v for v_new).
  Tensor k_new;
  Tensor v_new;
  IntArray cu_seqlens_new;  // optional (batch + 1)
  RotaryEmbedding rotary;   // needs k_new
  IntArray cu_seqlens_q;    // optional (batch + 1): varlen queries (chunked prefill)
  int32_t max_seqlen_q = 0; // with cu_seqlens_q: >= every query sequence's length
  Tensor o;    // like q with v_cache's d_v, written
  Tensor lse;  // fp32 (batch, H, seqlen_q) or (H, total_q), written; optional
  float softmax_scale = kDefaultSoftmaxScale;
  Mask mask;
  int32_t num_splits = 0;
  PackGqa pack_gqa = PackGqa::kAuto;
  Tensor sinks;  // optional fp32 (H,): attention sinks, as in ForwardArgs
  float softcap = 0.0f;  // as in ForwardArgs
  // FP8 caches: q, k_cache, v_cache (and k_new, v_new) in float8_e4m3, o bfloat16, with these
  // optional fp32 (batch, H_kv) descale factors as in ForwardArgs (docs/semantics.md, "FP8").
  Tensor q_descale, k_descale, v_descale;
};

struct BackwardArgs {
  Tensor q, k, v;
  Tensor o;     // the forward's output
  Tensor lse;   // the forward's LSE (required)
  Tensor dout;  // like o
  // Gradients, written; in varlen mode rows that no sequence's real tokens cover are set to 0.
  Tensor dq;    // like q
  Tensor dk;    // like k (summed over the query heads of a GQA group)
  Tensor dv;    // like v
  float softmax_scale = kDefaultSoftmaxScale;
  Mask mask;
  Varlen varlen;
  bool deterministic = false;  // bitwise reproducible gradients
  // The forward's attention sinks (optional fp32 (H,)) and their gradient, fp32 (H,), written
  // (required with sinks): d loss / d sink[h], summed over the batch and the query rows.
  Tensor sinks;
  Tensor dsinks;
  float softcap = 0.0f;  // the forward's softcap
};

struct Workspace {
  void* data = nullptr;  // device memory, 16-byte aligned
  size_t bytes = 0;
};

// Computes O (and LSE) on `stream`. Validates all arguments first; nothing is launched on error.
Status forward(const ForwardArgs& args, Stream stream);

// Device workspace with which forward() can run faster (0 when it has no use for one). Without a
// mask, when the query tiles do not fill the GPU's last round of work, the forward splits that
// round's tiles along the keys across all SMs and merges the pieces through this workspace; with a
// mask or variable lengths the SMs take their tiles from a counter in it as they finish. The size
// depends on the arguments and the current device.
Status forward_workspace_size(const ForwardArgs& args, size_t* bytes);

// forward() with a workspace of forward_workspace_size() bytes (or more). Its contents need not be
// initialised; workspace.data == nullptr runs without one. The result is reproducible run to run
// either way, but with and without a workspace the summation order (and the last bits) may differ.
Status forward(const ForwardArgs& args, Workspace workspace, Stream stream);

// Device workspace the backward needs for these arguments (may be 0).
Status backward_workspace_size(const BackwardArgs& args, size_t* bytes);

// Computes dQ, dK, dV on `stream`, using `workspace` (see backward_workspace_size).
Status backward(const BackwardArgs& args, Workspace workspace, Stream stream);

// Device workspace forward_kvcache needs for these arguments (may be 0): the rotated q, each
// sequence's key count after the append, and what forward() would use.
Status forward_kvcache_workspace_size(const KVCacheArgs& args, size_t* bytes);

// Appends k_new/v_new to the cache (with rotary embedding), then computes O (and LSE) on
// `stream`. Validates all arguments first; nothing is launched (and the cache is untouched) on
// error. Safe to capture in a CUDA graph: nothing is read on the host.
Status forward_kvcache(const KVCacheArgs& args, Workspace workspace, Stream stream);

// The head dims of a kernel: Q and K's, and V's (and O's).
struct HeadDimPair {
  int qk = 0;
  int v = 0;
};

// Which specialised kernels this build compiled (CMake HOPATTN_HEADDIMS / HOPATTN_DTYPES). A
// problem runs on the kernel with the fewest head dims (qk + v) that holds both of its own.
struct BuildInfo {
  std::vector<int> head_dims;              // kernels with V's head dim equal to Q/K's
  std::vector<HeadDimPair> kernel_head_dims;  // every kernel: (d, d) for each of head_dims, then pairs
  bool softcap = false;                       // whether each kernel has its softcap variant
  std::vector<DType> dtypes;
  std::string version;
};
BuildInfo build_info();

}  // namespace hopattn
