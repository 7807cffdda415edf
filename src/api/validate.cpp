#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hopattn {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int64_t kAlignmentBytes = 16;
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
// The Hopper TMA unit takes each global stride as a byte count below 2^40.
constexpr int64_t kTmaStrideLimitBytes = int64_t{1} << 40;

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat8E4M3:
      return 1;
    default:
      return 2;
  }
}

// Head dims are whole 16-byte rows (what TMA copies and the alignment rule below asks of every
// stride): multiples of 8 for 16-bit elements, of 16 for FP8 ones, whose WGMMA also takes K in
// steps of 32 bytes (the kernels zero-pad a head dim to their own, a multiple of 32).
int head_dim_multiple(DType dtype) { return dtype == DType::kFloat8E4M3 ? 16 : 8; }

// The end of a head dim message: which dtype's rule it is, where it is not the usual one.
const char* for_dtype(DType dtype) { return dtype == DType::kFloat8E4M3 ? " for float8_e4m3 inputs" : ""; }

template <typename... Parts>
Status status(StatusCode code, const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return Status(code, out.str());
}

template <typename... Parts>
Status invalid(const Parts&... parts) {
  return status(StatusCode::kInvalidArgument, parts...);
}

template <typename... Parts>
Status not_supported(const Parts&... parts) {
  return status(StatusCode::kNotSupported, parts...);
}

// The shape a tensor must have, and what each dimension is called in messages.
struct ExpectedTensor {
  const char* name;
  int rank;
  int64_t shape[Tensor::kMaxRank];
  const char* dims;  // e.g. "(batch, seqlen_q, heads, head_dim)"
};

// Whether any dimension is 0. Deliberately not a product of the extents: that can overflow int64
// (heads and tokens both near 2^31), and broadcast inputs may legitimately name more elements than that.
bool is_empty(const Tensor& t) {
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return true;
  }
  return false;
}

Status check_pointer(const char* name, const void* data, bool empty, int64_t alignment) {
  if (!empty && data == nullptr) return invalid(name, ".data is null");
  if (reinterpret_cast<uintptr_t>(data) % alignment != 0) {
    return invalid(name, ".data = ", data, " is not ", alignment, "-byte aligned");
  }
  return Status();
}

// "(a, b, c)" of the first `rank` entries, for messages.
std::string tuple(const int64_t* values, int rank) {
  std::ostringstream out;
  out << '(';
  for (int d = 0; d < rank; ++d) out << (d ? ", " : "") << values[d];
  out << ')';
  return out.str();
}

// Every offset a kernel can form from in-range indices, in elements and in bytes, must fit in int64:
// kernels (and the overlap check below) add stride * index terms in 64-bit, and a sum that wraps
// would address memory the caller never meant. Checked for inputs as much as for outputs, and
// for empty tensors too, since a kernel may still form per-batch base offsets for them. Runs after
// the per-stride checks, so every stride of a dimension larger than 1 is already non-negative.
Status check_offsets_fit(const Tensor& t, const char* name, DType dtype) {
  int64_t largest = 0;  // in elements
  bool overflow = false;
  for (int d = 0; d < t.rank && !overflow; ++d) {
    if (t.shape[d] <= 1) continue;  // contributes index 0 only, whatever its stride
    int64_t term = 0;
    overflow =
        __builtin_mul_overflow(t.stride[d], t.shape[d] - 1, &term) || __builtin_add_overflow(largest, term, &largest);
  }
  // The whole layout is named: an overflowing sum is rarely the fault of the dimension it wraps at.
  if (overflow) {
    return invalid(name, ".stride = ", tuple(t.stride, t.rank), " with ", name, ".shape = ", tuple(t.shape, t.rank),
                   ": the largest element offset, the sum of stride[d] * (shape[d] - 1), overflows int64;"
                   " it must fit in int64");
  }
  const int64_t element_bytes = static_cast<int64_t>(dtype_bytes(dtype));
  if (int64_t bytes = 0; __builtin_mul_overflow(largest, element_bytes, &bytes)) {
    return invalid(name, ".stride = ", tuple(t.stride, t.rank), " with ", name, ".shape = ", tuple(t.shape, t.rank),
                   ": the largest element offset is ", largest, ", and its byte offset ", largest, " * ", element_bytes,
                   " overflows int64; it must fit in int64");
  }
  return Status();
}

// An output whose elements share memory would make the result depend on the order of writes:
// sorted by stride, each dimension must start past everything the smaller ones span.
// Needs check_offsets_fit first: the running span then stays below the largest offset + 1, which
// fits, because that offset times the element size does.
Status check_no_self_overlap(const Tensor& t, const char* name) {
  std::vector<std::pair<int64_t, int>> dims;  // (stride, dimension) of dimensions of size > 1
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] > 1) dims.emplace_back(t.stride[d], d);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dimensions already seen
  for (const auto& [stride, d] : dims) {
    if (stride < span) {
      return invalid(name, ".stride[", d, "] is ", stride, ", so ", name,
                     " overlaps itself (its smaller dimensions span ", span,
                     " elements); an output needs its own memory for every element");
    }
    span += stride * (t.shape[d] - 1);
  }
  return Status();
}

// dtype, rank, shape, pointer and strides of one tensor against what the problem needs.
Status check_tensor(const Tensor& t, const ExpectedTensor& want, DType dtype, bool written) {
  if (t.dtype != dtype) {
    return invalid(want.name, ".dtype is ", dtype_name(t.dtype), " but must be ", dtype_name(dtype),
                   dtype == DType::kFloat32 ? "" : " (the dtype of q)");
  }
  if (t.rank != want.rank) {
    return invalid(want.name, ".rank is ", t.rank, " but must be ", want.rank, ": ", want.dims);
  }
  for (int d = 0; d < want.rank; ++d) {
    if (t.shape[d] != want.shape[d]) {
      std::ostringstream expected;
      for (int e = 0; e < want.rank; ++e) expected << (e ? ", " : "") << want.shape[e];
      return invalid(want.name, ".shape[", d, "] is ", t.shape[d], " but must be ", want.shape[d], ": expected ",
                     want.dims, " = (", expected.str(), ")");
    }
  }
  // fp16, bf16 and FP8 tensors are TMA operands; fp32 ones (LSE, sinks, descales) are read per element.
  const bool tma_operand = dtype != DType::kFloat32;
  const int64_t alignment = tma_operand ? kAlignmentBytes : static_cast<int64_t>(dtype_bytes(dtype));
  const bool empty = is_empty(t);
  if (Status s = check_pointer(want.name, t.data, empty, alignment); !s.ok()) return s;
  const int last = want.rank - 1;
  if (t.shape[last] > 1 && t.stride[last] != 1) {
    return invalid(want.name, ".stride[", last, "] is ", t.stride[last],
                   " but the last dimension must be contiguous (stride 1)");
  }
  // TMA needs 16-byte strides below 2^40 bytes; LSE is read and written per row, so it only needs
  // to be contiguous.
  const int64_t element_bytes = static_cast<int64_t>(dtype_bytes(dtype));
  const int64_t stride_multiple = tma_operand ? kAlignmentBytes / element_bytes : 1;
  for (int d = 0; d < last; ++d) {
    if (t.shape[d] <= 1) continue;  // a stride of a size-1 dimension is never used
    if (t.stride[d] < 0) return invalid(want.name, ".stride[", d, "] is ", t.stride[d], " but must not be negative");
    if (t.stride[d] % stride_multiple != 0) {
      return invalid(want.name, ".stride[", d, "] is ", t.stride[d], " but must be a multiple of ", stride_multiple,
                     " elements (16 bytes)");
    }
    // Compared in elements: the stride in bytes may not fit in int64 (it does in uint64, for the message).
    if (tma_operand && t.stride[d] > (kTmaStrideLimitBytes - 1) / element_bytes) {
      return invalid(want.name, ".stride[", d, "] is ", t.stride[d], " elements (",
                     static_cast<uint64_t>(t.stride[d]) * static_cast<uint64_t>(element_bytes),
                     " bytes) but must be below 2^40 bytes (a TMA limit)");
    }
  }
  if (Status s = check_offsets_fit(t, want.name, dtype); !s.ok()) return s;
  // An empty tensor has nothing to overlap (its strides may well be 0, as for a seqlen of 0).
  return written && !empty ? check_no_self_overlap(t, want.name) : Status();
}

Status check_size(const char* what, int64_t value) {
  if (value < 0) return invalid(what, " is ", value, " but must not be negative");
  if (value > kMaxIndex) return invalid(what, " is ", value, " but must be at most 2^31-1");
  return Status();
}

Status check_int_array(const char* name, const IntArray& a, int64_t want_size, bool required) {
  if (a.data == nullptr) {
    if (required) return invalid(name, " is missing (data is null)");
    if (a.size != 0) return invalid(name, ".size is ", a.size, " but data is null");
    return Status();
  }
  if (a.size != want_size) return invalid(name, ".size is ", a.size, " but must be ", want_size);
  if (reinterpret_cast<uintptr_t>(a.data) % alignof(int32_t) != 0) {
    return invalid(name, ".data = ", static_cast<const void*>(a.data), " is not 4-byte aligned");
  }
  return Status();
}

Status resolve_scores(const Mask& mask, float softmax_scale, Problem* p);

// heads, heads_kv and head_dim, from q's dimension q_heads (head_dim after it) and k's k_heads.
Status resolve_heads(const Tensor& q, int q_heads, const Tensor& k, int k_heads, const char* k_name, Problem* p) {
  p->heads = static_cast<int>(q.shape[q_heads]);
  p->heads_kv = static_cast<int>(k.shape[k_heads]);
  p->head_dim = static_cast<int>(q.shape[q_heads + 1]);
  const int multiple = head_dim_multiple(p->dtype);
  if (p->head_dim % multiple != 0 || p->head_dim == 0 || p->head_dim > kMaxHeadDim) {
    return invalid("head_dim (q.shape[", q_heads + 1, "]) is ", p->head_dim, " but must be a multiple of ", multiple,
                   " in [", multiple, ", ", kMaxHeadDim, "]", for_dtype(p->dtype));
  }
  if (p->heads == 0) return invalid("heads (q.shape[", q_heads, "]) is 0 but must be at least 1");
  if (p->heads_kv == 0) return invalid("heads_kv (", k_name, ".shape[", k_heads, "]) is 0 but must be at least 1");
  if (p->heads % p->heads_kv != 0) {
    return invalid("heads (", p->heads, ") must be a multiple of heads_kv (", p->heads_kv, ") for GQA/MQA");
  }
  return Status();
}

// head_dim_v, the last dimension of v (and of o, dout and dv), from a v whose rank is checked: the
// rule of head_dim, whatever the two are to each other (DeepSeek's MLA has 192 for Q/K, 128 for V).
Status resolve_head_dim_v(const Tensor& v, const char* v_name, Problem* p) {
  const int last = v.rank - 1;
  const int64_t head_dim_v = v.shape[last];
  const int multiple = head_dim_multiple(p->dtype);
  if (head_dim_v % multiple != 0 || head_dim_v <= 0 || head_dim_v > kMaxHeadDim) {
    return invalid(v_name, ".shape[", last, "] (head_dim_v) is ", head_dim_v, " but must be a multiple of ", multiple,
                   " in [", multiple, ", ", kMaxHeadDim, "]", for_dtype(p->dtype));
  }
  p->head_dim_v = static_cast<int>(head_dim_v);
  return Status();
}

// Shapes shared by forward and backward: everything Problem holds, taken from q, k, v and varlen.
Status resolve_problem(const Tensor& q, const Tensor& k, const Tensor& v, float softmax_scale, const Mask& mask,
                       const Varlen& varlen, Problem* p) {
  if (q.dtype != DType::kFloat16 && q.dtype != DType::kBFloat16 && q.dtype != DType::kFloat8E4M3) {
    return invalid("q.dtype is ", dtype_name(q.dtype), " but must be float16 or bfloat16 (or, forward only, "
                   "float8_e4m3)");
  }
  p->dtype = q.dtype;
  p->out_dtype = q.dtype;  // FP8 inputs: resolve_output_dtype
  const bool is_varlen = varlen.enabled();
  if (varlen.seqused_q.data != nullptr || varlen.seqused_k.data != nullptr) {
    if (!is_varlen) {
      return invalid(varlen.seqused_q.data ? "varlen.seqused_q" : "varlen.seqused_k",
                     " is given without varlen.cu_seqlens_q/cu_seqlens_k; seqused needs varlen mode");
    }
  }
  const int want_rank = is_varlen ? 3 : 4;
  const char* q_dims = is_varlen ? "(total_q, heads, head_dim)" : "(batch, seqlen_q, heads, head_dim)";
  const char* k_dims = is_varlen ? "(total_k, heads_kv, head_dim)" : "(batch, seqlen_k, heads_kv, head_dim)";
  const char* v_dims = is_varlen ? "(total_k, heads_kv, head_dim_v)" : "(batch, seqlen_k, heads_kv, head_dim_v)";
  if (q.rank != want_rank) return invalid("q.rank is ", q.rank, " but must be ", want_rank, ": ", q_dims);
  if (k.rank != want_rank) return invalid("k.rank is ", k.rank, " but must be ", want_rank, ": ", k_dims);
  if (v.rank != want_rank) return invalid("v.rank is ", v.rank, " but must be ", want_rank, ": ", v_dims);
  static const char* const kQNames[2][4] = {
      {"q.shape[0] (batch)", "q.shape[1] (seqlen_q)", "q.shape[2] (heads)", "q.shape[3] (head_dim)"},
      {"q.shape[0] (total_q)", "q.shape[1] (heads)", "q.shape[2] (head_dim)", ""}};
  static const char* const kKNames[2][4] = {
      {"k.shape[0] (batch)", "k.shape[1] (seqlen_k)", "k.shape[2] (heads_kv)", "k.shape[3] (head_dim)"},
      {"k.shape[0] (total_k)", "k.shape[1] (heads_kv)", "k.shape[2] (head_dim)", ""}};
  for (int d = 0; d < want_rank; ++d) {
    if (Status s = check_size(kQNames[is_varlen][d], q.shape[d]); !s.ok()) return s;
    if (Status s = check_size(kKNames[is_varlen][d], k.shape[d]); !s.ok()) return s;
  }
  const int o = is_varlen ? 1 : 2;  // index of the heads dimension
  if (Status s = resolve_heads(q, o, k, o, "k", p); !s.ok()) return s;
  if (Status s = resolve_head_dim_v(v, "v", p); !s.ok()) return s;

  if (is_varlen) {
    if (varlen.cu_seqlens_q.data == nullptr || varlen.cu_seqlens_k.data == nullptr) {
      return invalid(varlen.cu_seqlens_q.data ? "varlen.cu_seqlens_k" : "varlen.cu_seqlens_q",
                     " is missing: varlen mode needs both cu_seqlens_q and cu_seqlens_k");
    }
    if (varlen.cu_seqlens_q.size < 1) {
      return invalid("varlen.cu_seqlens_q.size is ", varlen.cu_seqlens_q.size, " but must be batch + 1 >= 1");
    }
    const int64_t batch = varlen.cu_seqlens_q.size - 1;
    if (Status s = check_size("batch (varlen.cu_seqlens_q.size - 1)", batch); !s.ok()) return s;
    if (Status s = check_int_array("varlen.cu_seqlens_q", varlen.cu_seqlens_q, batch + 1, true); !s.ok()) return s;
    if (Status s = check_int_array("varlen.cu_seqlens_k", varlen.cu_seqlens_k, batch + 1, true); !s.ok()) return s;
    if (Status s = check_int_array("varlen.seqused_q", varlen.seqused_q, batch, false); !s.ok()) return s;
    if (Status s = check_int_array("varlen.seqused_k", varlen.seqused_k, batch, false); !s.ok()) return s;
    if (Status s = check_size("varlen.max_seqlen_q", varlen.max_seqlen_q); !s.ok()) return s;
    if (Status s = check_size("varlen.max_seqlen_k", varlen.max_seqlen_k); !s.ok()) return s;
    p->batch = static_cast<int>(batch);
    p->max_seqlen_q = varlen.max_seqlen_q;
    p->max_seqlen_k = varlen.max_seqlen_k;
    p->queries = SequenceLayout{varlen.cu_seqlens_q.data, varlen.seqused_q.data, 0, q.shape[0]};
    p->keys = SequenceLayout{varlen.cu_seqlens_k.data, varlen.seqused_k.data, 0, k.shape[0]};
  } else {
    if (k.shape[0] != q.shape[0]) {
      return invalid("k.shape[0] (batch) is ", k.shape[0], " but must equal q.shape[0] (batch) = ", q.shape[0]);
    }
    p->batch = static_cast<int>(q.shape[0]);
    p->max_seqlen_q = static_cast<int>(q.shape[1]);
    p->max_seqlen_k = static_cast<int>(k.shape[1]);
    const int64_t total_q = q.shape[0] * q.shape[1];
    const int64_t total_k = k.shape[0] * k.shape[1];
    if (Status s = check_size("batch * seqlen_q", total_q); !s.ok()) return s;
    if (Status s = check_size("batch * seqlen_k", total_k); !s.ok()) return s;
    p->queries = SequenceLayout{nullptr, nullptr, p->max_seqlen_q, total_q};
    p->keys = SequenceLayout{nullptr, nullptr, p->max_seqlen_k, total_k};
  }

  return resolve_scores(mask, softmax_scale, p);
}

// The mask (simplified against max_seqlen_q/k, which must be set) and the softmax scale.
Status resolve_scores(const Mask& mask, float softmax_scale, Problem* p) {
  if (mask.window_left < -1) return invalid("mask.window_left is ", mask.window_left, " but must be >= -1");
  if (mask.window_right < -1) return invalid("mask.window_right is ", mask.window_right, " but must be >= -1");
  if (mask.causal && mask.window_right > 0) {
    return invalid("mask.causal is set with mask.window_right = ", mask.window_right,
                   ", which contradicts it: causal means window_right = 0 (clear causal for a two-sided window)");
  }
  p->mask = BandMask::from_args(mask.causal, mask.window_left, mask.window_right)
                .without_vacuous_bounds(p->max_seqlen_q, p->max_seqlen_k);

  if (!std::isfinite(softmax_scale)) return invalid("softmax_scale is ", softmax_scale, " but must be finite");
  p->softmax_scale =
      softmax_scale == kDefaultSoftmaxScale ? 1.0f / std::sqrt(static_cast<float>(p->head_dim)) : softmax_scale;
  return Status();
}

// The last dimension of a row tensor: Q, K, dQ and dK have head_dim, V, O, dO and dV head_dim_v.
enum class Width { kHeadDim, kHeadDimV };

// One row per query (q, o, dout, dq) of `heads` heads.
ExpectedTensor expect_q_like(const char* name, const Problem& p, Width width) {
  const bool v = width == Width::kHeadDimV;
  const int64_t dim = v ? p.head_dim_v : p.head_dim;
  if (p.varlen()) {
    return {name, 3, {p.total_q(), p.heads, dim}, v ? "(total_q, heads, head_dim_v)" : "(total_q, heads, head_dim)"};
  }
  return {name, 4, {p.batch, p.max_seqlen_q, p.heads, dim},
          v ? "(batch, seqlen_q, heads, head_dim_v)" : "(batch, seqlen_q, heads, head_dim)"};
}

// One row per key (k, v, dk, dv) of `heads_kv` heads.
ExpectedTensor expect_k_like(const char* name, const Problem& p, Width width) {
  const bool v = width == Width::kHeadDimV;
  const int64_t dim = v ? p.head_dim_v : p.head_dim;
  if (p.varlen()) {
    return {name, 3, {p.total_k(), p.heads_kv, dim},
            v ? "(total_k, heads_kv, head_dim_v)" : "(total_k, heads_kv, head_dim)"};
  }
  return {name, 4, {p.batch, p.max_seqlen_k, p.heads_kv, dim},
          v ? "(batch, seqlen_k, heads_kv, head_dim_v)" : "(batch, seqlen_k, heads_kv, head_dim)"};
}

ExpectedTensor expect_lse(const char* name, const Problem& p) {
  if (p.varlen()) return {name, 2, {p.heads, p.total_q()}, "(heads, total_q)"};
  return {name, 3, {p.batch, p.heads, p.max_seqlen_q}, "(batch, heads, seqlen_q)"};
}

RowTensor row_tensor(const Tensor& t, bool varlen) {
  if (varlen) return RowTensor{t.data, 0, t.stride[0], t.stride[1]};
  return RowTensor{t.data, t.stride[0], t.stride[1], t.stride[2]};
}

RowTensor lse_row_tensor(const Tensor& t, bool varlen) {
  if (varlen) return RowTensor{t.data, 0, t.stride[1], t.stride[0]};
  return RowTensor{t.data, t.stride[0], t.stride[2], t.stride[1]};
}

// Checks each named tensor against its expected shape in order, stopping at the first error.
struct TensorCheck {
  const Tensor* tensor;
  ExpectedTensor expected;
  DType dtype;
  bool written;
};

template <size_t N>
Status check_all(const TensorCheck (&checks)[N]) {
  for (const TensorCheck& c : checks) {
    if (Status s = check_tensor(*c.tensor, c.expected, c.dtype, c.written); !s.ok()) return s;
  }
  return Status();
}

// Softcapping: 0 (off) or a positive, finite cap.
Status resolve_softcap(float softcap, Problem* p) {
  if (!std::isfinite(softcap) || softcap < 0.f) {
    return invalid("softcap is ", softcap, " but must be 0 (off) or a positive finite cap");
  }
  p->softcap = softcap;
  return Status();
}

// Attention sinks (and their gradient): optional fp32 (heads,), one logit per query head.
Status check_sinks(const Tensor& t, const char* name, const Problem& p, bool written, const float** out) {
  if (t.data == nullptr) {
    if (t.rank != 0) return invalid(name, ".data is null but its rank is ", t.rank, "; leave it empty or set data");
    return Status();
  }
  const ExpectedTensor want{name, 1, {p.heads}, "(heads,)"};
  if (Status s = check_tensor(t, want, DType::kFloat32, written); !s.ok()) return s;  // contiguous too
  *out = static_cast<const float*>(t.data);
  return Status();
}

// O's dtype: q's for fp16/bf16 inputs; FP8 inputs write a 16-bit O of the caller's choice (o's).
Status resolve_output_dtype(const Tensor& o, Problem* p) {
  p->out_dtype = p->dtype;
  if (p->dtype != DType::kFloat8E4M3) return Status();
  if (o.dtype != DType::kBFloat16 && o.dtype != DType::kFloat16) {
    return invalid("o.dtype is ", dtype_name(o.dtype),
                   " but must be bfloat16 or float16: float8_e4m3 inputs give a 16-bit output (there is no FP8 "
                   "output)");
  }
  p->out_dtype = o.dtype;
  return Status();
}

// A descale factor of FP8 inputs (q_descale, k_descale, v_descale): optional fp32 (batch, heads_kv),
// the heads contiguous; given only with FP8 inputs. Absent is a default Tensor (no data, rank 0):
// one with a shape is given, even empty (batch 0) and so without data. Its values are read on the
// device, unchecked.
Status check_descale(const Tensor& t, const char* name, const Problem& p, DescaleTensor* out) {
  if (t.data == nullptr && t.rank == 0) return Status();
  if (p.dtype != DType::kFloat8E4M3) {
    return invalid(name, " is given but q.dtype is ", dtype_name(p.dtype),
                   ": descale factors belong to float8_e4m3 inputs only");
  }
  const ExpectedTensor want{name, 2, {p.batch, p.heads_kv}, "(batch, heads_kv)"};
  if (Status s = check_tensor(t, want, DType::kFloat32, false); !s.ok()) return s;
  *out = DescaleTensor{static_cast<const float*>(t.data), t.shape[0] > 1 ? t.stride[0] : 0};
  return Status();
}

// The forward's FP8 arguments: O's dtype and the descale factors (none unless the inputs are FP8).
Status resolve_fp8(const ForwardArgs& a, Problem* p, ForwardTensors* t) {
  if (Status s = resolve_output_dtype(a.o, p); !s.ok()) return s;
  if (Status s = check_descale(a.q_descale, "q_descale", *p, &t->q_descale); !s.ok()) return s;
  if (Status s = check_descale(a.k_descale, "k_descale", *p, &t->k_descale); !s.ok()) return s;
  return check_descale(a.v_descale, "v_descale", *p, &t->v_descale);
}

// Whether any of the tensors holds FP8 elements.
bool any_fp8(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->dtype == DType::kFloat8E4M3) return true;
  }
  return false;
}

// The queries of a call whose keys are a KV cache's: q is (batch, seqlen_q, heads, head_dim), or
// (total_q, heads, head_dim) with cu_seqlens_q. Sets dtype, batch, max_seqlen_q and queries.
// Each argument with the name messages give it (they differ between ForwardArgs and KVCacheArgs).
struct CacheQueries {
  IntArray cu_seqlens;
  const char* cu_seqlens_name = "cu_seqlens_q";
  IntArray seqused;  // optional
  const char* seqused_name = "seqused_q";
  int32_t max_seqlen = 0;
  const char* max_seqlen_name = "max_seqlen_q";
};

Status resolve_cache_queries(const Tensor& q, const CacheQueries& c, Problem* p) {
  if (q.dtype != DType::kFloat16 && q.dtype != DType::kBFloat16 && q.dtype != DType::kFloat8E4M3) {
    return invalid("q.dtype is ", dtype_name(q.dtype), " but must be float16, bfloat16 or float8_e4m3");
  }
  p->dtype = q.dtype;
  p->out_dtype = q.dtype;
  const bool varlen = c.cu_seqlens.data != nullptr;
  const int want_rank = varlen ? 3 : 4;
  if (q.rank != want_rank) {
    return invalid("q.rank is ", q.rank, " but must be ", want_rank, ": ",
                   varlen ? "(total_q, heads, head_dim)" : "(batch, seqlen_q, heads, head_dim)");
  }
  for (int d = 0; d < want_rank; ++d) {
    if (q.shape[d] < 0 || q.shape[d] > kMaxIndex) {
      return invalid("q.shape[", d, "] is ", q.shape[d], " but must be in [0, 2^31-1]");
    }
  }
  if (!varlen) {
    if (c.seqused.data != nullptr) {
      return invalid(c.seqused_name, " is given without ", c.cu_seqlens_name, "; it needs varlen queries");
    }
    p->batch = static_cast<int>(q.shape[0]);
    p->max_seqlen_q = static_cast<int>(q.shape[1]);
    const int64_t total_q = q.shape[0] * q.shape[1];
    if (Status s = check_size("batch * seqlen_q", total_q); !s.ok()) return s;
    p->queries = SequenceLayout{nullptr, nullptr, p->max_seqlen_q, total_q};
    return Status();
  }
  if (c.cu_seqlens.size < 1) {
    return invalid(c.cu_seqlens_name, ".size is ", c.cu_seqlens.size, " but must be batch + 1 >= 1");
  }
  const int64_t batch = c.cu_seqlens.size - 1;
  if (Status s = check_int_array(c.cu_seqlens_name, c.cu_seqlens, batch + 1, true); !s.ok()) return s;
  if (Status s = check_int_array(c.seqused_name, c.seqused, batch, false); !s.ok()) return s;
  if (Status s = check_size(c.max_seqlen_name, c.max_seqlen); !s.ok()) return s;
  p->batch = static_cast<int>(batch);
  p->max_seqlen_q = c.max_seqlen;
  p->queries = SequenceLayout{c.cu_seqlens.data, c.seqused.data, 0, q.shape[0]};
  return Status();
}

// The keys of a KV cache: contiguous, k and v are (cache_rows, capacity, heads_kv, head_dim or
// head_dim_v); paged, (num_pages, page_size, heads_kv, head_dim or head_dim_v) with a page table of
// (rows, max_pages).
// Sequence b reads cache row batch_index[b] (default b) from start[b] (default 0) up to
// lengths[b] (default: the capacity). Sets heads, heads_kv, head_dim, head_dim_v, max_seqlen_k,
// keys and key_cache (queries first).
struct CacheKeys {
  Tensor k;
  const char* k_name = "k_cache";
  Tensor v;
  const char* v_name = "v_cache";
  PageTable table;
  IntArray lengths;
  const char* lengths_name = "cache_seqlens";
  bool lengths_required = true;
  IntArray batch_index;
  const char* batch_index_name = "cache_batch_idx";
  IntArray start;
  const char* start_name = "cache_leftpad";
};

// What the dimensions of a cache's k (head_dim) or v (head_dim_v) are called, for messages.
const char* cache_dims(bool paged, Width width) {
  static const char* const kDims[2][2] = {
      {"(cache_rows, capacity, heads_kv, head_dim)", "(cache_rows, capacity, heads_kv, head_dim_v)"},
      {"(num_pages, page_size, heads_kv, head_dim)", "(num_pages, page_size, heads_kv, head_dim_v)"}};
  return kDims[paged][width == Width::kHeadDimV];
}

Status resolve_cache_keys(const Tensor& q, const CacheKeys& c, Problem* p) {
  const bool paged = c.table.enabled();
  if (c.k.rank != 4) {
    return invalid(c.k_name, ".rank is ", c.k.rank, " but must be 4: ", cache_dims(paged, Width::kHeadDim));
  }
  for (int d = 0; d < 4; ++d) {
    if (c.k.shape[d] < 0 || c.k.shape[d] > kMaxIndex) {
      return invalid(c.k_name, ".shape[", d, "] is ", c.k.shape[d], " but must be in [0, 2^31-1]");
    }
  }
  if (Status s = resolve_heads(q, q.rank - 2, c.k, 2, c.k_name, p); !s.ok()) return s;
  if (c.k.shape[3] != p->head_dim) {
    return invalid(c.k_name, ".shape[3] (head_dim) is ", c.k.shape[3], " but must equal q's head_dim = ", p->head_dim);
  }
  if (c.v.rank != 4) {
    return invalid(c.v_name, ".rank is ", c.v.rank, " but must be 4: ", cache_dims(paged, Width::kHeadDimV));
  }
  if (Status s = resolve_head_dim_v(c.v, c.v_name, p); !s.ok()) return s;
  if (Status s = check_int_array(c.lengths_name, c.lengths, p->batch, c.lengths_required); !s.ok()) return s;
  if (Status s = check_int_array(c.batch_index_name, c.batch_index, p->batch, false); !s.ok()) return s;
  if (Status s = check_int_array(c.start_name, c.start, p->batch, false); !s.ok()) return s;

  KeyCache& cache = p->key_cache;
  cache.batch_index = c.batch_index.data;
  int64_t capacity = 0;
  if (paged) {
    const PageTable& t = c.table;
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(int32_t) != 0) {
      return invalid("page_table", ".data = ", static_cast<const void*>(t.data), " is not 4-byte aligned");
    }
    if (t.batch < 0 || t.batch > kMaxIndex) {
      return invalid("page_table", ".batch is ", t.batch, " but must be in [0, 2^31-1]");
    }
    if (t.max_pages < 1 || t.max_pages > kMaxIndex) {
      return invalid("page_table", ".max_pages is ", t.max_pages, " but must be in [1, 2^31-1]");
    }
    const int64_t row_stride = t.row_stride == 0 ? t.max_pages : t.row_stride;
    if (row_stride < t.max_pages) {
      return invalid("page_table", ".row_stride is ", t.row_stride, " but must be 0 or >= max_pages = ", t.max_pages);
    }
    if (c.batch_index.data != nullptr && t.batch < 1) {
      return invalid("page_table", ".batch (rows) is 0 but must be at least 1 (", c.batch_index_name,
                     " picks a row per sequence)");
    }
    if (c.batch_index.data == nullptr && t.batch != p->batch) {
      return invalid("page_table", ".batch (rows) is ", t.batch, " but must equal batch = ", p->batch,
                     " (one row per sequence)");
    }
    if (int64_t last = 0; __builtin_mul_overflow(t.batch - 1, row_stride, &last) || last > INT64_MAX - t.max_pages) {
      return invalid("page_table", ": batch * row_stride overflows int64");
    }
    if (c.k.shape[0] < 1 || c.k.shape[1] < 1) {
      return invalid(c.k_name, ".shape = ", tuple(c.k.shape, 4), ": num_pages and page_size must be at least 1");
    }
    capacity = t.max_pages * c.k.shape[1];
    if (capacity > kMaxIndex) {
      return invalid("page_table", ".max_pages * page_size = ", capacity, " keys per sequence; must be at most 2^31-1");
    }
    cache.page_table = t.data;
    cache.page_table_stride = row_stride;
    cache.page_size = FastDivisor(static_cast<int>(c.k.shape[1]));
    cache.num_pages = static_cast<int>(c.k.shape[0]);
    cache.max_pages = static_cast<int>(t.max_pages);
    cache.rows = static_cast<int>(t.batch);
    cache.consecutive_pages =
        c.k.stride[0] == c.k.shape[1] * c.k.stride[1] && c.v.stride[0] == c.v.shape[1] * c.v.stride[1];
  } else {
    if (c.batch_index.data != nullptr && c.k.shape[0] < 1) {
      return invalid(c.k_name, ".shape[0] (cache rows) is 0 but must be at least 1 (", c.batch_index_name,
                     " picks a row per sequence)");
    }
    if (c.batch_index.data == nullptr && c.k.shape[0] != p->batch) {
      return invalid(c.k_name, ".shape[0] (cache rows) is ", c.k.shape[0], " but must equal batch = ", p->batch,
                     " (one row per sequence)");
    }
    capacity = c.k.shape[1];
    if (capacity < 1) return invalid(c.k_name, ".shape[1] (capacity) is 0 but must be at least 1");
    cache.rows = static_cast<int>(c.k.shape[0]);
  }
  // k and v alike but for their last dimension.
  const ExpectedTensor k_shape{
      c.k_name, 4, {c.k.shape[0], c.k.shape[1], p->heads_kv, p->head_dim}, cache_dims(paged, Width::kHeadDim)};
  const ExpectedTensor v_shape{
      c.v_name, 4, {c.k.shape[0], c.k.shape[1], p->heads_kv, p->head_dim_v}, cache_dims(paged, Width::kHeadDimV)};
  // Also where they are only read: a cache with broadcast (stride 0) rows would be one whose
  // appends land on each other, and the kernels' gather path assumes distinct rows.
  if (Status s = check_tensor(c.k, k_shape, p->dtype, true); !s.ok()) return s;
  if (Status s = check_tensor(c.v, v_shape, p->dtype, true); !s.ok()) return s;
  p->max_seqlen_k = static_cast<int>(capacity);
  p->keys = SequenceLayout{nullptr, c.lengths.data, static_cast<int>(capacity), c.k.shape[0] * c.k.shape[1]};
  p->keys.start = c.start.data;
  p->keys.capacity_faults = true;
  return Status();
}

RowTensor cache_row_tensor(const Tensor& t) { return RowTensor{t.data, t.stride[0], t.stride[1], t.stride[2]}; }

// Q, O and LSE of a call whose keys are a KV cache's (shapes from the resolved problem).
Status check_cache_call_outputs(const Tensor& q, const Tensor& o, const Tensor& lse, const Problem& p,
                                ForwardTensors* t) {
  const bool v = p.varlen();
  const TensorCheck checks[] = {
      {&q, expect_q_like("q", p, Width::kHeadDim), p.dtype, false},
      // q's dtype, or the 16-bit one that FP8 inputs write (resolve_output_dtype)
      {&o, expect_q_like("o", p, Width::kHeadDimV), p.out_dtype, true},
  };
  if (Status s = check_all(checks); !s.ok()) return s;
  // The simple path that takes broadcast inputs elsewhere knows no KV cache.
  for (int d = 0; d + 1 < q.rank; ++d) {
    if (q.shape[d] > 1 && q.stride[d] == 0) {
      return invalid("q.stride[", d, "] is 0: a call on a KV cache takes no broadcast q (make it contiguous)");
    }
  }
  if (lse.data != nullptr) {
    if (Status s = check_tensor(lse, expect_lse("lse", p), DType::kFloat32, true); !s.ok()) return s;
  }
  t->q = row_tensor(q, v);
  t->o = row_tensor(o, v);
  t->lse = lse.data ? lse_row_tensor(lse, v) : RowTensor{};
  return Status();
}

Status resolve_forward_hints(int32_t num_splits, PackGqa pack_gqa, Problem* p) {
  if (num_splits < 0) return invalid("num_splits is ", num_splits, " but must be >= 0 (0: chosen, 1: no split)");
  const int pack = static_cast<int>(pack_gqa);
  if (pack < -1 || pack > 1) return invalid("pack_gqa is ", pack, " but must be -1 (auto), 0 (off) or 1 (on)");
  p->num_splits = num_splits;
  p->pack_gqa = pack_gqa;
  return Status();
}

// ForwardArgs with a page table: chunked prefill against a paged KV cache.
Status validate_paged_forward(const ForwardArgs& a, Problem* p, ForwardTensors* t) {
  if (any_fp8({&a.q, &a.k, &a.v})) {
    return not_supported("float8_e4m3 inputs with page_table are not supported yet: paged FP8 K/V come with the "
                         "FP8 kernel; call forward() without a page table");
  }
  if (a.varlen.cu_seqlens_k.data != nullptr) {
    return invalid("varlen.cu_seqlens_k is given with page_table; paged keys are located by the page table "
                   "(and counted by varlen.seqused_k), so it must be null");
  }
  CacheQueries queries;
  queries.cu_seqlens = a.varlen.cu_seqlens_q;
  queries.cu_seqlens_name = "varlen.cu_seqlens_q";
  queries.seqused = a.varlen.seqused_q;
  queries.seqused_name = "varlen.seqused_q";
  queries.max_seqlen = a.varlen.max_seqlen_q;
  queries.max_seqlen_name = "varlen.max_seqlen_q";
  if (Status s = resolve_cache_queries(a.q, queries, p); !s.ok()) return s;
  CacheKeys keys;
  keys.k = a.k;
  keys.k_name = "k";
  keys.v = a.v;
  keys.v_name = "v";
  keys.table = a.page_table;
  keys.lengths = a.varlen.seqused_k;
  keys.lengths_name = "varlen.seqused_k";
  keys.lengths_required = false;
  if (Status s = resolve_cache_keys(a.q, keys, p); !s.ok()) return s;
  if (Status s = resolve_scores(a.mask, a.softmax_scale, p); !s.ok()) return s;
  if (Status s = resolve_forward_hints(a.num_splits, a.pack_gqa, p); !s.ok()) return s;
  if (Status s = check_cache_call_outputs(a.q, a.o, a.lse, *p, t); !s.ok()) return s;
  if (Status s = check_sinks(a.sinks, "sinks", *p, false, &t->sinks); !s.ok()) return s;
  if (Status s = resolve_softcap(a.softcap, p); !s.ok()) return s;
  if (Status s = resolve_fp8(a, p, t); !s.ok()) return s;  // names a descale given to 16-bit inputs
  t->k = cache_row_tensor(a.k);
  t->v = cache_row_tensor(a.v);
  return Status();
}

}  // namespace

Status validate_forward(const ForwardArgs& a, Problem* p, ForwardTensors* t) {
  *p = Problem{};
  *t = ForwardTensors{};
  if (a.page_table.enabled()) return validate_paged_forward(a, p, t);
  if (a.page_table.batch != 0 || a.page_table.max_pages != 0 || a.page_table.row_stride != 0) {
    return invalid("page_table.data is null but its shape is (", a.page_table.batch, ", ", a.page_table.max_pages,
                   ") with row_stride ", a.page_table.row_stride,
                   "; set data for paged K/V, or leave the table empty");
  }
  if (Status s = resolve_problem(a.q, a.k, a.v, a.softmax_scale, a.mask, a.varlen, p); !s.ok()) return s;
  if (Status s = resolve_forward_hints(a.num_splits, a.pack_gqa, p); !s.ok()) return s;
  if (Status s = resolve_softcap(a.softcap, p); !s.ok()) return s;
  // q, k and v first, so that an o of the wrong dtype is not blamed on inputs of mixed dtypes.
  const TensorCheck inputs[] = {
      {&a.q, expect_q_like("q", *p, Width::kHeadDim), p->dtype, false},
      {&a.k, expect_k_like("k", *p, Width::kHeadDim), p->dtype, false},
      {&a.v, expect_k_like("v", *p, Width::kHeadDimV), p->dtype, false},
  };
  if (Status s = check_all(inputs); !s.ok()) return s;
  if (Status s = resolve_fp8(a, p, t); !s.ok()) return s;
  if (Status s = check_tensor(a.o, expect_q_like("o", *p, Width::kHeadDimV), p->out_dtype, true); !s.ok()) return s;
  if (a.lse.data != nullptr) {
    if (Status s = check_tensor(a.lse, expect_lse("lse", *p), DType::kFloat32, true); !s.ok()) return s;
  }
  const bool v = p->varlen();
  t->q = row_tensor(a.q, v);
  t->k = row_tensor(a.k, v);
  t->v = row_tensor(a.v, v);
  t->o = row_tensor(a.o, v);
  t->lse = a.lse.data ? lse_row_tensor(a.lse, v) : RowTensor{};
  return check_sinks(a.sinks, "sinks", *p, false, &t->sinks);
}

Status validate_backward(const BackwardArgs& a, Problem* p, BackwardTensors* t) {
  *p = Problem{};
  if (a.q.dtype == DType::kFloat8E4M3) {
    return not_supported("q.dtype is float8_e4m3, which has a forward only: FP8 has no backward (train in bfloat16 "
                         "or float16)");
  }
  if (Status s = resolve_problem(a.q, a.k, a.v, a.softmax_scale, a.mask, a.varlen, p); !s.ok()) return s;
  if (Status s = resolve_softcap(a.softcap, p); !s.ok()) return s;
  const TensorCheck checks[] = {
      {&a.q, expect_q_like("q", *p, Width::kHeadDim), p->dtype, false},
      {&a.k, expect_k_like("k", *p, Width::kHeadDim), p->dtype, false},
      {&a.v, expect_k_like("v", *p, Width::kHeadDimV), p->dtype, false},
      {&a.o, expect_q_like("o", *p, Width::kHeadDimV), p->dtype, false},
      {&a.lse, expect_lse("lse", *p), DType::kFloat32, false},
      {&a.dout, expect_q_like("dout", *p, Width::kHeadDimV), p->dtype, false},
      {&a.dq, expect_q_like("dq", *p, Width::kHeadDim), p->dtype, true},
      {&a.dk, expect_k_like("dk", *p, Width::kHeadDim), p->dtype, true},
      {&a.dv, expect_k_like("dv", *p, Width::kHeadDimV), p->dtype, true},
  };
  if (Status s = check_all(checks); !s.ok()) return s;
  const bool v = p->varlen();
  *t = BackwardTensors{row_tensor(a.q, v),  row_tensor(a.k, v),       row_tensor(a.v, v),
                       row_tensor(a.o, v),  lse_row_tensor(a.lse, v), row_tensor(a.dout, v),
                       row_tensor(a.dq, v), row_tensor(a.dk, v),      row_tensor(a.dv, v)};
  if (Status s = check_sinks(a.sinks, "sinks", *p, false, &t->sinks); !s.ok()) return s;
  const float* dsinks = nullptr;
  if (Status s = check_sinks(a.dsinks, "dsinks", *p, true, &dsinks); !s.ok()) return s;
  if ((t->sinks == nullptr) != (dsinks == nullptr)) {
    return invalid(t->sinks ? "dsinks is missing: with sinks the backward writes their gradient there"
                            : "dsinks is given without sinks");
  }
  t->dsinks = const_cast<float*>(dsinks);
  return Status();
}

// An FP8 KV-cache call: the descales as in forward(), and what the FP8 kernel does not take yet,
// each named (a KV cache's problem has no simple kernel to fall back on).
Status resolve_kvcache_fp8(const KVCacheArgs& a, Problem* p, ForwardTensors* t) {
  if (Status s = check_descale(a.q_descale, "q_descale", *p, &t->q_descale); !s.ok()) return s;
  if (Status s = check_descale(a.k_descale, "k_descale", *p, &t->k_descale); !s.ok()) return s;
  if (Status s = check_descale(a.v_descale, "v_descale", *p, &t->v_descale); !s.ok()) return s;
  if (p->dtype != DType::kFloat8E4M3) return Status();
  const char* later = " with a float8_e4m3 cache is not supported yet";
  if (p->out_dtype != DType::kBFloat16) return not_supported("o.dtype float16", later, ": its kernel writes bfloat16");
  if (a.rotary.enabled()) {
    return not_supported("rotary embedding", later, " (rotate q and the new keys in 16 bits, then quantize them)");
  }
  if (p->softcap > 0.f) return not_supported("softcap", later);
  if (a.cache_leftpad.data != nullptr) return not_supported("cache_leftpad", later);
  if (p->key_cache.paged() && p->key_cache.page_size.divisor() % kFp8KeyBlock != 0) {
    return not_supported("page_size ", p->key_cache.page_size.divisor(), later, ": its kernel loads whole blocks of ",
                         kFp8KeyBlock, " keys, so pages must hold a multiple of ", kFp8KeyBlock);
  }
  return Status();
}

Status validate_kvcache(const KVCacheArgs& a, KVCacheCall* call) {
  *call = KVCacheCall{};
  Problem* p = &call->problem;
  CacheQueries queries;
  queries.cu_seqlens = a.cu_seqlens_q;
  queries.max_seqlen = a.max_seqlen_q;
  if (Status s = resolve_cache_queries(a.q, queries, p); !s.ok()) return s;
  const bool appends = a.k_new.data != nullptr || a.v_new.data != nullptr;
  CacheKeys keys;
  keys.k = a.k_cache;
  keys.v = a.v_cache;
  keys.table = a.page_table;
  keys.lengths = a.cache_seqlens;
  keys.batch_index = a.cache_batch_idx;
  keys.start = a.cache_leftpad;
  if (Status s = resolve_cache_keys(a.q, keys, p); !s.ok()) return s;
  if (Status s = resolve_scores(a.mask, a.softmax_scale, p); !s.ok()) return s;
  if (Status s = resolve_forward_hints(a.num_splits, a.pack_gqa, p); !s.ok()) return s;
  if (Status s = resolve_output_dtype(a.o, p); !s.ok()) return s;
  if (Status s = check_cache_call_outputs(a.q, a.o, a.lse, *p, &call->tensors); !s.ok()) return s;
  call->tensors.k = cache_row_tensor(a.k_cache);
  call->tensors.v = cache_row_tensor(a.v_cache);
  if (Status s = check_sinks(a.sinks, "sinks", *p, false, &call->tensors.sinks); !s.ok()) return s;
  if (Status s = resolve_softcap(a.softcap, p); !s.ok()) return s;
  if (Status s = resolve_kvcache_fp8(a, p, &call->tensors); !s.ok()) return s;

  AppendKVParams& ap = call->append;
  ap.dtype = p->dtype;
  ap.batch = p->batch;
  ap.heads = p->heads;
  ap.heads_kv = p->heads_kv;
  ap.head_dim = p->head_dim;
  ap.head_dim_v = p->head_dim_v;
  ap.k_cache = call->tensors.k;
  ap.v_cache = call->tensors.v;
  ap.cache = p->key_cache;
  ap.capacity = p->keys.fixed_length;
  ap.cache_seqlens = a.cache_seqlens.data;

  // New keys and values: both or neither, like each other.
  if (appends) {
    if (a.k_new.data == nullptr || a.v_new.data == nullptr) {
      return invalid(a.k_new.data ? "v_new" : "k_new", ".data is null but ", a.k_new.data ? "k_new" : "v_new",
                     " is given; new keys and values come together");
    }
    const bool varlen_new = a.cu_seqlens_new.data != nullptr;
    if (varlen_new) {
      if (Status s = check_int_array("cu_seqlens_new", a.cu_seqlens_new, p->batch + 1, true); !s.ok()) return s;
      if (a.k_new.rank != 3) return invalid("k_new.rank is ", a.k_new.rank, " but must be 3: (total_new, heads_kv, head_dim)");
      if (Status s = check_size("k_new.shape[0] (total_new)", a.k_new.shape[0]); !s.ok()) return s;
    } else {
      if (a.k_new.rank != 4) {
        return invalid("k_new.rank is ", a.k_new.rank, " but must be 4: (batch, seqlen_new, heads_kv, head_dim)");
      }
      if (Status s = check_size("k_new.shape[1] (seqlen_new)", a.k_new.shape[1]); !s.ok()) return s;
    }
    // k_new and v_new alike but for their last dimension, which is the cache's.
    const ExpectedTensor want_k =
        varlen_new ? ExpectedTensor{"k_new", 3, {a.k_new.shape[0], p->heads_kv, p->head_dim}, "(total_new, heads_kv, head_dim)"}
                   : ExpectedTensor{"k_new", 4, {p->batch, a.k_new.shape[1], p->heads_kv, p->head_dim},
                                    "(batch, seqlen_new, heads_kv, head_dim)"};
    const ExpectedTensor want_v =
        varlen_new ? ExpectedTensor{"v_new", 3, {a.k_new.shape[0], p->heads_kv, p->head_dim_v},
                                    "(total_new, heads_kv, head_dim_v)"}
                   : ExpectedTensor{"v_new", 4, {p->batch, a.k_new.shape[1], p->heads_kv, p->head_dim_v},
                                    "(batch, seqlen_new, heads_kv, head_dim_v)"};
    if (Status s = check_tensor(a.k_new, want_k, p->dtype, false); !s.ok()) return s;
    if (Status s = check_tensor(a.v_new, want_v, p->dtype, false); !s.ok()) return s;
    ap.k_new = varlen_new ? row_tensor(a.k_new, true) : row_tensor(a.k_new, false);
    ap.v_new = varlen_new ? row_tensor(a.v_new, true) : row_tensor(a.v_new, false);
    ap.cu_seqlens_new = a.cu_seqlens_new.data;
    ap.seqlen_new = varlen_new ? static_cast<int>(std::min<int64_t>(a.k_new.shape[0], kMaxIndex))
                               : static_cast<int>(a.k_new.shape[1]);
    ap.total_new = varlen_new ? a.k_new.shape[0] : static_cast<int64_t>(p->batch) * a.k_new.shape[1];
  } else if (a.cu_seqlens_new.data != nullptr) {
    return invalid("cu_seqlens_new is given without k_new/v_new");
  }

  // Rotary embedding of the new keys and of q.
  const RotaryEmbedding& r = a.rotary;
  if (!r.enabled()) {
    if (r.sin.data != nullptr) return invalid("rotary.sin is given without rotary.cos");
    if (r.positions.data != nullptr) return invalid("rotary.positions is given without rotary.cos/sin");
    return Status();
  }
  if (!appends) {
    return invalid("rotary.cos is given without k_new/v_new: rotary embedding applies to the new keys (and q) "
                   "of an append");
  }
  if (r.cos.rank != 2) return invalid("rotary.cos.rank is ", r.cos.rank, " but must be 2: (max_position, rotary_dim / 2)");
  const int64_t half = r.cos.shape[1];
  if (half < 1 || 2 * half > p->head_dim || (2 * half) % 16 != 0) {
    return invalid("rotary_dim (2 * rotary.cos.shape[1]) is ", 2 * half, " but must be a multiple of 16 in [16, head_dim = ",
                   p->head_dim, "]");
  }
  if (Status s = check_size("rotary.cos.shape[0] (max_position)", r.cos.shape[0]); !s.ok()) return s;
  const ExpectedTensor cos_shape{"rotary.cos", 2, {r.cos.shape[0], half}, "(max_position, rotary_dim / 2)"};
  ExpectedTensor sin_shape = cos_shape;
  sin_shape.name = "rotary.sin";
  if (Status s = check_tensor(r.cos, cos_shape, p->dtype, false); !s.ok()) return s;
  if (Status s = check_tensor(r.sin, sin_shape, p->dtype, false); !s.ok()) return s;
  if (r.cos.shape[0] > 1 && r.sin.stride[0] != r.cos.stride[0]) {
    return invalid("rotary.sin.stride[0] is ", r.sin.stride[0], " but must equal rotary.cos.stride[0] = ", r.cos.stride[0]);
  }
  if (Status s = check_int_array("rotary.positions", r.positions, p->batch, false); !s.ok()) return s;
  ap.rotary_dim = static_cast<int>(2 * half);
  ap.rotary_interleaved = r.interleaved;
  ap.rotary_cos = r.cos.data;
  ap.rotary_sin = r.sin.data;
  ap.rotary_row_stride = r.cos.shape[0] > 1 ? r.cos.stride[0] : half;
  ap.rotary_positions = static_cast<int>(r.cos.shape[0]);
  ap.rotary_start = r.positions.data;
  ap.q = call->tensors.q;
  ap.cu_seqlens_q = a.cu_seqlens_q.data;
  ap.seqlen_q = p->max_seqlen_q;
  ap.total_q = p->total_q();
  // FlashAttention's rule: under a causal or local mask query i sits at position start + i;
  // without one every query is at the position of the first new key.
  ap.q_positions_per_row = a.mask.causal || a.mask.window_left >= 0 || a.mask.window_right >= 0;
  return Status();
}

Status validate_workspace(const Workspace& w, size_t required, const char* call) {
  if (required == 0) return Status();
  if (w.data == nullptr) {
    return invalid("workspace.data is null but this ", call, " needs ", required, " bytes (see ", call,
                   "_workspace_size)");
  }
  if (w.bytes < required) {
    return invalid("workspace.bytes is ", w.bytes, " but this ", call, " needs ", required, " bytes (see ", call,
                   "_workspace_size)");
  }
  if (reinterpret_cast<uintptr_t>(w.data) % kAlignmentBytes != 0) {
    return invalid("workspace.data = ", w.data, " is not 16-byte aligned");
  }
  return Status();
}

}  // namespace hopattn
