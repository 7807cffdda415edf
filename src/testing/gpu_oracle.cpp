#include "testing/gpu_oracle.hpp"

#include <stdexcept>

#include "api/validate.hpp"
#include "kernels/common/clear_uncovered_rows.hpp"
#include "kernels/reference/reference_attention.hpp"

namespace hopattn::testing {
namespace {

struct ReferenceRun {
  Outputs fwd;
  Outputs grads;
};

// Runs the GPU reference at `precision`; its backward uses the O and LSE of `api_forward`, the
// same inputs the checked backward saw.
ReferenceRun run_reference(const AttentionCase& c, const Outputs& api_forward, ReferencePrecision precision,
                           bool with_backward) {
  ReferenceRun run{c.new_outputs(), c.new_outputs()};
  Problem problem;
  ForwardTensors forward_tensors;
  if (!validate_forward(c.forward_args(run.fwd), &problem, &forward_tensors).ok()) {
    throw std::logic_error("oracle: case arguments do not validate");
  }
  check_cuda(clear_uncovered_output_rows(problem, forward_tensors, nullptr), "oracle forward");
  check_cuda(reference_forward(problem, forward_tensors, precision, nullptr), "oracle forward");
  if (with_backward) {
    BackwardTensors backward_tensors;
    if (!validate_backward(c.backward_args(api_forward, run.grads), &problem, &backward_tensors).ok()) {
      throw std::logic_error("oracle: backward arguments do not validate");
    }
    DeviceBuffer workspace(reference_backward_workspace_bytes(problem, precision));
    check_cuda(clear_uncovered_gradient_rows(problem, backward_tensors, nullptr), "oracle backward");
    check_cuda(reference_backward(problem, backward_tensors, workspace.data(), precision, nullptr), "oracle backward");
    check_cuda(cudaDeviceSynchronize(), "oracle backward");  // before the workspace is freed
  }
  check_cuda(cudaDeviceSynchronize(), "oracle");
  return run;
}

}  // namespace

OracleReports check_with_gpu_oracle(const AttentionCase& c, const Outputs& forward_out, const Outputs* grads) {
  const bool with_backward = grads != nullptr;
  const ReferenceRun exact = run_reference(c, forward_out, ReferencePrecision::kFloat64, with_backward);
  const ReferenceRun naive = run_reference(c, forward_out, ReferencePrecision::kNaiveLowPrecision, with_backward);
  const DType dtype = c.spec().dtype;  // the gradients' (16-bit inputs only)
  struct Check {
    const char* name;
    Field field;
    bool backward;
    DType dtype;
  };
  const Check checks[] = {{"o", Field::kO, false, c.spec().out_dtype()},
                          {"lse", Field::kLse, false, DType::kFloat32},
                          {"dq", Field::kDq, true, dtype},
                          {"dk", Field::kDk, true, dtype},
                          {"dv", Field::kDv, true, dtype},
                          {"dsinks", Field::kDsinks, true, DType::kFloat32}};
  OracleReports reports;
  for (const Check& check : checks) {
    if (check.backward && !with_backward) continue;
    if (check.field == Field::kDsinks && c.spec().sinks.empty()) continue;
    const Outputs& got = check.backward ? *grads : forward_out;
    const Outputs& want = check.backward ? exact.grads : exact.fwd;
    const Outputs& bound = check.backward ? naive.grads : naive.fwd;
    const Downloaded value = c.download(got, check.field);
    const std::vector<double> exact_values = c.download(want, check.field).values;
    const std::vector<double> naive_values = c.download(bound, check.field).values;
    (check.backward ? reports.backward : reports.forward)
        .push_back(check.field == Field::kDsinks
                       ? check_float32_sum_against_reference(check.name, value, exact_values, naive_values)
                       : check_against_reference(check.name, value, exact_values, naive_values, check.dtype));
  }
  return reports;
}

}  // namespace hopattn::testing
