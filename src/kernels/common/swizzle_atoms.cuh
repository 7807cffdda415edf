// Shared-memory swizzle atoms for WGMMA operands and TMA destinations.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace hopattn {

// The widest shared-memory swizzle atom whose contiguous extent divides `kContiguous` elements:
// wider swizzles spread a WGMMA's and a TMA's accesses over more banks.
template <cute::GMMA::Major kMajor, class Element, int kContiguous>
CUTE_HOST_DEVICE constexpr auto widest_swizzle_atom() {
  using namespace cute::GMMA;
  if constexpr (kMajor == Major::K) {
    if constexpr (kContiguous % decltype(cute::size<1>(Layout_K_SW128_Atom<Element>{}))::value == 0) {
      return Layout_K_SW128_Atom<Element>{};
    } else if constexpr (kContiguous % decltype(cute::size<1>(Layout_K_SW64_Atom<Element>{}))::value == 0) {
      return Layout_K_SW64_Atom<Element>{};
    } else {
      static_assert(kContiguous % decltype(cute::size<1>(Layout_K_SW32_Atom<Element>{}))::value == 0,
                    "the contiguous extent must be a multiple of 16 elements");
      return Layout_K_SW32_Atom<Element>{};
    }
  } else {
    if constexpr (kContiguous % decltype(cute::size<0>(Layout_MN_SW128_Atom<Element>{}))::value == 0) {
      return Layout_MN_SW128_Atom<Element>{};
    } else if constexpr (kContiguous % decltype(cute::size<0>(Layout_MN_SW64_Atom<Element>{}))::value == 0) {
      return Layout_MN_SW64_Atom<Element>{};
    } else {
      static_assert(kContiguous % decltype(cute::size<0>(Layout_MN_SW32_Atom<Element>{}))::value == 0,
                    "the contiguous extent must be a multiple of 16 elements");
      return Layout_MN_SW32_Atom<Element>{};
    }
  }
}

}  // namespace hopattn
