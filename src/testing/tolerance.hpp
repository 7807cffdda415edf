// FlashAttention-3's acceptance rule: an implementation's error against a high-precision reference
// is at most `multiplier` times the error of the same computation done naively in the input's low
// precision, plus a small atol. NaN never passes, and elements the reference leaves untouched
// (NaN there) must still hold the poison pattern.
#pragma once

#include <string>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "testing/attention_case.hpp"

namespace hopattn::testing {

struct ErrorReport {
  std::string name;
  double error = 0;        // max |got - exact|
  double naive_error = 0;  // max |naive - exact|
  double atol = 0;
  double multiplier = 2;
  size_t checked = 0;
  size_t nonfinite = 0;        // real elements that came back NaN/inf or unwritten
  size_t wrongly_written = 0;  // elements that must stay untouched but were written
  bool ok = false;

  std::string str() const;
};

// atol of the rule: twice the rounding error of adding and removing 0.3 in `dtype` around the
// reference values (FA3's choice); float32 for LSE.
double rule_atol(const std::vector<double>& exact, DType dtype);

ErrorReport check_against_reference(const std::string& name, const Downloaded& got, const std::vector<double>& exact,
                                    const std::vector<double>& naive, DType dtype, double multiplier = 2.0);

// The rule for a float32 result summed over many float32 terms (dsinks: one per query row). The
// naive reference's error is the rounding of its own summation order, which on a few heads can
// fall well under that of any other order (an fp16 case with 4 heads: 6e-8 against the kernel's
// 2.4e-7, about one float32 ulp of its values); so the bound also admits 4 float32 ulps of the
// largest exact value.
ErrorReport check_float32_sum_against_reference(const std::string& name, const Downloaded& got,
                                                const std::vector<double>& exact, const std::vector<double>& naive);

}  // namespace hopattn::testing
