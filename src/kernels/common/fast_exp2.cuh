// exp2 as one MUFU.EX2: ex2.approx with denormal results flushed to zero. exp2f() without fast math
// adds a range check and two predicated multiplies per call to keep denormal results, which the
// softmax does not need (a probability below 2^-126 contributes nothing at 16-bit precision).
#pragma once

#include <cute/config.hpp>

namespace hopattn {

CUTE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace hopattn
