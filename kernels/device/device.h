// Device adapters for C ABI plugins (docs/design.md "External kernels": "the harness allocates and
// copies device buffers, fills outputs with NaN before each call, and checks every runtime
// call"). One adapter per device type; every method reports a failed runtime call as an Error
// naming the call and the runtime's error string, which becomes a finding. The adapters know
// nothing of plugins: kernels/plugin/ uses them, never the other way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "reference/status.h"

namespace attest {

// The device types adapters exist for. The values are the C ABI's attest_device_type
// (kernels/plugin/attest_kernel.h), which plugin descriptors carry unchanged;
// kernels/plugin/library.cc asserts that the two agree.
inline constexpr int32_t kDeviceCuda = 1;  // ATTEST_DEVICE_CUDA
inline constexpr int32_t kDeviceHip = 2;   // ATTEST_DEVICE_HIP

class DeviceAdapter {
 public:
  virtual ~DeviceAdapter() = default;
  // "CUDA device 0 (NVIDIA H200)".
  virtual std::string Describe() const = 0;
  virtual int32_t device_type() const = 0;  // kDeviceCuda or kDeviceHip
  virtual int32_t device_id() const = 0;
  // The stream passed to the kernel (attest_*_args.stream); nullptr is the default stream.
  virtual void* stream() const = 0;
  virtual Expected<void*> Allocate(size_t bytes) = 0;
  virtual Status Free(void* device_ptr) = 0;
  virtual Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) = 0;
  // Waits for the kernel's work and reports errors it raised asynchronously (an illegal
  // address surfaces here, not at the launch).
  virtual Status Synchronize() = 0;
};

// The adapter for `device_type` (kDeviceCuda, kDeviceHip); opened once per process (a runtime
// is loaded with dlopen, so attest has no build-time GPU dependency).
// Errors say "no CUDA runtime (…)" or "no CUDA device" on machines without one.
Expected<std::shared_ptr<DeviceAdapter>> OpenDevice(int32_t device_type);

// Device memory that frees itself; a failed free is reported by Release().
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::shared_ptr<DeviceAdapter> device, void* ptr) : device_(device), ptr_(ptr) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : device_(std::move(o.device_)), ptr_(o.ptr_) {
    o.ptr_ = nullptr;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      (void)Release();
      device_ = std::move(o.device_);
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  ~DeviceBuffer() { (void)Release(); }
  void* get() const { return ptr_; }
  Status Release() {
    if (ptr_ == nullptr || !device_) return Status::Ok();
    void* p = ptr_;
    ptr_ = nullptr;
    return device_->Free(p);
  }

 private:
  std::shared_ptr<DeviceAdapter> device_;
  void* ptr_ = nullptr;
};

}  // namespace attest
