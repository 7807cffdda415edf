// Whether a warp-specialized kernel's `setmaxnreg` split can be honoured.
#pragma once

namespace hopattn {

// Every thread starts with the launch's share of the 64K-register file (one CTA per SM, a multiple
// of 8 per thread), and `setmaxnreg` only moves registers within the CTA: the consumer warpgroups'
// increase must fit in what the producer warpgroup gives back, or their `setmaxnreg.inc` waits
// forever (24/240 with two consumer warpgroups fits exactly; 32/240 hangs).
constexpr bool register_split_fits(int consumer_warpgroups, int producer_registers, int consumer_registers) {
  const int launch_registers = 65536 / ((consumer_warpgroups + 1) * 128) / 8 * 8;
  return consumer_warpgroups * (consumer_registers - launch_registers) <= launch_registers - producer_registers;
}

}  // namespace hopattn
