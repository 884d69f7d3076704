// The HIP device adapter for C ABI plugins (kernels/device/device.h; docs/hip.md): a
// DeviceAdapter over HipDevice (hip_runtime.h), so plugins whose descriptor says
// ATTEST_DEVICE_HIP get buffers allocated, copied and synchronised by attest with every HIP
// runtime call checked. libamdhip64 is loaded with dlopen: no build-time HIP dependency.
#pragma once

#include <memory>
#include <string_view>

#include "kernels/device/device.h"
#include "kernels/device/hip_runtime.h"

namespace attest {

// The process's HIP adapter on device $ATTEST_HIP_DEVICE (default 0), opened on first use and
// kept (as OpenCudaDevice does). Errors: "no HIP runtime: …", "no HIP device:
// hipGetDeviceCount returned …".
Expected<std::shared_ptr<DeviceAdapter>> OpenHipDevice();

// A fresh adapter over `library` (a path; empty = the default search), not cached: for tests.
Expected<std::shared_ptr<DeviceAdapter>> MakeHipDeviceAdapter(int device_id,
                                                              std::string_view library);

}  // namespace attest
