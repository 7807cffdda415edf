#include "testing/tolerance.hpp"

#include <cmath>
#include <sstream>

#include "reference/cpu_reference.hpp"

namespace hopattn::testing {
namespace {

double round_in(DType dtype, double x) {
  if (dtype == DType::kFloat32) return static_cast<double>(static_cast<float>(x));
  return cpu_reference::round_to(cpu_reference::rounding_for(dtype), x);
}

}  // namespace

std::string ErrorReport::str() const {
  std::ostringstream out;
  out << name << ": max error " << error << " vs bound " << multiplier << " * naive " << naive_error << " + atol "
      << atol << " over " << checked << " elements";
  if (nonfinite) out << "; " << nonfinite << " real elements non-finite or unwritten";
  if (wrongly_written) out << "; " << wrongly_written << " elements written that must stay untouched";
  out << (ok ? " [ok]" : " [FAIL]");
  return out.str();
}

double rule_atol(const std::vector<double>& exact, DType dtype) {
  double worst = 0;
  for (double x : exact) {
    if (!std::isfinite(x)) continue;
    const double shifted = round_in(dtype, round_in(dtype, round_in(dtype, x) + 0.3) - 0.3);
    worst = std::fmax(worst, std::fabs(shifted - x));
  }
  return 2 * worst;
}

ErrorReport check_against_reference(const std::string& name, const Downloaded& got, const std::vector<double>& exact,
                                    const std::vector<double>& naive, DType dtype, double multiplier) {
  ErrorReport r;
  r.name = name;
  r.multiplier = multiplier;
  r.atol = rule_atol(exact, dtype);
  r.wrongly_written = got.padding_writes;
  for (size_t e = 0; e < exact.size(); ++e) {
    if (std::isnan(exact[e])) {  // untouched by definition
      r.wrongly_written += !got.untouched[e];
      continue;
    }
    ++r.checked;
    if (std::isinf(exact[e])) {  // LSE of a row that sees no key: must match exactly
      if (got.values[e] != exact[e]) ++r.nonfinite;
      continue;
    }
    if (!std::isfinite(got.values[e])) {
      ++r.nonfinite;
      continue;
    }
    r.error = std::fmax(r.error, std::fabs(got.values[e] - exact[e]));
    if (std::isfinite(naive[e])) r.naive_error = std::fmax(r.naive_error, std::fabs(naive[e] - exact[e]));
  }
  r.ok = r.nonfinite == 0 && r.wrongly_written == 0 && r.error <= multiplier * r.naive_error + r.atol;
  return r;
}

ErrorReport check_float32_sum_against_reference(const std::string& name, const Downloaded& got,
                                                const std::vector<double>& exact, const std::vector<double>& naive) {
  ErrorReport r = check_against_reference(name, got, exact, naive, DType::kFloat32);
  double largest = 0;
  for (double x : exact) {
    if (std::isfinite(x)) largest = std::fmax(largest, std::fabs(x));
  }
  if (largest > 0) r.atol += 4 * std::ldexp(1.0, std::ilogb(largest) - 23);
  r.ok = r.nonfinite == 0 && r.wrongly_written == 0 && r.error <= r.multiplier * r.naive_error + r.atol;
  return r;
}

}  // namespace hopattn::testing
