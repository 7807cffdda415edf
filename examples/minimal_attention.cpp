// The smallest complete use of hopattn: causal GQA attention forward and backward on bf16 tensors
// the caller owns. Built with the project so that this code (and the README excerpt of it) keeps
// compiling against the public header.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <vector>

#include "hopattn/hopattn.hpp"

namespace {

constexpr int kBatch = 2, kSeqlen = 512, kHeads = 8, kHeadsKv = 2, kHeadDim = 128;

// Device memory for `count` values, filled with random bf16 values (or zero).
void* device_bf16(size_t count, std::mt19937& rng, bool random) {
  std::normal_distribution<float> normal;
  std::vector<__nv_bfloat16> host(count);
  for (auto& x : host) x = __float2bfloat16(random ? normal(rng) : 0.0f);
  void* ptr = nullptr;
  cudaMalloc(&ptr, count * sizeof(__nv_bfloat16));
  cudaMemcpy(ptr, host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
  return ptr;
}

int fail(const char* what, const hopattn::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
  return s.code() == hopattn::StatusCode::kDeviceUnavailable ? 2 : 1;
}

}  // namespace

int main() {
  using hopattn::DType;
  using hopattn::make_tensor;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: this example needs a Hopper GPU\n");
    return 2;
  }
  std::mt19937 rng(0);
  const size_t q_count = size_t{kBatch} * kSeqlen * kHeads * kHeadDim;
  const size_t kv_count = size_t{kBatch} * kSeqlen * kHeadsKv * kHeadDim;
  void* q = device_bf16(q_count, rng, true);
  void* k = device_bf16(kv_count, rng, true);
  void* v = device_bf16(kv_count, rng, true);
  void* dout = device_bf16(q_count, rng, true);
  void* o = device_bf16(q_count, rng, false);
  void* dq = device_bf16(q_count, rng, false);
  void* dk = device_bf16(kv_count, rng, false);
  void* dv = device_bf16(kv_count, rng, false);
  void* lse = nullptr;
  cudaMalloc(&lse, size_t{kBatch} * kHeads * kSeqlen * sizeof(float));

  hopattn::ForwardArgs fwd;
  fwd.q = make_tensor(q, DType::kBFloat16, {kBatch, kSeqlen, kHeads, kHeadDim});
  fwd.k = make_tensor(k, DType::kBFloat16, {kBatch, kSeqlen, kHeadsKv, kHeadDim});
  fwd.v = make_tensor(v, DType::kBFloat16, {kBatch, kSeqlen, kHeadsKv, kHeadDim});
  fwd.o = make_tensor(o, DType::kBFloat16, {kBatch, kSeqlen, kHeads, kHeadDim});
  fwd.lse = make_tensor(lse, DType::kFloat32, {kBatch, kHeads, kSeqlen});
  fwd.mask.causal = true;
  if (hopattn::Status s = hopattn::forward(fwd, nullptr); !s.ok()) return fail("forward", s);

  hopattn::BackwardArgs bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.o = fwd.o;
  bwd.lse = fwd.lse;
  bwd.dout = make_tensor(dout, DType::kBFloat16, {kBatch, kSeqlen, kHeads, kHeadDim});
  bwd.dq = make_tensor(dq, DType::kBFloat16, {kBatch, kSeqlen, kHeads, kHeadDim});
  bwd.dk = make_tensor(dk, DType::kBFloat16, {kBatch, kSeqlen, kHeadsKv, kHeadDim});
  bwd.dv = make_tensor(dv, DType::kBFloat16, {kBatch, kSeqlen, kHeadsKv, kHeadDim});
  bwd.mask = fwd.mask;
  size_t bytes = 0;
  if (hopattn::Status s = hopattn::backward_workspace_size(bwd, &bytes); !s.ok()) return fail("workspace", s);
  void* workspace = nullptr;
  cudaMalloc(&workspace, bytes);
  if (hopattn::Status s = hopattn::backward(bwd, hopattn::Workspace{workspace, bytes}, nullptr); !s.ok()) {
    return fail("backward", s);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;

  float first_lse = 0;
  cudaMemcpy(&first_lse, lse, sizeof first_lse, cudaMemcpyDeviceToHost);
  // Query 0 sees only key 0 under the causal mask, so its LSE is its one score.
  std::printf("forward and backward ran; LSE[0, 0, 0] = %.4f\n", first_lse);
  for (void* p : {q, k, v, dout, o, dq, dk, dv, lse, workspace}) cudaFree(p);
  return 0;
}
