// The properties of the current GPU that launchers size persistent grids and L2-aware tile orders
// from. The API layer fills it (api/device.hpp); kernels only read it.
#pragma once

namespace hopattn {

struct DeviceLimits {
  int multiprocessors = 0;  // SMs
  long long l2_bytes = 0;   // L2 cache size
};

}  // namespace hopattn
