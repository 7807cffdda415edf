// Does compute-sanitizer's racecheck follow mbarrier arrive/wait between two warps? The forward's
// tile publishing (fwd_mainloop.cuh: a publisher warp writes a slot, arrives on its full barrier;
// the producer warp waits, reads, arrives on the slot's read barrier, which the publisher waits on
// before it rewrites the slot) drew racecheck hazards with many tiles a CTA. This kernel is that
// protocol alone, with CUTLASS's barriers: if racecheck reports hazards here too, it does not
// follow this ordering and the forward's report says nothing about the forward.
// Run on an H100 (CUDA 13.0's compute-sanitizer): "sum ok", and a hazard reported between the
// publisher's store and each of the 64 reads, so racecheck does not follow it.
//
//   nvcc -std=c++17 -arch=sm_90a -I CUTLASS_INCLUDE tools/racecheck_mbarrier_probe.cu -o probe
//   compute-sanitizer --tool racecheck ./probe     (prints "sum ok" when the values arrived)
#include <cutlass/arch/barrier.h>

#include <cstdio>

namespace {

constexpr int kSlots = 3;
constexpr int kRounds = 64;

struct Shared {
  int value[kSlots];
  cutlass::arch::ClusterBarrier full[kSlots];
  cutlass::arch::ClusterBarrier read[kSlots];
};

__global__ void publish_and_read(int* sum) {
  extern __shared__ char shared_memory[];  // the barriers have no default constructor
  auto& s = *reinterpret_cast<Shared*>(shared_memory);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kSlots; ++i) {
      s.full[i].init(1);
      s.read[i].init(1);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 1) {  // the publisher
    for (int r = 0; r < kRounds; ++r) {
      const int slot = r % kSlots;
      if (r >= kSlots) s.read[slot].wait((r / kSlots - 1) & 1);
      if (threadIdx.x % 32 == 0) {
        s.value[slot] = r + 1;
        asm volatile("" ::: "memory");
        s.full[slot].arrive();
      }
    }
  } else if (warp == 0) {  // the reader: every lane reads, one arrives
    int total = 0;
    for (int r = 0; r < kRounds; ++r) {
      const int slot = r % kSlots;
      s.full[slot].wait((r / kSlots) & 1);
      asm volatile("" ::: "memory");
      total += s.value[slot];
      __syncwarp();
      if (threadIdx.x == 0) s.read[slot].arrive();
    }
    if (threadIdx.x == 0) *sum = total;
  }
}

}  // namespace

int main() {
  int* sum = nullptr;
  cudaMalloc(&sum, sizeof(int));
  publish_and_read<<<1, 64, sizeof(Shared)>>>(sum);
  int host = 0;
  cudaMemcpy(&host, sum, sizeof(int), cudaMemcpyDeviceToHost);
  const int expected = kRounds * (kRounds + 1) / 2;
  std::printf("sum %s (%d, expected %d)\n", host == expected ? "ok" : "WRONG", host, expected);
  cudaFree(sum);
  return host == expected ? 0 : 1;
}
