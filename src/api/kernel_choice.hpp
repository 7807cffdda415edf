// Which compiled kernel a validated problem runs on, shared by the forward and backward
// dispatchers, and what to say when this build has none.
#pragma once

#include <cstddef>
#include <string>

#include "hopattn/hopattn.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/common/score_variant.hpp"

namespace hopattn {

// Of the kernels for the problem's dtype and score variant, the one with the fewest head dims
// (Q/K's plus V's) that holds both of the problem's: the kernel zero-pads the rest (TMA fills the
// columns past a tensor's head dim with zeros, the epilogues store only the real ones). Entries
// with a null `launch` are end markers. Null: none.
template <class Entry, size_t N>
const Entry* smallest_kernel_holding(const Entry (&kernels)[N], const Problem& p) {
  const Entry* best = nullptr;
  for (const Entry& e : kernels) {
    if (e.launch == nullptr || e.dtype != p.dtype || e.scores != score_variant(p)) continue;
    if (e.head_dims.qk < p.head_dim || e.head_dims.v < p.head_dim_v) continue;
    if (best == nullptr || e.head_dims.qk + e.head_dims.v < best->head_dims.qk + best->head_dims.v) best = &e;
  }
  return best;
}

// kNotSupported for a problem without a kernel in this build, naming the CMake options that
// would build one. `direction`: "forward" or "backward".
inline Status missing_kernel(const char* direction, const Problem& p) {
  const bool softcap = score_variant(p) == ScoreVariant::kSoftcap;
  std::string what = std::string("this build has no ") + (softcap ? "softcap " : "") + direction +
                     " kernel for dtype " + dtype_name(p.dtype) + " with head_dim >= " + std::to_string(p.head_dim);
  if (p.head_dim_v != p.head_dim) what += " and head_dim_v >= " + std::to_string(p.head_dim_v);
  return Status(StatusCode::kNotSupported, what + "; rebuild with it in the CMake options HOPATTN_DTYPES / HOPATTN_HEADDIMS" +
                                               (softcap ? " and HOPATTN_SOFTCAP=ON" : ""));
}

}  // namespace hopattn
