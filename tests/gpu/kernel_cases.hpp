// The problems the kernel suites (forward and backward) sweep: dtypes x head dims (kernel dims and
// the ones that run zero-padded on the next kernel dim up) x masks x MHA/GQA/MQA x odd seqlen
// pairs, plus long, strided, scaled and varlen special cases.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <ostream>
#include <string>
#include <utility>
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

// A list of named cases whose seeds count up from the first one, one per case in the order added.
class SeededCases {
 public:
  explicit SeededCases(uint64_t first_seed) : next_seed_(first_seed) {}
  void add(std::string name, CaseSpec spec) {
    spec.seed = next_seed_++;
    cases_.push_back({std::move(name), std::move(spec)});
  }
  std::vector<NamedCase> take() { return std::move(cases_); }

 private:
  uint64_t next_seed_;
  std::vector<NamedCase> cases_;
};

// The GPU suites' fixture: every test skips, saying why, without an sm_90 GPU.
class HopperTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// Expects an accuracy report to pass, printing it either way, so that a run's log shows how much
// margin each output has.
void expect_ok(const ErrorReport& r);

// The sweeps' rotating choices: each step takes the next mask of its list and, every other step,
// the next head mode, so that neighbouring combinations appear without a full cross product.
struct MaskChoice {
  const char* name;
  bool causal;
  int left, right;
};
struct HeadChoice {
  const char* name;
  int heads, heads_kv;
};
inline constexpr HeadChoice kSweepHeadModes[] = {{"mha", 4, 4}, {"gqa", 6, 2}, {"mqa", 4, 1}};

// Sets sweep step `rotation`'s mask (from `masks`) and head mode in `s`; returns "<mask>_<heads>"
// for the case's name.
template <size_t kMaskCount>
std::string rotate_mask_and_heads(int rotation, const MaskChoice (&masks)[kMaskCount], CaseSpec& s) {
  const MaskChoice& m = masks[rotation % kMaskCount];
  const HeadChoice& h = kSweepHeadModes[(rotation / 2) % std::size(kSweepHeadModes)];
  s.heads = h.heads;
  s.heads_kv = h.heads_kv;
  s.causal = m.causal;
  s.window_left = m.left;
  s.window_right = m.right;
  return std::string(m.name) + "_" + h.name;
}

// "bf16" or "fp16", as case names spell a 16-bit dtype.
inline std::string dtype_tag(DType dtype) { return dtype == DType::kFloat16 ? "fp16" : "bf16"; }

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
void expect_bitwise_equal(const AttentionCase& c, const Outputs& a, const Outputs& b,
                          std::initializer_list<Field> fields);

// Whether this build compiled a kernel that runs head_dim (and head_dim_v; 0: head_dim) in dtype
// with the softcap variant where softcap > 0 (see HOPATTN_HEADDIMS/DTYPES/SOFTCAP); for a case, its own.
bool built_for(DType dtype, int head_dim, int head_dim_v = 0, float softcap = 0.f);
bool built_for(const CaseSpec& spec);

}  // namespace hopattn::testing
