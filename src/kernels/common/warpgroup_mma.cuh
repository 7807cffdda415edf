// Register-fragment helpers around WGMMA shared by the kernels: issuing a whole warpgroup GEMM as
// one committed batch, and converting accumulator fragments to 16-bit operands.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include <type_traits>

namespace hopattn {

// Issues one warpgroup GEMM (all K-steps) and commits it as one batch; the caller waits.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
CUTE_DEVICE void issue_warpgroup_gemm(TiledMma& mma, TensorA const& a, TensorB const& b, TensorC& c) {
  using namespace cute;
  // A comes from registers (P) or from shared memory through WGMMA descriptors (Q).
  constexpr bool kARegisters = !std::is_same_v<typename TensorA::engine_type::iterator, GMMA::DescriptorIterator>;
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
}

template <class FragmentIn, class FragmentOut>
CUTE_DEVICE void convert_fragment(FragmentIn const& in, FragmentOut& out) {
  using From = typename FragmentIn::value_type;
  using To = typename FragmentOut::value_type;
  constexpr int N = decltype(cute::size(in))::value;
  static_assert(N == decltype(cute::size(out))::value, "fragments must have the same size");
  cutlass::NumericArrayConverter<To, From, N> convert;
  *reinterpret_cast<cutlass::Array<To, N>*>(cute::raw_pointer_cast(out.data())) =
      convert(*reinterpret_cast<cutlass::Array<From, N> const*>(cute::raw_pointer_cast(in.data())));
}

}  // namespace hopattn
