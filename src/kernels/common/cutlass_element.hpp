// The CUTLASS element type of an API dtype, for the kernels' launchers.
#pragma once

#include <cutlass/numeric_types.h>

#include "hopattn/hopattn.hpp"

namespace hopattn {

template <DType kDType>
struct CutlassElement;
template <>
struct CutlassElement<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct CutlassElement<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CutlassElement<DType::kFloat8E4M3> {
  using type = cutlass::float_e4m3_t;
};

}  // namespace hopattn
