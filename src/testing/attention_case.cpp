#include "testing/attention_case.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "testing/random_inputs.hpp"

namespace hopattn::testing {
namespace {

constexpr uint16_t kPoison16 = 0xFFFF;       // NaN in both float16 and bfloat16
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;  // NaN in float32

std::vector<int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<int32_t> sums{0};
  for (int n : lengths) sums.push_back(sums.back() + n);
  return sums;
}

DeviceBuffer upload_ints(const std::vector<int32_t>& values) {
  DeviceBuffer buffer(values.size() * sizeof(int32_t));
  if (!values.empty()) buffer.upload(values.data(), buffer.bytes());
  return buffer;
}

}  // namespace

AttentionCase::AttentionCase(const CaseSpec& spec) : spec_(spec) {
  if (spec.row_padding % 8 != 0) throw std::invalid_argument("row_padding must be a multiple of 8");
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
    return random_normal_bits(spec.dtype, size_t(rows(layout) * row_elements(layout)), seed);
  };
  q_bits_ = random_rows(Rows::kQ, 4 * spec.seed + 0);
  k_bits_ = random_rows(Rows::kK, 4 * spec.seed + 1);
  v_bits_ = random_rows(Rows::kV, 4 * spec.seed + 2);
  dout_bits_ = random_rows(Rows::kO, 4 * spec.seed + 3);

  // Scatter the packed rows into the (possibly padded) device rows; padding holds poison.
  auto upload_rows = [&](const std::vector<uint16_t>& bits, Rows layout) {
    DeviceBuffer buffer(row_buffer_bytes(layout));
    const int64_t stride = row_stride(layout);
    const int64_t row_elems = row_elements(layout);
    std::vector<uint16_t> staged(buffer.bytes() / sizeof(uint16_t), kPoison16);
    for (int64_t r = 0; r < rows(layout); ++r) {
      std::memcpy(&staged[r * stride], &bits[r * row_elems], row_elems * sizeof(uint16_t));
    }
    if (!staged.empty()) buffer.upload(staged.data(), buffer.bytes());
    return buffer;
  };
  q_ = upload_rows(q_bits_, Rows::kQ);
  k_ = upload_rows(k_bits_, Rows::kK);
  v_ = upload_rows(v_bits_, Rows::kV);
  dout_ = upload_rows(dout_bits_, Rows::kO);
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

size_t AttentionCase::row_buffer_bytes(Rows layout) const {
  return size_t(rows(layout) * row_stride(layout)) * sizeof(uint16_t);
}

Tensor AttentionCase::row_tensor(void* data, Rows layout) const {
  const int64_t stride = row_stride(layout);
  const int d = dim(layout);
  if (spec_.varlen()) return make_tensor(data, spec_.dtype, {rows(layout), heads(layout), d}, {stride, d, 1});
  const int seqlen = layout == Rows::kQ || layout == Rows::kO ? spec_.seqlen_q : spec_.seqlen_k;
  return make_tensor(data, spec_.dtype, {spec_.batch, seqlen, heads(layout), d}, {seqlen * stride, stride, d, 1});
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

std::vector<double> AttentionCase::input(Field field) const {
  const std::pair<Field, const std::vector<uint16_t>*> inputs[] = {
      {Field::kQ, &q_bits_}, {Field::kK, &k_bits_}, {Field::kV, &v_bits_}, {Field::kDout, &dout_bits_}};
  for (const auto& [which, bits] : inputs) {
    if (which != field) continue;
    std::vector<double> values(bits->size());
    for (size_t e = 0; e < values.size(); ++e) values[e] = bits_value(spec_.dtype, (*bits)[e]);
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
          bits == kPoison16 ? std::numeric_limits<double>::quiet_NaN() : bits_value(spec_.dtype, bits);
    }
    for (int64_t e = row_elems; e < stride; ++e) d.padding_writes += raw[r * stride + e] != kPoison16;
  }
  return d;
}

}  // namespace hopattn::testing
