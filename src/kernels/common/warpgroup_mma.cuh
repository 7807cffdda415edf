// Register-fragment helpers around WGMMA shared by the kernels: issuing a whole warpgroup GEMM as
// one committed batch, and converting accumulator fragments to 16-bit operands.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include <type_traits>

namespace hopattn {

// Operand tensor of K-step k. A shared-memory operand's descriptor is formed as one 64-bit add to
// the operand's base descriptor: CuTe's iterator adds to the low word and copies the high one,
// and ptxas then rewrote the constant high words before every HGMMA (1.9 UMOV per HGMMA in the
// d64 backward against FlashAttention-4's 0.7, whose descriptors come from 64-bit adds). Alone
// level in speed; with the backward's position-independent score stores, d64 backward +5-6% (H100).
template <class Operand>
CUTE_DEVICE auto k_step_operand(Operand const& operand, int k) {
  using namespace cute;
  if constexpr (std::is_same_v<typename Operand::engine_type::iterator, GMMA::DescriptorIterator>) {
    auto step = operand(_, _, k);
    const int32_t offset = static_cast<int32_t>(step.data().desc_.reg32_[0] - operand.data().desc_.reg32_[0]);
    return make_tensor(GMMA::DescriptorIterator{GmmaDescriptor{operand.data().desc_.desc_ + int64_t{offset}}},
                       step.layout());
  } else {
    return operand(_, _, k);
  }
}

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
    gemm(mma, k_step_operand(a, k), k_step_operand(b, k), c);
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
