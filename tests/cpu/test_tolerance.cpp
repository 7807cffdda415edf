// The accuracy rule's float32-sum variant (dsinks): besides twice the naive reference's error, the
// bound admits 4 float32 ulps of the largest exact value; NaN never passes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testing/tolerance.hpp"

namespace hopattn::testing {
namespace {

Downloaded values(std::vector<double> v) {
  Downloaded d;
  d.untouched.assign(v.size(), false);
  d.values = std::move(v);
  return d;
}

TEST(Tolerance, Float32SumAdmitsFourUlpsOfTheLargestValue) {
  const std::vector<double> exact = {2.0, -1.0, 0.5};
  const double ulp = std::ldexp(1.0, -22);  // float32's at 2
  // The naive reference exact to the bit: the bound is the ulps alone.
  EXPECT_TRUE(check_float32_sum_against_reference("dsinks", values({2.0 + 3 * ulp, -1.0, 0.5}), exact, exact).ok);
  EXPECT_FALSE(check_float32_sum_against_reference("dsinks", values({2.0 + 5 * ulp, -1.0, 0.5}), exact, exact).ok);
  EXPECT_FALSE(check_float32_sum_against_reference("dsinks", values({NAN, -1.0, 0.5}), exact, exact).ok);
  // The plain rule has no such room.
  EXPECT_FALSE(check_against_reference("dsinks", values({2.0 + 3 * ulp, -1.0, 0.5}), exact, exact, DType::kFloat32).ok);
}

}  // namespace
}  // namespace hopattn::testing
