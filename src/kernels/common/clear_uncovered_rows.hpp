// Varlen calls: the rows of the outputs that no sequence's real tokens cover (uncovered_rows.hpp)
// set to a defined value, so that callers can hand over uninitialized outputs. In the usual packed
// batch there are none, and the kernel only reads the prefix sums.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/problem.hpp"

namespace hopattn {

// Forward (not a KV cache's): O = 0 and LSE = -inf there, as for a row that sees no key.
// Launched on `stream` before the attention kernels; no launch in fixed-length mode.
cudaError_t clear_uncovered_output_rows(const Problem& problem, const ForwardTensors& tensors, cudaStream_t stream);

// Backward: dQ, dK and dV = 0 there. Launched before the gradient kernels, likewise.
cudaError_t clear_uncovered_gradient_rows(const Problem& problem, const BackwardTensors& tensors, cudaStream_t stream);

}  // namespace hopattn
