// The GPU reference: a simple, obviously correct attention in plain CUDA (one warp per output row,
// every feature of the API, FP8 inputs in the forward). forward()/backward() run it until the
// Hopper kernels cover a problem, and tests and the benchmark use it as the oracle for sizes the CPU
// reference is too slow for.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/problem.hpp"

namespace hopattn {

enum class ReferencePrecision {
  kFloat32,            // fp32 accumulation: what forward()/backward() run
  kFloat64,            // fp64 accumulation: the high-precision oracle on the GPU
  kNaiveLowPrecision,  // fp32 math with every intermediate (S, P, dP, dS) rounded to the input
                       // dtype, like a framework computing attention op by op; the error bound
                       // of FA3's tolerance rule. FP8 inputs: S rounded to O's dtype, P to e4m3
                       // (docs/semantics.md, "FP8")
};

cudaError_t reference_forward(const Problem& problem, const ForwardTensors& tensors, ReferencePrecision precision,
                              cudaStream_t stream);

size_t reference_backward_workspace_bytes(const Problem& problem, ReferencePrecision precision);

cudaError_t reference_backward(const Problem& problem, const BackwardTensors& tensors, void* workspace,
                               ReferencePrecision precision, cudaStream_t stream);

}  // namespace hopattn
