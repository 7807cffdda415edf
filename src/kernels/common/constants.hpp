// Constants more than one kernel needs, spelled once.
#pragma once

namespace hopattn {

// The softmax runs in base 2 (exp2 is one MUFU op): scores and LSE are scaled by log2(e) on the
// way in and by ln(2) on the way out.
inline constexpr float kLog2e = 1.44269504088896340736f;
inline constexpr float kLn2 = 0.69314718055994530942f;

// Shared memory one sm_90 CTA can have after opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr int kMaxSharedBytesPerCta = 227 * 1024;

}  // namespace hopattn
