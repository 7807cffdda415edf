// The setmaxnreg splits the kernels use, and the one that hung the backward.
#include <gtest/gtest.h>

#include "kernels/common/register_split.hpp"

namespace hopattn {
namespace {

TEST(RegisterSplit, ProducerMustReleaseWhatTheConsumersTake) {
  EXPECT_TRUE(register_split_fits(2, 24, 240));   // 384 threads start with 168 each
  EXPECT_FALSE(register_split_fits(2, 32, 240));  // 8 registers per thread short: setmaxnreg.inc waits forever
  EXPECT_TRUE(register_split_fits(2, 32, 232));
  EXPECT_TRUE(register_split_fits(3, 32, 160));   // 512 threads start with 128 each
  EXPECT_FALSE(register_split_fits(3, 24, 168));
}

}  // namespace
}  // namespace hopattn
