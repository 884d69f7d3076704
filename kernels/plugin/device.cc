// Device adapter selection for plugin calls (see device.h).
#include "kernels/plugin/device.h"

#include "kernels/cuda/cuda_device.h"
#include "kernels/hip/hip_device.h"
#include "kernels/plugin/attest_kernel.h"

namespace attest {

Expected<std::shared_ptr<DeviceAdapter>> OpenDevice(int32_t device_type) {
  switch (device_type) {
    case ATTEST_DEVICE_CUDA:
      return OpenCudaDevice();
    case ATTEST_DEVICE_HIP:
      return OpenHipDevice();  // kernels/hip/hip_device.h
    default:
      return Error{"unknown device_type " + std::to_string(device_type)};
  }
}

}  // namespace attest
