// Device adapter selection for plugin calls (see device.h).
#include "kernels/device/device.h"

#include "kernels/device/cuda_device.h"
#include "kernels/device/hip_device.h"

namespace attest {

Expected<std::shared_ptr<DeviceAdapter>> OpenDevice(int32_t device_type) {
  switch (device_type) {
    case kDeviceCuda:
      return OpenCudaDevice();
    case kDeviceHip:
      return OpenHipDevice();  // kernels/device/hip_device.h
    default:
      return Error{"unknown device_type " + std::to_string(device_type)};
  }
}

}  // namespace attest
