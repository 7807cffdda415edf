// The problems the kernel suites (forward and backward) sweep: dtypes x head dims (kernel dims and
// the ones that run zero-padded on the next kernel dim up) x masks x MHA/GQA/MQA x odd seqlen
// pairs, plus long, strided, scaled and varlen special cases.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "hopattn/hopattn.hpp"
#include "testing/attention_case.hpp"
#include "testing/tolerance.hpp"

namespace hopattn::testing {

struct NamedCase {
  std::string name;
  CaseSpec spec;
};
inline void PrintTo(const NamedCase& c, std::ostream* os) { *os << c.name; }

// The GPU suites' fixture: every test skips, saying why, without an sm_90 GPU.
class HopperTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// Expects an accuracy report to pass, printing it either way, so that a run's log shows how much
// margin each output has.
void expect_ok(const ErrorReport& r);

std::vector<NamedCase> sweep_cases();
std::vector<NamedCase> special_cases();

// Captures `call` (given the stream) into a CUDA graph on a side stream, replays it `replays` times
// and waits; returns the status `call` returned during the capture.
Status capture_and_replay(const std::function<Status(cudaStream_t)>& call, int replays);

// forward() of the case into `out` on the default stream, with a workspace sized by
// forward_workspace_size and poisoned first, or without one. Not for concurrent calls (one shared
// workspace).
Status call_forward(const AttentionCase& c, const Outputs& out, bool with_workspace);

// backward() of the forward that wrote `fwd` (its O and LSE) on the case's inputs, into `grads`,
// with a workspace sized by backward_workspace_size and poisoned first (when not capturing, i.e.
// stream == nullptr): nothing a previous call left there may matter.
Status call_backward(const AttentionCase& c, const Outputs& fwd, const Outputs& grads, bool deterministic,
                     cudaStream_t stream = nullptr);

// Expects `fields` of two runs' outputs to hold bitwise the same values.
void expect_bitwise_equal(const AttentionCase& c, const Outputs& a, const Outputs& b, std::initializer_list<Field> fields);

// Whether this build compiled a kernel that runs head_dim (and head_dim_v; 0: head_dim) in dtype
// with the softcap variant where softcap > 0 (see HOPATTN_HEADDIMS/DTYPES/SOFTCAP); for a case, its own.
bool built_for(DType dtype, int head_dim, int head_dim_v = 0, float softcap = 0.f);
bool built_for(const CaseSpec& spec);

}  // namespace hopattn::testing
