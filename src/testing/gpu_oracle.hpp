// Checks results of forward()/backward() with FA3's rule against the float64 GPU reference, using
// the naive low-precision GPU reference for the bound (FP8 inputs: its FP8 computation, S in fp32
// and P in e4m3): for problems too large for the CPU.
#pragma once

#include <vector>

#include "testing/attention_case.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {

struct OracleReports {
  std::vector<ErrorReport> forward;   // O, LSE
  std::vector<ErrorReport> backward;  // dQ, dK, dV (empty when no gradients were given)
};

// `forward_out` holds O and LSE from forward(); `grads` (optional) dQ, dK, dV from the backward
// of that forward.
OracleReports check_with_gpu_oracle(const AttentionCase& c, const Outputs& forward_out, const Outputs* grads);

}  // namespace hopattn::testing
