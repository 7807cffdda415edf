// The one place that asks the CUDA runtime which device we are on and whether it can run us.
#pragma once

#include "hopattn/hopattn.hpp"

namespace hopattn {

// kOk when the current device is an sm_90 (Hopper) GPU; otherwise a kDeviceUnavailable status
// that says what was found. Never launches anything and never aborts.
Status check_current_device();

// Turns a CUDA error into a Status naming the step that failed.
Status cuda_status(int cuda_error, const char* what);

}  // namespace hopattn
