// Softcapping (ForwardArgs/KVCacheArgs/BackwardArgs::softcap): a negative or non-finite cap gets an
// error naming softcap, through the public API, before anything touches the device, for every
// call. 0 and positive caps pass validation: the internal validator resolves them into the
// Problem, and the public calls go on to the device check (on a machine without a Hopper GPU they
// stop there, which tells them apart from a rejection).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "api/device.hpp"
#include "api/validate.hpp"
#include "hopattn/hopattn.hpp"
#include "validation_args.hpp"

namespace hopattn {
namespace {

using namespace validation_args;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct ForwardLayout {
  const char* name;
  ForwardArgs (*make)();
};
const ForwardLayout kForwardLayouts[] = {
    {"fixed-length", valid_forward}, {"varlen", valid_varlen_forward}, {"paged", valid_paged_forward}};

// The caps validation must refuse, each with the start of its message ("softcap is <value>").
struct BadCap {
  float softcap;
  std::string fragment;
};
const BadCap kBadCaps[] = {
    {-1.0f, "softcap is -1"},
    {-1e-30f, "softcap is -1e-30"},  // however small, a negative cap is a mistake, not "off"
    {std::numeric_limits<float>::quiet_NaN(), "softcap is nan"},
    {kInf, "softcap is inf"},
    {-kInf, "softcap is -inf"},
};
const char kRule[] = " but must be 0 (off) or a positive finite cap";

// 0 is off; everything else positive and finite is a cap, however small or large.
const float kGoodCaps[] = {0.0f, 30.0f, 5.0f, 1e-3f, 1e30f};

// Valid arguments pass validation: without a Hopper GPU the public call reports the device;
// with one it would launch on the fake pointers, so it is not made there.
void expect_device_check(const Status& s) { EXPECT_EQ(s.code(), StatusCode::kDeviceUnavailable) << s.message(); }

TEST(SoftcapValidation, ForwardRejectsNegativeAndNonFiniteCaps) {
  for (const ForwardLayout& layout : kForwardLayouts) {
    for (const BadCap& bad : kBadCaps) {
      SCOPED_TRACE(std::string(layout.name) + ": " + bad.fragment);
      ForwardArgs a = layout.make();
      a.softcap = bad.softcap;
      expect_invalid(forward(a, nullptr), bad.fragment + kRule);
      expect_invalid(forward(a, Workspace{fake(20), size_t{1} << 30}, nullptr), bad.fragment + kRule);
      size_t bytes = 0;
      expect_invalid(forward_workspace_size(a, &bytes), bad.fragment + kRule);  // before the device is asked
    }
  }
}

TEST(SoftcapValidation, KVCacheRejectsNegativeAndNonFiniteCaps) {
  for (const BadCap& bad : kBadCaps) {
    SCOPED_TRACE(bad.fragment);
    KVCacheArgs a = valid_kvcache();
    a.softcap = bad.softcap;
    expect_invalid(forward_kvcache(a, Workspace{fake(20), size_t{1} << 30}, nullptr), bad.fragment + kRule);
    size_t bytes = 0;
    expect_invalid(forward_kvcache_workspace_size(a, &bytes), bad.fragment + kRule);
  }
}

TEST(SoftcapValidation, BackwardRejectsNegativeAndNonFiniteCaps) {
  for (const BadCap& bad : kBadCaps) {
    SCOPED_TRACE(bad.fragment);
    BackwardArgs a = valid_backward();
    a.softcap = bad.softcap;
    expect_invalid(backward(a, Workspace{fake(20), size_t{1} << 30}, nullptr), bad.fragment + kRule);
    size_t bytes = 0;
    expect_invalid(backward_workspace_size(a, &bytes), bad.fragment + kRule);
  }
}

TEST(SoftcapValidation, AcceptsZeroAndPositiveCapsAndPassesThemOn) {
  for (const float cap : kGoodCaps) {
    SCOPED_TRACE(cap);
    Problem p;
    ForwardTensors t;
    for (const ForwardLayout& layout : kForwardLayouts) {
      ForwardArgs a = layout.make();
      a.softcap = cap;
      const Status s = validate_forward(a, &p, &t);
      ASSERT_TRUE(s.ok()) << layout.name << ": " << s.message();
      EXPECT_EQ(p.softcap, cap) << layout.name;
    }
    KVCacheArgs kv = valid_kvcache();
    kv.softcap = cap;
    KVCacheCall call;
    const Status kv_status = validate_kvcache(kv, &call);
    ASSERT_TRUE(kv_status.ok()) << kv_status.message();
    EXPECT_EQ(call.problem.softcap, cap);
    BackwardArgs b = valid_backward();
    b.softcap = cap;
    BackwardTensors bt;
    const Status b_status = validate_backward(b, &p, &bt);
    ASSERT_TRUE(b_status.ok()) << b_status.message();
    EXPECT_EQ(p.softcap, cap);
  }
}

TEST(SoftcapValidation, ValidCapsReachTheDeviceCheck) {
  if (check_current_device().ok()) GTEST_SKIP() << "an sm_90 GPU is present; this test covers machines without one";
  for (const float cap : kGoodCaps) {
    SCOPED_TRACE(cap);
    size_t bytes = 0;
    for (const ForwardLayout& layout : kForwardLayouts) {
      SCOPED_TRACE(layout.name);
      ForwardArgs a = layout.make();
      a.softcap = cap;
      expect_device_check(forward(a, nullptr));
      expect_device_check(forward_workspace_size(a, &bytes));
    }
    KVCacheArgs kv = valid_kvcache();
    kv.softcap = cap;
    expect_device_check(forward_kvcache_workspace_size(kv, &bytes));
    expect_device_check(forward_kvcache(kv, Workspace{fake(20), size_t{1} << 30}, nullptr));
    // The backward's workspace size needs no device: it succeeds anywhere.
    BackwardArgs b = valid_backward();
    b.softcap = cap;
    ASSERT_TRUE(backward_workspace_size(b, &bytes).ok()) << backward_workspace_size(b, &bytes).message();
    expect_device_check(backward(b, Workspace{fake(20), bytes}, nullptr));
  }
}

}  // namespace
}  // namespace hopattn
