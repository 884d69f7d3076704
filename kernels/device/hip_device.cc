// The HIP DeviceAdapter (see hip_device.h): DeviceAdapter's raw-pointer interface mapped onto
// HipDevice, whose calls are all checked and named.
#include "kernels/device/hip_device.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace attest {
namespace {

class HipDeviceAdapter final : public DeviceAdapter {
 public:
  explicit HipDeviceAdapter(std::unique_ptr<HipDevice> device) : device_(std::move(device)) {}

  std::string Describe() const override { return device_->Describe(); }
  int32_t device_type() const override { return kDeviceHip; }
  int32_t device_id() const override { return device_->device_id(); }
  void* stream() const override { return device_->stream(); }

  Expected<void*> Allocate(size_t bytes) override {
    auto buffer = device_->Allocate(bytes, "a plugin tensor");
    if (!buffer) return buffer.error();
    void* ptr = buffer->data();
    std::lock_guard<std::mutex> lock(mutex_);
    buffers_.emplace(ptr, std::move(*buffer));
    return ptr;
  }

  Status Free(void* device_ptr) override {
    HipBuffer buffer;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = buffers_.find(device_ptr);
      if (it == buffers_.end()) {
        return Error{"hipFree: pointer was not allocated by this HIP adapter"};
      }
      buffer = std::move(it->second);
      buffers_.erase(it);
    }
    // Freed here, with the free checked (HipBuffer's destructor can only print).
    return device_->Free(std::move(buffer));
  }

  Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    auto* buffer = Find(device_dst);
    if (!buffer) return Error{"hipMemcpy(host to device): destination not allocated by attest"};
    return device_->CopyToDevice(*buffer, host_src, bytes, "a plugin input");
  }

  Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) override {
    auto* buffer = Find(device_src);
    if (!buffer) return Error{"hipMemcpy(device to host): source not allocated by attest"};
    return device_->CopyToHost(host_dst, *buffer, bytes, "a plugin output");
  }

  Status Synchronize() override { return device_->Synchronize("the kernel call"); }

 private:
  const HipBuffer* Find(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = buffers_.find(const_cast<void*>(ptr));
    return it == buffers_.end() ? nullptr : &it->second;
  }

  std::unique_ptr<HipDevice> device_;
  std::mutex mutex_;
  std::map<void*, HipBuffer> buffers_;  // std::map: node addresses stay valid
};

}  // namespace

Expected<std::shared_ptr<DeviceAdapter>> MakeHipDeviceAdapter(int device_id,
                                                              std::string_view library) {
  auto device = HipDevice::Open(device_id, library);
  if (!device) return device.error();
  return std::shared_ptr<DeviceAdapter>(std::make_shared<HipDeviceAdapter>(std::move(*device)));
}

Expected<std::shared_ptr<DeviceAdapter>> OpenHipDevice() {
  // Opened once per process: the runtime and its context live as long as the process (in
  // isolated mode that is the kernel's child process).
  static std::mutex mutex;
  static std::shared_ptr<DeviceAdapter> device;
  static std::string failure;
  std::lock_guard<std::mutex> lock(mutex);
  if (device) return device;
  if (!failure.empty()) return Error{failure};
  int id = 0;
  if (const char* env = std::getenv("ATTEST_HIP_DEVICE"); env != nullptr && *env != '\0') {
    id = std::atoi(env);
  }
  auto opened = MakeHipDeviceAdapter(id, {});
  if (!opened) {
    failure = opened.error().message;
    return opened.error();
  }
  device = *opened;
  return device;
}

}  // namespace attest
