// The one place that asks the CUDA runtime which device we are on and whether it can run us.
#pragma once

#include "hopattn/hopattn.hpp"
#include "kernels/common/device_limits.hpp"

namespace hopattn {

// kOk when the current device is an sm_90 (Hopper) GPU; otherwise a kDeviceUnavailable status
// that says what was found. Where no CUDA context is current on the calling thread, makes the
// current device's primary context current (the TMA descriptors need one). Never launches
// anything and never aborts. Called once per forward and backward: after a device has passed
// once, later calls on it cost one cudaGetDevice, one cuCtxGetCurrent and an atomic load. Safe
// to call from several host threads at once.
Status check_current_device();

// The limits of the current device. Expects check_current_device() to have succeeded on this
// thread's current device (it then answers from the same cache, without runtime queries beyond
// cudaGetDevice); otherwise it asks the runtime, and a field it cannot learn is 0.
DeviceLimits current_device_limits();

// Turns a CUDA error into a Status naming the step that failed.
Status cuda_status(int cuda_error, const char* what);

}  // namespace hopattn
