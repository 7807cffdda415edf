#include "testing/attention_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <utility>

#include "testing/random_inputs.hpp"

namespace hopattn::testing {
namespace {

constexpr uint8_t kPoisonByte = 0xFF;        // bytes of the poison patterns below, and NaN in e4m3
constexpr uint16_t kPoison16 = 0xFFFF;       // NaN in both float16 and bfloat16
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;  // NaN in float32

std::vector<int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<int32_t> sums{0};
  for (int n : lengths) sums.push_back(sums.back() + n);
  return sums;
}

template <typename T>
DeviceBuffer upload_vector(const std::vector<T>& values) {
  DeviceBuffer buffer(values.size() * sizeof(T));
  if (!values.empty()) buffer.upload(values.data(), buffer.bytes());
  return buffer;
}

DeviceBuffer upload_ints(const std::vector<int32_t>& values) { return upload_vector(values); }

// n random inputs of `dtype` as bytes in memory order.
std::vector<uint8_t> random_input_bytes(DType dtype, size_t n, uint64_t seed) {
  if (dtype == DType::kFloat8E4M3) return random_normal_fp8(n, seed);
  const std::vector<uint16_t> bits = random_normal_bits(dtype, n, seed);
  std::vector<uint8_t> bytes(n * sizeof(uint16_t));
  if (n > 0) std::memcpy(bytes.data(), bits.data(), bytes.size());
  return bytes;
}

// Descale factors of one FP8 input, (batch, heads_kv): log-uniform in [1/4, 4), so that inputs
// and products are scaled both ways.
std::vector<float> random_descales(int batch, int heads_kv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-2.0f, 2.0f);
  std::vector<float> factors(size_t(batch) * heads_kv);
  for (float& f : factors) f = std::exp2(exponent(rng));
  return factors;
}

}  // namespace

AttentionCase::AttentionCase(const CaseSpec& spec) : spec_(spec) {
  // Whole 16-byte rows: 8 elements of 16 bits, 16 of FP8.
  if (spec.row_padding % (spec.fp8() ? 16 : 8) != 0) {
    throw std::invalid_argument("row_padding must be a multiple of 8 (16 with FP8 inputs)");
  }
  if (spec.out_dtype() != DType::kBFloat16 && spec.out_dtype() != DType::kFloat16) {
    throw std::invalid_argument("O's dtype must be bf16 or fp16");
  }
  if (spec.head_dim_v < 0) throw std::invalid_argument("head_dim_v must be 0 (head_dim) or a head dim");
  const double scale =
      spec.softmax_scale == kDefaultSoftmaxScale ? 1.0 / std::sqrt(double(spec.head_dim)) : double(spec.softmax_scale);
  const BandMask mask = BandMask::from_args(spec.causal, spec.window_left, spec.window_right);
  if (spec.varlen()) {
    host_.heads = spec.heads;
    host_.heads_kv = spec.heads_kv;
    host_.head_dim = spec.head_dim;
    host_.softmax_scale = scale;
    host_.mask = mask;
    host_.cu_seqlens_q = prefix_sums(spec.varlen_seqlens_q);
    host_.cu_seqlens_k = prefix_sums(spec.varlen_seqlens_k);
    host_.seqused_q.assign(spec.seqused_q.begin(), spec.seqused_q.end());
    host_.seqused_k.assign(spec.seqused_k.begin(), spec.seqused_k.end());
    cu_seqlens_q_ = upload_ints(host_.cu_seqlens_q);
    cu_seqlens_k_ = upload_ints(host_.cu_seqlens_k);
    seqused_q_ = upload_ints(host_.seqused_q);
    seqused_k_ = upload_ints(host_.seqused_k);
  } else {
    host_ = cpu_reference::fixed_length_problem(spec.batch, spec.seqlen_q, spec.seqlen_k, spec.heads, spec.heads_kv,
                                                spec.head_dim, scale, mask);
  }
  host_.head_dim_v = spec.value_dim();
  host_.softcap = spec.softcap;
  if (!spec.sinks.empty()) {
    if (spec.sinks.size() != size_t(spec.heads)) throw std::invalid_argument("sinks: one per query head");
    host_.sinks.assign(spec.sinks.begin(), spec.sinks.end());
    sinks_ = DeviceBuffer(spec.sinks.size() * sizeof(float));
    sinks_.upload(spec.sinks.data(), sinks_.bytes());
  }
  // One seed per input, derived from the case's seed.
  auto random_rows = [&](Rows layout, uint64_t seed) {
    return random_input_bytes(dtype(layout), size_t(rows(layout) * row_elements(layout)), seed);
  };
  q_bytes_ = random_rows(Rows::kQ, 4 * spec.seed + 0);
  k_bytes_ = random_rows(Rows::kK, 4 * spec.seed + 1);
  v_bytes_ = random_rows(Rows::kV, 4 * spec.seed + 2);
  dout_bytes_ = random_rows(Rows::kO, 4 * spec.seed + 3);

  // Scatter the packed rows into the (possibly padded) device rows; padding holds poison.
  auto upload_rows = [&](const std::vector<uint8_t>& bytes, Rows layout) {
    DeviceBuffer buffer(row_buffer_bytes(layout));
    const size_t stride = size_t(row_stride(layout)) * element_bytes(layout);
    const size_t row = size_t(row_elements(layout)) * element_bytes(layout);
    std::vector<uint8_t> staged(buffer.bytes(), kPoisonByte);
    for (int64_t r = 0; r < rows(layout); ++r) std::memcpy(&staged[r * stride], &bytes[r * row], row);
    if (!staged.empty()) buffer.upload(staged.data(), buffer.bytes());
    return buffer;
  };
  q_ = upload_rows(q_bytes_, Rows::kQ);
  k_ = upload_rows(k_bytes_, Rows::kK);
  v_ = upload_rows(v_bytes_, Rows::kV);
  dout_ = upload_rows(dout_bytes_, Rows::kO);

  if (spec.fp8() && spec.fp8_descales) {
    q_descale_ = random_descales(host_.batch(), spec.heads_kv, 4 * spec.seed + 4);
    k_descale_ = random_descales(host_.batch(), spec.heads_kv, 4 * spec.seed + 5);
    v_descale_ = random_descales(host_.batch(), spec.heads_kv, 4 * spec.seed + 6);
    q_descale_buffer_ = upload_vector(q_descale_);
    k_descale_buffer_ = upload_vector(k_descale_);
    v_descale_buffer_ = upload_vector(v_descale_);
  }
}

int64_t AttentionCase::rows(Rows layout) const {
  return layout == Rows::kQ || layout == Rows::kO ? host_.total_q() : host_.total_k();
}
int AttentionCase::heads(Rows layout) const {
  return layout == Rows::kQ || layout == Rows::kO ? spec_.heads : spec_.heads_kv;
}
int AttentionCase::dim(Rows layout) const {
  return layout == Rows::kQ || layout == Rows::kK ? spec_.head_dim : spec_.value_dim();
}
int64_t AttentionCase::row_elements(Rows layout) const { return int64_t{heads(layout)} * dim(layout); }
int64_t AttentionCase::row_stride(Rows layout) const { return row_elements(layout) + spec_.row_padding; }
DType AttentionCase::dtype(Rows layout) const { return layout == Rows::kO ? spec_.out_dtype() : spec_.dtype; }
size_t AttentionCase::element_bytes(Rows layout) const { return dtype(layout) == DType::kFloat8E4M3 ? 1 : 2; }

size_t AttentionCase::row_buffer_bytes(Rows layout) const {
  return size_t(rows(layout) * row_stride(layout)) * element_bytes(layout);
}

Tensor AttentionCase::row_tensor(void* data, Rows layout) const {
  const int64_t stride = row_stride(layout);
  const int d = dim(layout);
  const DType type = dtype(layout);
  if (spec_.varlen()) return make_tensor(data, type, {rows(layout), heads(layout), d}, {stride, d, 1});
  const int seqlen = layout == Rows::kQ || layout == Rows::kO ? spec_.seqlen_q : spec_.seqlen_k;
  return make_tensor(data, type, {spec_.batch, seqlen, heads(layout), d}, {seqlen * stride, stride, d, 1});
}

Tensor AttentionCase::lse_tensor(void* data) const {
  if (spec_.varlen()) return make_tensor(data, DType::kFloat32, {spec_.heads, host_.total_q()});
  return make_tensor(data, DType::kFloat32, {spec_.batch, spec_.heads, spec_.seqlen_q});
}

Varlen AttentionCase::varlen_args() const {
  Varlen v;
  if (!spec_.varlen()) return v;
  const int64_t batch = host_.batch();
  auto array = [](const DeviceBuffer& b, int64_t n) {
    return IntArray{static_cast<const int32_t*>(b.data()), b.data() ? n : 0};
  };
  v.cu_seqlens_q = array(cu_seqlens_q_, batch + 1);
  v.cu_seqlens_k = array(cu_seqlens_k_, batch + 1);
  v.seqused_q = array(seqused_q_, batch);
  v.seqused_k = array(seqused_k_, batch);
  for (int n : spec_.varlen_seqlens_q) v.max_seqlen_q = std::max(v.max_seqlen_q, n);
  for (int n : spec_.varlen_seqlens_k) v.max_seqlen_k = std::max(v.max_seqlen_k, n);
  return v;
}

Outputs AttentionCase::new_outputs() const {
  Outputs out;
  out.o = DeviceBuffer(row_buffer_bytes(Rows::kO));
  out.lse = DeviceBuffer(size_t(host_.total_q()) * spec_.heads * sizeof(float));
  out.dq = DeviceBuffer(row_buffer_bytes(Rows::kQ));
  out.dk = DeviceBuffer(row_buffer_bytes(Rows::kK));
  out.dv = DeviceBuffer(row_buffer_bytes(Rows::kV));
  out.dsinks = DeviceBuffer(size_t(spec_.heads) * sizeof(float));
  for (DeviceBuffer* b : {&out.o, &out.lse, &out.dq, &out.dk, &out.dv, &out.dsinks}) b->fill_bytes(0xFF);
  return out;
}

ForwardArgs AttentionCase::forward_args(const Outputs& out) const {
  ForwardArgs a;
  a.q = row_tensor(q_.data(), Rows::kQ);
  a.k = row_tensor(k_.data(), Rows::kK);
  a.v = row_tensor(v_.data(), Rows::kV);
  a.o = row_tensor(out.o.data(), Rows::kO);
  a.lse = lse_tensor(out.lse.data());
  a.softmax_scale = spec_.softmax_scale;
  a.mask = Mask{spec_.causal, spec_.window_left, spec_.window_right};
  a.varlen = varlen_args();
  a.num_splits = spec_.num_splits;
  a.pack_gqa = spec_.pack_gqa;
  if (!spec_.sinks.empty()) a.sinks = make_tensor(sinks_.data(), DType::kFloat32, {spec_.heads});
  a.softcap = spec_.softcap;
  if (!q_descale_.empty()) {
    const int64_t batch = host_.batch();
    a.q_descale = make_tensor(q_descale_buffer_.data(), DType::kFloat32, {batch, spec_.heads_kv});
    a.k_descale = make_tensor(k_descale_buffer_.data(), DType::kFloat32, {batch, spec_.heads_kv});
    a.v_descale = make_tensor(v_descale_buffer_.data(), DType::kFloat32, {batch, spec_.heads_kv});
  }
  return a;
}

BackwardArgs AttentionCase::backward_args(const Outputs& forward, const Outputs& grads) const {
  const ForwardArgs f = forward_args(forward);
  BackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.o = f.o;
  a.lse = f.lse;
  a.dout = row_tensor(dout_.data(), Rows::kO);
  a.dq = row_tensor(grads.dq.data(), Rows::kQ);
  a.dk = row_tensor(grads.dk.data(), Rows::kK);
  a.dv = row_tensor(grads.dv.data(), Rows::kV);
  a.softmax_scale = f.softmax_scale;
  a.mask = f.mask;
  a.varlen = f.varlen;
  a.sinks = f.sinks;
  a.softcap = f.softcap;
  if (!spec_.sinks.empty()) a.dsinks = make_tensor(grads.dsinks.data(), DType::kFloat32, {spec_.heads});
  return a;
}

double AttentionCase::descale(Field field, int64_t row, int head) const {
  const std::vector<float>* factors = field == Field::kQ   ? &q_descale_
                                      : field == Field::kK ? &k_descale_
                                      : field == Field::kV ? &v_descale_
                                                           : nullptr;
  if (factors == nullptr || factors->empty()) return 1.0;
  const bool query = field == Field::kQ;
  // The sequence holding the row: the last one starting at or before it (empty ones start where
  // the next does).
  const std::vector<int32_t>& starts = query ? host_.cu_seqlens_q : host_.cu_seqlens_k;
  const int64_t batch = std::upper_bound(starts.begin(), starts.end(), row) - starts.begin() - 1;
  const int head_kv = query ? head / (spec_.heads / spec_.heads_kv) : head;
  return (*factors)[size_t(batch) * spec_.heads_kv + head_kv];
}

std::vector<double> AttentionCase::input(Field field) const {
  struct Input {
    Field field;
    const std::vector<uint8_t>* bytes;
    Rows layout;
  };
  const Input inputs[] = {{Field::kQ, &q_bytes_, Rows::kQ},
                          {Field::kK, &k_bytes_, Rows::kK},
                          {Field::kV, &v_bytes_, Rows::kV},
                          {Field::kDout, &dout_bytes_, Rows::kO}};
  for (const Input& in : inputs) {
    if (in.field != field) continue;
    const DType type = dtype(in.layout);
    const int64_t row_elems = row_elements(in.layout);
    const int d = dim(in.layout);
    std::vector<double> values(in.bytes->size() / element_bytes(in.layout));
    for (size_t e = 0; e < values.size(); ++e) {
      double x;
      if (type == DType::kFloat8E4M3) {
        x = fp8_value((*in.bytes)[e]);
      } else {
        uint16_t bits;
        std::memcpy(&bits, &(*in.bytes)[2 * e], sizeof bits);
        x = bits_value(type, bits);
      }
      values[e] = x * descale(field, int64_t(e) / row_elems, int(int64_t(e) % row_elems / d));
    }
    return values;
  }
  throw std::invalid_argument("input(): not an input field");
}

Downloaded AttentionCase::download(const Outputs& out, Field field) const {
  Downloaded d;
  if (field == Field::kDsinks) {  // (heads,) float32
    std::vector<uint32_t> raw(size_t(spec_.heads));
    out.dsinks.download(raw.data(), raw.size() * sizeof(uint32_t));
    for (const uint32_t bits : raw) {
      float value;
      std::memcpy(&value, &bits, sizeof value);
      d.untouched.push_back(bits == kPoison32);
      d.values.push_back(bits == kPoison32 ? std::numeric_limits<double>::quiet_NaN() : value);
    }
    return d;
  }
  if (field == Field::kLse) {
    // Device (batch, heads, seqlen_q) or (heads, total_q); host (heads, total_q).
    std::vector<uint32_t> raw(out.lse.bytes() / sizeof(uint32_t));
    if (!raw.empty()) out.lse.download(raw.data(), out.lse.bytes());
    const int64_t total = host_.total_q();
    d.values.resize(raw.size());
    d.untouched.resize(raw.size());
    for (int h = 0; h < spec_.heads; ++h) {
      for (int64_t r = 0; r < total; ++r) {
        const int64_t device_at = spec_.varlen()
                                      ? h * total + r
                                      : ((r / spec_.seqlen_q) * spec_.heads + h) * spec_.seqlen_q + r % spec_.seqlen_q;
        const uint32_t bits = raw[device_at];
        float value;
        std::memcpy(&value, &bits, sizeof value);
        d.untouched[h * total + r] = bits == kPoison32;
        d.values[h * total + r] = bits == kPoison32 ? std::numeric_limits<double>::quiet_NaN() : value;
      }
    }
    return d;
  }
  struct RowOutput {
    Field field;
    const DeviceBuffer* buffer;
    Rows layout;
  };
  const RowOutput outputs[] = {{Field::kO, &out.o, Rows::kO},
                               {Field::kDq, &out.dq, Rows::kQ},
                               {Field::kDk, &out.dk, Rows::kK},
                               {Field::kDv, &out.dv, Rows::kV}};
  const RowOutput* output = nullptr;
  for (const RowOutput& candidate : outputs) {
    if (candidate.field == field) output = &candidate;
  }
  if (output == nullptr) throw std::invalid_argument("download(): not an output field");
  if (element_bytes(output->layout) != sizeof(uint16_t)) {
    throw std::invalid_argument("download(): FP8 cases have no gradients");  // O is 16-bit
  }
  const DType type = dtype(output->layout);
  const DeviceBuffer* buffer = output->buffer;
  const int64_t n_rows = rows(output->layout);
  const int64_t stride = row_stride(output->layout);
  const int64_t row_elems = row_elements(output->layout);
  std::vector<uint16_t> raw(buffer->bytes() / sizeof(uint16_t));
  if (!raw.empty()) buffer->download(raw.data(), buffer->bytes());
  d.values.resize(size_t(n_rows * row_elems));
  d.untouched.resize(d.values.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t e = 0; e < row_elems; ++e) {
      const uint16_t bits = raw[r * stride + e];
      d.untouched[r * row_elems + e] = bits == kPoison16;
      d.values[r * row_elems + e] =
          bits == kPoison16 ? std::numeric_limits<double>::quiet_NaN() : bits_value(type, bits);
    }
    for (int64_t e = row_elems; e < stride; ++e) d.padding_writes += raw[r * stride + e] != kPoison16;
  }
  return d;
}

}  // namespace hopattn::testing
