// The CPU reference of the KV-cache append (kernels/kvcache/append_kv.hpp): new keys and values
// written into the cache, rotary embedding applied to the keys and to q, key_end. It is the oracle
// the append kernel is compared with bitwise, so unlike the attention reference it computes what
// the kernel computes instead of float64: each rotated entry is fma(x, cos, -+(partner * sin)) in
// fp32 (the product rounded to fp32 first, the fma rounded once) and then rounded once to the
// element type; entries past rotary_dim, the values and unrotated rows are copied bit for bit.
#pragma once

#include "kernels/kvcache/append_kv.hpp"

namespace hopattn::cpu_reference {

// Applies the append to host memory: every pointer of `p` (tensors, cos/sin, cu_seqlens,
// cache_seqlens, page table, cache_batch_idx, rotary_start, key_end) points to host copies laid out
// as on the device. Writes the new rows into k_cache/v_cache, every query row into q_rotated (when
// set) and key_end. Prefix sums must be consistent (0 <= cu[b] <= cu[b + 1] <= total); the
// kernel's clamping of inconsistent ones is not modelled.
void append_kv(const AppendKVParams& p);

}  // namespace hopattn::cpu_reference
