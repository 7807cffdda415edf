// The C ABI mirrors the C++ API: same rules, same messages, a thread-local last error, and
// structs from older, shorter headers still accepted.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "hopattn/hopattn.h"

namespace {

void* fake(uintptr_t slot) { return reinterpret_cast<void*>(0x100000 + slot * 0x10000); }

hopattn_tensor tensor4(void* data, int dtype, int64_t a, int64_t b, int64_t c, int64_t d) {
  hopattn_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = 4;
  const int64_t shape[4] = {a, b, c, d};
  std::memcpy(t.shape, shape, sizeof shape);
  t.stride[3] = 1;
  for (int i = 2; i >= 0; --i) t.stride[i] = t.stride[i + 1] * t.shape[i + 1];
  return t;
}

hopattn_forward_args forward_args_with_bad_k_dtype() {
  hopattn_forward_args a;
  hopattn_forward_args_init(&a);
  a.q = tensor4(fake(1), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.k = tensor4(fake(2), HOPATTN_FLOAT16, 1, 16, 2, 64);
  a.v = tensor4(fake(3), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.o = tensor4(fake(4), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  return a;
}

TEST(CApi, InitSetsSizeAndDefaults) {
  hopattn_forward_args f;
  std::memset(&f, 0x5A, sizeof f);
  hopattn_forward_args_init(&f);
  EXPECT_EQ(f.struct_size, sizeof f);
  EXPECT_EQ(f.window_left, -1);
  EXPECT_EQ(f.window_right, -1);
  EXPECT_EQ(f.causal, 0);
  EXPECT_EQ(f.softmax_scale, 0.0f);
  EXPECT_EQ(f.q.data, nullptr);
  EXPECT_EQ(f.num_splits, 0);  // the library chooses
  EXPECT_EQ(f.pack_gqa, -1);
  hopattn_backward_args b;
  hopattn_backward_args_init(&b);
  EXPECT_EQ(b.struct_size, sizeof b);
  EXPECT_EQ(b.deterministic, 0);
}

TEST(CApi, ErrorsCarryTheSameMessagesAsCpp) {
  const hopattn_forward_args a = forward_args_with_bad_k_dtype();
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype is float16 but must be bfloat16"), std::string::npos)
      << hopattn_last_error();
}

TEST(CApi, NullAndUninitialisedArgs) {
  EXPECT_EQ(hopattn_forward(nullptr, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(hopattn_last_error(), "args is null");
  hopattn_forward_args a = forward_args_with_bad_k_dtype();
  a.struct_size = 0;
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("hopattn_*_args_init"), std::string::npos);
  hopattn_backward_args b;
  hopattn_backward_args_init(&b);
  size_t bytes = 0;
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("q.rank is 0 but must be 4"), std::string::npos)
      << hopattn_last_error();
  EXPECT_EQ(hopattn_forward_workspace_size(nullptr, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(hopattn_last_error(), "args is null");
  const hopattn_forward_args bad = forward_args_with_bad_k_dtype();
  EXPECT_EQ(hopattn_forward_workspace_size(&bad, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
  EXPECT_EQ(hopattn_forward_with_workspace(&bad, nullptr, 0, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
}

TEST(CApi, ShorterStructFromAnOlderHeaderGetsDefaults) {
  // A caller that knows only the fields up to `softmax_scale`: the mask fields take their defaults.
  hopattn_forward_args a = forward_args_with_bad_k_dtype();
  a.struct_size = offsetof(hopattn_forward_args, causal);
  a.causal = 1;
  a.window_right = 5;  // would contradict causal if it were read
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
}

TEST(CApi, DecodeLayoutFieldsReachTheLibrary) {
  // The options are checked before the other tensors' dtypes, so each error names its field.
  hopattn_forward_args a = forward_args_with_bad_k_dtype();
  a.num_splits = -3;
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("num_splits is -3"), std::string::npos) << hopattn_last_error();
  a.num_splits = 0;
  a.pack_gqa = 9;
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("pack_gqa is 9"), std::string::npos) << hopattn_last_error();
  // A struct from before the fields: they are not read (the defaults apply), whatever the bytes.
  a.struct_size = offsetof(hopattn_forward_args, num_splits);
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
}

TEST(CApi, LastErrorIsThreadLocal) {
  const hopattn_forward_args a = forward_args_with_bad_k_dtype();
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  std::string other;
  std::thread([&] {
    hopattn_forward(nullptr, nullptr);
    other = hopattn_last_error();
  }).join();
  EXPECT_EQ(other, "args is null");
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos);
}

TEST(CApi, Version) { EXPECT_STRNE(hopattn_version(), ""); }

TEST(CApi, BuildCommitNamesTheCode) {
  // 12 hex digits, optionally "-dirty", or "unknown" when built outside a git checkout.
  const std::string commit = hopattn_build_commit();
  if (commit == "unknown") return;
  ASSERT_GE(commit.size(), 12u);
  EXPECT_EQ(commit.find_first_not_of("0123456789abcdef"), 12u == commit.size() ? std::string::npos : 12u);
  EXPECT_TRUE(commit.size() == 12 || commit.substr(12) == "-dirty") << commit;
}

}  // namespace
