// Small value helpers of the public API.
#include <cstddef>

#include "hopattn/hopattn.hpp"

namespace hopattn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat8E4M3:
      return "float8_e4m3";
  }
  return "unknown dtype";
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  // A rank above kMaxRank is kept so that validation reports it; only kMaxRank extents are stored.
  t.rank = static_cast<int32_t>(shape.size());
  const int stored = t.rank < Tensor::kMaxRank ? t.rank : Tensor::kMaxRank;
  int d = 0;
  for (int64_t extent : shape) {
    if (d == stored) break;
    t.shape[d++] = extent;
  }
  int64_t stride = 1;
  for (d = stored - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> stride) {
  Tensor t = make_tensor(data, dtype, shape);
  const int stored = t.rank < Tensor::kMaxRank ? t.rank : Tensor::kMaxRank;
  int d = 0;
  for (int64_t s : stride) {
    if (d == stored) break;
    t.stride[d++] = s;
  }
  return t;
}

}  // namespace hopattn
