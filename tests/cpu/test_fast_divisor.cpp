// FastDivisor (fast_divisor.hpp) against the integer division it replaces: every divisor up to
// 4096 and the powers of two around 2^30, dividends from 0 up, around multiples of the divisor
// and at the top of the int range.
#include <gtest/gtest.h>

#include <climits>
#include <vector>

#include "kernels/common/fast_divisor.hpp"

namespace hopattn {
namespace {

void expect_divides(int d, int n) {
  const FastDivisor f(d);
  ASSERT_EQ(f.divide(n), n / d) << n << " / " << d;
  ASSERT_EQ(f.remainder(n), n % d) << n << " % " << d;
}

TEST(FastDivisor, MatchesIntegerDivision) {
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 30; ++k) {
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << k) + delta);
  }
  divisors.push_back(INT_MAX);
  for (int d : divisors) {
    for (int n = 0; n < 300; ++n) expect_divides(d, n);
    for (long long q : {1LL, 2LL, 7LL, 1000LL, 123457LL}) {
      for (int delta : {-1, 0, 1}) {
        const long long n = q * d + delta;
        if (n >= 0 && n <= INT_MAX) expect_divides(d, static_cast<int>(n));
      }
    }
    for (int n = INT_MAX; n > INT_MAX - 300; --n) expect_divides(d, n);
  }
}

// A count of 0 stays 0 (TileScheduler keeps its counts in their divisors); below 0 is 0.
TEST(FastDivisor, DivisorsBelowOneDivideLikeOne) {
  for (int d : {0, -3}) {
    const FastDivisor f(d);
    EXPECT_EQ(f.divisor(), 0);
    EXPECT_EQ(f.divide(12345), 12345);
    EXPECT_EQ(f.remainder(12345), 0);
  }
}

}  // namespace
}  // namespace hopattn
