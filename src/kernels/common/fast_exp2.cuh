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

// exp2 without the MUFU unit, for x <= 0 (softmax exponents), on the FMA and integer pipes: where
// a kernel's exponentials take as long as its GEMMs (the FP8 forward at d128), some of them go
// here instead. x = whole + f with whole = floor(x) (an FADD rounding
// down against 1.5 * 2^23 leaves floor(x) in the low mantissa bits), 2^f on [0, 1) by a degree-3
// polynomial (relative error below 7.5e-5, i.e. 2^-13.7, against e4m3's 2^-4 rounding of P
// that follows; coefficients fitted to the relative error), times 2^whole built in its exponent
// bits. x below -126 gives 0 (masked scores are -inf), as ex2.approx.ftz flushes its denormal
// results; NaN stays NaN (max.NaN, and the product).
CUTE_DEVICE float emulated_exp2(float x) {
  constexpr float kShifter = 12582912.f;  // 1.5 * 2^23: an FADD with it keeps integers in the low bits
  asm("max.NaN.f32 %0, %0, 0fC2FE0000;" : "+f"(x));  // max(x, -127), NaN kept
  const float shifted = __fadd_rd(x, kShifter);
  const float f = x - (shifted - kShifter);  // in [0, 1)
  float p = fmaf(0.07802379876375198f, f, 0.22606685757637024f);
  p = fmaf(p, f, 0.6958343982696533f);
  p = fmaf(p, f, 0.9999250769615173f);
  const int whole = __float_as_int(shifted) - __float_as_int(kShifter);  // in [-127, 0]
  return p * __int_as_float((whole + 127) << 23);  // 2^whole; 0 at -127
}

}  // namespace hopattn
