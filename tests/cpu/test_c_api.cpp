// The C ABI mirrors the C++ API: same rules, same messages, a thread-local last error, and
// structs from older, shorter headers still accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

#include "hopattn/hopattn.h"

namespace {

void* fake(uintptr_t slot) { return reinterpret_cast<void*>(0x100000 + slot * 0x10000); }

// A contiguous tensor of the given shape.
hopattn_tensor tensor(void* data, int dtype, std::initializer_list<int64_t> shape) {
  hopattn_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  std::copy(shape.begin(), shape.end(), t.shape);
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.stride[i] = stride;
    stride *= t.shape[i];
  }
  return t;
}

hopattn_tensor tensor4(void* data, int dtype, int64_t a, int64_t b, int64_t c, int64_t d) {
  return tensor(data, dtype, {a, b, c, d});
}

hopattn_tensor tensor2(void* data, int dtype, int64_t a, int64_t b) { return tensor(data, dtype, {a, b}); }

hopattn_forward_args forward_args_with_bad_k_dtype() {
  hopattn_forward_args a;
  hopattn_forward_args_init(&a);
  a.q = tensor4(fake(1), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.k = tensor4(fake(2), HOPATTN_FLOAT16, 1, 16, 2, 64);
  a.v = tensor4(fake(3), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.o = tensor4(fake(4), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  return a;
}

// A backward that validation accepts, and whose workspace size needs no device: GQA 2/1.
hopattn_backward_args valid_backward_args() {
  hopattn_backward_args a;
  hopattn_backward_args_init(&a);
  a.q = tensor4(fake(1), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.k = tensor4(fake(2), HOPATTN_BFLOAT16, 1, 16, 1, 64);
  a.v = tensor4(fake(3), HOPATTN_BFLOAT16, 1, 16, 1, 64);
  a.o = tensor4(fake(4), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.lse = tensor(fake(5), HOPATTN_FLOAT32, {1, 2, 16});
  a.dout = tensor4(fake(6), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.dq = tensor4(fake(7), HOPATTN_BFLOAT16, 1, 16, 2, 64);
  a.dk = tensor4(fake(8), HOPATTN_BFLOAT16, 1, 16, 1, 64);
  a.dv = tensor4(fake(9), HOPATTN_BFLOAT16, 1, 16, 1, 64);
  return a;
}

hopattn_int_array int_array(uintptr_t slot, int64_t size) {
  return hopattn_int_array{static_cast<const int32_t*>(fake(slot)), size};
}

// A decode step that validation accepts: 2 sequences, one query each, a contiguous cache of 256.
hopattn_kvcache_args valid_kvcache_args() {
  hopattn_kvcache_args a;
  hopattn_kvcache_args_init(&a);
  a.q = tensor4(fake(1), HOPATTN_BFLOAT16, 2, 1, 4, 64);
  a.k_cache = tensor4(fake(2), HOPATTN_BFLOAT16, 2, 256, 2, 64);
  a.v_cache = tensor4(fake(3), HOPATTN_BFLOAT16, 2, 256, 2, 64);
  a.o = tensor4(fake(4), HOPATTN_BFLOAT16, 2, 1, 4, 64);
  a.cache_seqlens = int_array(5, 2);
  return a;
}

std::string kvcache_error(const hopattn_kvcache_args& a) {
  EXPECT_EQ(hopattn_forward_kvcache(&a, fake(20), size_t{1} << 30, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  const std::string message = hopattn_last_error();
  size_t bytes = 0;
  EXPECT_EQ(hopattn_forward_kvcache_workspace_size(&a, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(message, hopattn_last_error()) << "the workspace query must validate the same way";
  return message;
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
  EXPECT_EQ(f.page_table.data, nullptr);
  EXPECT_EQ(f.page_table.batch, 0);
  EXPECT_EQ(f.page_table.max_pages, 0);
  EXPECT_EQ(f.page_table.row_stride, 0);
  EXPECT_EQ(f.sinks.data, nullptr);  // no sinks
  EXPECT_EQ(f.sinks.rank, 0);
  EXPECT_EQ(f.softcap, 0.0f);  // no softcapping
  for (const hopattn_tensor* descale : {&f.q_descale, &f.k_descale, &f.v_descale}) {
    EXPECT_EQ(descale->data, nullptr);  // factors of 1
    EXPECT_EQ(descale->rank, 0);
  }
  hopattn_backward_args b;
  std::memset(&b, 0x5A, sizeof b);
  hopattn_backward_args_init(&b);
  EXPECT_EQ(b.struct_size, sizeof b);
  EXPECT_EQ(b.deterministic, 0);
  EXPECT_EQ(b.window_left, -1);
  EXPECT_EQ(b.sinks.data, nullptr);
  EXPECT_EQ(b.sinks.rank, 0);
  EXPECT_EQ(b.dsinks.data, nullptr);
  EXPECT_EQ(b.dsinks.rank, 0);
  EXPECT_EQ(b.softcap, 0.0f);
  hopattn_kvcache_args c;
  std::memset(&c, 0x5A, sizeof c);
  hopattn_kvcache_args_init(&c);
  EXPECT_EQ(c.struct_size, sizeof c);
  EXPECT_EQ(c.softmax_scale, 0.0f);
  EXPECT_EQ(c.causal, 0);
  EXPECT_EQ(c.window_left, -1);
  EXPECT_EQ(c.window_right, -1);
  EXPECT_EQ(c.num_splits, 0);
  EXPECT_EQ(c.pack_gqa, -1);
  EXPECT_EQ(c.max_seqlen_q, 0);
  EXPECT_EQ(c.page_table.data, nullptr);
  EXPECT_EQ(c.cache_seqlens.data, nullptr);
  EXPECT_EQ(c.k_new.data, nullptr);
  EXPECT_EQ(c.rotary.cos.data, nullptr);
  EXPECT_EQ(c.rotary.interleaved, 0);
  EXPECT_EQ(c.rotary.positions.size, 0);
  EXPECT_EQ(c.sinks.data, nullptr);
  EXPECT_EQ(c.sinks.rank, 0);
  EXPECT_EQ(c.softcap, 0.0f);
  hopattn_kvcache_args_init_sized(nullptr, sizeof(hopattn_kvcache_args));  // ignored, like the other init functions
}

// A program built against the first header calls the unsized init with a struct of that header's
// size: nothing past it may be written. A struct from a newer header gets zeros past the fields
// this library knows.
TEST(CApi, InitWritesOnlyTheCallersStruct) {
  struct Guarded {
    hopattn_forward_args args;
    unsigned char guard[64];
  } g;
  std::memset(&g, 0x5A, sizeof(g));
  (hopattn_forward_args_init)(&g.args);  // the exported 0.1.0 entry point, not the header's macro
  const size_t first = offsetof(hopattn_forward_args, num_splits);
  EXPECT_EQ(g.args.struct_size, first);
  EXPECT_EQ(g.args.window_left, -1);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&g);
  for (size_t i = first; i < sizeof(g); ++i) ASSERT_EQ(bytes[i], 0x5A) << "byte " << i << " written";
  std::memset(&g, 0x5A, sizeof(g));
  hopattn_forward_args_init_sized(&g.args, sizeof(g));  // a newer header's larger struct
  EXPECT_EQ(g.args.struct_size, sizeof(g));
  EXPECT_EQ(g.args.pack_gqa, -1);
  for (size_t i = 0; i < sizeof(g.guard); ++i) ASSERT_EQ(g.guard[i], 0) << "guard byte " << i;
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

TEST(CApi, PageTableReachesTheLibraryAndOlderStructsGetNone) {
  hopattn_forward_args a = forward_args_with_bad_k_dtype();
  a.page_table = hopattn_page_table{static_cast<const int32_t*>(fake(9)), 1, 8, 4};
  a.varlen.cu_seqlens_k = int_array(10, 2);
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("varlen.cu_seqlens_k is given with page_table"), std::string::npos)
      << hopattn_last_error();
  a.varlen.cu_seqlens_k = hopattn_int_array{nullptr, 0};
  a.k.dtype = HOPATTN_BFLOAT16;
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("page_table.row_stride is 4"), std::string::npos)
      << hopattn_last_error();
  // A caller built before page_table: whatever its bytes hold, the table is empty (no paging).
  a = forward_args_with_bad_k_dtype();
  a.page_table = hopattn_page_table{static_cast<const int32_t*>(fake(9)), 1, 8, 4};
  a.struct_size = offsetof(hopattn_forward_args, page_table);
  EXPECT_EQ(hopattn_forward(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
  size_t bytes = 0;
  EXPECT_EQ(hopattn_forward_workspace_size(&a, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
}

// The sinks fields reach the library; a caller built before them (a smaller struct_size) has no
// sinks, whatever its struct holds where they would be.
TEST(CApi, SinksReachTheLibraryAndOlderStructsGetNone) {
  hopattn_forward_args f = forward_args_with_bad_k_dtype();
  f.k.dtype = HOPATTN_BFLOAT16;
  f.sinks = tensor(fake(11), HOPATTN_FLOAT32, {3});  // 2 query heads
  size_t bytes = 0;
  EXPECT_EQ(hopattn_forward_workspace_size(&f, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("sinks.shape[0] is 3 but must be 2"), std::string::npos)
      << hopattn_last_error();
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  // Valid without the sinks: a workspace size with a Hopper GPU, the device check without one.
  f.struct_size = offsetof(hopattn_forward_args, sinks);
  EXPECT_NE(hopattn_forward_workspace_size(&f, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT) << hopattn_last_error();

  hopattn_kvcache_args kv = valid_kvcache_args();
  kv.sinks = tensor(fake(11), HOPATTN_BFLOAT16, {4});
  EXPECT_NE(kvcache_error(kv).find("sinks.dtype is bfloat16 but must be float32"), std::string::npos)
      << hopattn_last_error();
  kv.struct_size = offsetof(hopattn_kvcache_args, sinks);
  EXPECT_NE(hopattn_forward_kvcache_workspace_size(&kv, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT)
      << hopattn_last_error();

  // The backward's workspace size needs no device, so valid arguments get one anywhere.
  hopattn_backward_args b = valid_backward_args();
  b.sinks = tensor(fake(11), HOPATTN_FLOAT32, {2});
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("dsinks is missing"), std::string::npos) << hopattn_last_error();
  b.dsinks = tensor(fake(12), HOPATTN_FLOAT32, {5});
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("dsinks.shape[0] is 5 but must be 2"), std::string::npos)
      << hopattn_last_error();
  b.dsinks.shape[0] = 2;
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_OK) << hopattn_last_error();
  b.sinks = hopattn_tensor{};
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("dsinks is given without sinks"), std::string::npos)
      << hopattn_last_error();
  // From before the fields: sinks without dsinks (and a bad dsinks) would be rejected if they were read.
  b = valid_backward_args();
  b.sinks = tensor(fake(11), HOPATTN_FLOAT32, {2});
  b.dsinks = tensor(fake(12), HOPATTN_BFLOAT16, {7});
  b.struct_size = offsetof(hopattn_backward_args, sinks);
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_OK) << hopattn_last_error();
}

// softcap reaches the library; a caller built before it (a smaller struct_size) has no softcapping,
// whatever its struct holds where the field would be.
TEST(CApi, SoftcapReachesTheLibraryAndOlderStructsGetNone) {
  const std::string rule = " but must be 0 (off) or a positive finite cap";
  // The softcap is checked before the tensors' dtypes, so the bad k names it only once softcap is
  // out of the picture.
  hopattn_forward_args f = forward_args_with_bad_k_dtype();
  f.softcap = -2.0f;
  size_t bytes = 0;
  EXPECT_EQ(hopattn_forward_workspace_size(&f, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("softcap is -2" + rule), std::string::npos) << hopattn_last_error();
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("softcap is -2"), std::string::npos) << hopattn_last_error();
  f.softcap = 30.0f;
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();
  f.softcap = -2.0f;
  f.struct_size = offsetof(hopattn_forward_args, softcap);
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k.dtype"), std::string::npos) << hopattn_last_error();

  hopattn_kvcache_args kv = valid_kvcache_args();
  kv.softcap = -0.5f;
  EXPECT_NE(kvcache_error(kv).find("softcap is -0.5" + rule), std::string::npos) << hopattn_last_error();
  kv.struct_size = offsetof(hopattn_kvcache_args, softcap);
  EXPECT_NE(hopattn_forward_kvcache_workspace_size(&kv, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT)
      << hopattn_last_error();
  kv = valid_kvcache_args();
  kv.softcap = 50.0f;
  EXPECT_NE(hopattn_forward_kvcache_workspace_size(&kv, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT)
      << hopattn_last_error();

  // The backward's workspace size needs no device, so valid arguments get one anywhere.
  hopattn_backward_args b = valid_backward_args();
  b.softcap = -1.0f;
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("softcap is -1" + rule), std::string::npos) << hopattn_last_error();
  EXPECT_EQ(hopattn_backward(&b, fake(20), size_t{1} << 30, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("softcap is -1"), std::string::npos) << hopattn_last_error();
  b.struct_size = offsetof(hopattn_backward_args, softcap);
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_OK) << hopattn_last_error();
  b = valid_backward_args();
  b.softcap = 30.0f;
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_OK) << hopattn_last_error();
}

// FP8 inputs and their descale factors reach the library; a caller built before the descales (a
// smaller struct_size) has none, whatever its struct holds where the fields would be.
TEST(CApi, Fp8DescalesReachTheLibraryAndOlderStructsGetNone) {
  hopattn_forward_args f = forward_args_with_bad_k_dtype();  // q, k, v (1, 16, 2, 64): 2 heads, 2 KV heads
  f.q.dtype = f.k.dtype = f.v.dtype = HOPATTN_FLOAT8_E4M3;
  f.k_descale = tensor2(fake(11), HOPATTN_FLOAT32, 1, 3);  // heads_kv is 2
  size_t bytes = 0;
  EXPECT_EQ(hopattn_forward_workspace_size(&f, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("k_descale.shape[1] is 3 but must be 2"), std::string::npos)
      << hopattn_last_error();
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  f.k_descale.shape[1] = 2;
  // Valid: a workspace size with a Hopper GPU, the device check without one.
  EXPECT_NE(hopattn_forward_workspace_size(&f, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT) << hopattn_last_error();
  f.o.dtype = HOPATTN_FLOAT8_E4M3;
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("o.dtype is float8_e4m3 but must be bfloat16 or float16"),
            std::string::npos)
      << hopattn_last_error();
  // A bf16 call from before the fields: the (wrong) descales where they would be are not read.
  f = forward_args_with_bad_k_dtype();
  f.k.dtype = HOPATTN_BFLOAT16;
  f.q_descale = tensor2(fake(11), HOPATTN_FLOAT32, 1, 2);
  EXPECT_EQ(hopattn_forward(&f, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hopattn_last_error()).find("q_descale is given but q.dtype is bfloat16"), std::string::npos)
      << hopattn_last_error();
  f.struct_size = offsetof(hopattn_forward_args, q_descale);
  EXPECT_NE(hopattn_forward_workspace_size(&f, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT) << hopattn_last_error();

  // The backward has a forward only for FP8.
  hopattn_backward_args b = valid_backward_args();
  b.q.dtype = b.k.dtype = b.v.dtype = HOPATTN_FLOAT8_E4M3;
  EXPECT_EQ(hopattn_backward_workspace_size(&b, &bytes), HOPATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(hopattn_last_error()).find("has a forward only"), std::string::npos) << hopattn_last_error();
}

TEST(CApi, KVCacheErrorsNameTheField) {
  EXPECT_EQ(hopattn_forward_kvcache(nullptr, nullptr, 0, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(hopattn_last_error(), "args is null");
  size_t bytes = 0;
  EXPECT_EQ(hopattn_forward_kvcache_workspace_size(nullptr, &bytes), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(hopattn_last_error(), "args is null");
  hopattn_kvcache_args a = valid_kvcache_args();
  EXPECT_EQ(hopattn_forward_kvcache_workspace_size(&a, nullptr), HOPATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(hopattn_last_error(), "bytes is null");
  a.struct_size = 3;
  EXPECT_NE(kvcache_error(a).find("hopattn_*_args_init"), std::string::npos);

  a = valid_kvcache_args();
  a.cache_seqlens = hopattn_int_array{nullptr, 0};
  EXPECT_NE(kvcache_error(a).find("cache_seqlens is missing"), std::string::npos) << hopattn_last_error();
  a = valid_kvcache_args();
  a.k_new = tensor4(fake(6), HOPATTN_BFLOAT16, 2, 1, 2, 64);
  EXPECT_NE(kvcache_error(a).find("v_new.data is null but k_new is given"), std::string::npos) << hopattn_last_error();
  a = valid_kvcache_args();
  a.cache_batch_idx = int_array(7, 3);
  EXPECT_NE(kvcache_error(a).find("cache_batch_idx.size is 3 but must be 2"), std::string::npos)
      << hopattn_last_error();
  a = valid_kvcache_args();
  a.rotary.cos = tensor2(fake(8), HOPATTN_BFLOAT16, 512, 16);
  EXPECT_NE(kvcache_error(a).find("rotary.cos is given without k_new/v_new"), std::string::npos)
      << hopattn_last_error();
  a = valid_kvcache_args();
  a.page_table = hopattn_page_table{static_cast<const int32_t*>(fake(9)), 3, 4, 0};
  EXPECT_NE(kvcache_error(a).find("page_table.batch (rows) is 3"), std::string::npos) << hopattn_last_error();
  // The mask and layout fields reach the library.
  a = valid_kvcache_args();
  a.causal = 1;
  a.window_right = 2;
  EXPECT_NE(kvcache_error(a).find("mask.causal is set with mask.window_right = 2"), std::string::npos)
      << hopattn_last_error();
  a = valid_kvcache_args();
  a.num_splits = -1;
  EXPECT_NE(kvcache_error(a).find("num_splits is -1"), std::string::npos) << hopattn_last_error();
  a = valid_kvcache_args();
  a.pack_gqa = 2;
  EXPECT_NE(kvcache_error(a).find("pack_gqa is 2"), std::string::npos) << hopattn_last_error();
}

TEST(CApi, ValidKVCacheArgsReachTheDeviceCheck) {
  // Without a Hopper GPU the call stops at the device check, after validation accepted everything.
  const hopattn_kvcache_args a = valid_kvcache_args();
  size_t bytes = 0;
  const int status = hopattn_forward_kvcache_workspace_size(&a, &bytes);
  if (status == HOPATTN_OK) GTEST_SKIP() << "a Hopper GPU is present; this test covers machines without one";
  EXPECT_EQ(status, HOPATTN_ERROR_DEVICE_UNAVAILABLE) << hopattn_last_error();
  EXPECT_EQ(hopattn_forward_kvcache(&a, nullptr, 0, nullptr), HOPATTN_ERROR_DEVICE_UNAVAILABLE);
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
