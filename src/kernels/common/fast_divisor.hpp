// Division by a divisor fixed at launch (heads, key splits, packed rows per query), for the tile
// coordinates that one thread works out at the start of every tile. A 32-bit integer division
// compiles to about 25 dependent instructions around a MUFU reciprocal; this is a multiply-high
// and a shift. The forward's first tile of a decode step waited 2 us for its coordinates, about
// 800 instructions of one thread of which 11 divisions (H100 clock trace, docs/perf-log.md).
//
// The method is the classic one for unsigned division by invariant integers: with
// p = 31 + ceil(log2 d) and m = ceil(2^p / d), floor(n / d) = floor(n * m / 2^p) for every
// n < 2^31, since m * d - 2^p < d bounds the error of n * m / 2^p below 1 / d.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace hopattn {

class FastDivisor {
 public:
  FastDivisor() = default;  // divides by 1
  // d >= 0. A count of 0 (an empty kind of section) is kept as such, so that the divisor can stand
  // for its count; dividing by it divides like 1 (callers never do).
  HOPATTN_HOST_DEVICE explicit FastDivisor(int d) : divisor_(d > 0 ? d : 0) {
    if (divisor_ <= 1) return;  // n * m >> p with p = 31 would need a 33-bit multiplier
    int log2_ceil = 0;
    while ((1LL << log2_ceil) < divisor_) ++log2_ceil;
    const int p = 31 + log2_ceil;
    multiplier_ = static_cast<uint32_t>(((1ULL << p) + divisor_ - 1) / static_cast<unsigned long long>(divisor_));
    shift_ = p - 32;
  }

  HOPATTN_HOST_DEVICE int divisor() const { return divisor_; }

  // n / d and n % d, for 0 <= n < 2^31.
  HOPATTN_HOST_DEVICE int divide(int n) const {
    if (divisor_ <= 1) return n;
#if defined(__CUDA_ARCH__)
    return static_cast<int>(__umulhi(static_cast<uint32_t>(n), multiplier_) >> shift_);
#else
    return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * multiplier_) >> 32 >> shift_);
#endif
  }
  HOPATTN_HOST_DEVICE int remainder(int n) const { return divisor_ <= 1 ? 0 : n - divide(n) * divisor_; }

 private:
  int divisor_ = 1;
  uint32_t multiplier_ = 0;
  int shift_ = 0;
};

}  // namespace hopattn
