// Global-memory views that TMA descriptors are built from: a (tokens, head_dim, heads, batch)
// tensor per RowTensor, with strides that satisfy TMA's rules also where the API leaves them free.
#pragma once

#include <cute/tensor.hpp>

#include <algorithm>
#include <initializer_list>

#include "kernels/common/problem.hpp"

namespace hopattn {

using TmaTokensShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using TmaTokensStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;

// TMA descriptors need every stride to be a multiple of 16 bytes, also for dimensions of extent 1
// whose stride the API leaves free; such a stride is never used, so any valid value will do.
inline int64_t tma_stride(int64_t stride, int64_t extent, int64_t unused_stride) {
  return extent <= 1 ? unused_stride : stride;
}

// A stride that is a multiple of 16 bytes (8 16-bit elements) and spans all the given extents:
// what tma_stride substitutes for unused dimensions.
inline int64_t tma_unused_stride(std::initializer_list<int64_t> extents) {
  return (std::max(extents) + 7) / 8 * 8;
}

// (tokens, head_dim, heads, batch) view of a row tensor; in varlen mode tokens is the packed axis
// and batch has extent 1.
template <class Element>
auto tma_tokens_tensor(const RowTensor& t, int32_t tokens, int32_t head_dim, int32_t heads, int32_t batch,
                       int64_t unused_stride) {
  using namespace cute;
  const TmaTokensStride stride = make_stride(tma_stride(t.row_stride, tokens, unused_stride), _1{},
                                             tma_stride(t.head_stride, heads, unused_stride),
                                             tma_stride(t.batch_stride, batch, unused_stride));
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(t.data)),
                     TmaTokensShape(tokens, head_dim, heads, batch), stride);
}

}  // namespace hopattn
