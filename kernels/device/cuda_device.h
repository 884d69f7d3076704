// The CUDA device adapter for C ABI plugins (kernels/device/device.h). The CUDA runtime is
// loaded with dlopen (libcudart.so.13, .12, libcudart.so, then $CUDA_HOME/lib64 and
// /usr/local/cuda/lib64), so attest builds and runs without CUDA and says so cleanly.
#pragma once

#include <memory>

#include "kernels/device/device.h"

namespace attest {

// The process's CUDA adapter on device $ATTEST_CUDA_DEVICE (default 0), opened on first use.
// Errors: "no CUDA runtime (tried …)", "no CUDA device (cudaGetDeviceCount: …)".
Expected<std::shared_ptr<DeviceAdapter>> OpenCudaDevice();

}  // namespace attest
