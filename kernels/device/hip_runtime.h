// The HIP runtime, loaded with dlopen at run time (docs/hip.md; docs/design.md "External
// kernels"): attest has no build-time HIP dependency, and on a machine without the runtime or
// without a device it says exactly which of the two is missing. The entry points and enum
// values are those of HIP's C API (hip/hip_runtime_api.h, hip/driver_types.h, ROCm 5.2 as
// shipped by Debian 12); only the calls the device adapter and the example HIP plugin need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reference/status.h"

namespace attest {

// hipError_t values attest names in its own logic (hip/hip_runtime_api.h).
inline constexpr int kHipSuccess = 0;
inline constexpr int kHipErrorNoDevice = 100;
// hipMemcpyKind (hip/driver_types.h).
inline constexpr int kHipMemcpyHostToDevice = 1;
inline constexpr int kHipMemcpyDeviceToHost = 2;

// The resolved entry points of one loaded libamdhip64. Immutable after Load(); shared by the
// adapter and by plugins in the same process (dlopen returns the same library, so both see
// the same devices, streams and allocations).
class HipApi {
 public:
  using GetDeviceCountFn = int (*)(int*);
  using SetDeviceFn = int (*)(int);
  using MallocFn = int (*)(void**, size_t);
  using FreeFn = int (*)(void*);
  using MemcpyFn = int (*)(void*, const void*, size_t, int);
  using MemsetFn = int (*)(void*, int, size_t);
  using DeviceSynchronizeFn = int (*)();
  using StreamCreateFn = int (*)(void**);
  using StreamDestroyFn = int (*)(void*);
  using StreamSynchronizeFn = int (*)(void*);
  using GetLastErrorFn = int (*)();
  using GetErrorNameFn = const char* (*)(int);
  using GetErrorStringFn = const char* (*)(int);
  using RuntimeGetVersionFn = int (*)(int*);
  using DeviceGetNameFn = int (*)(char*, int, int);
  using ModuleLoadDataFn = int (*)(void**, const void*);
  using ModuleUnloadFn = int (*)(void*);
  using ModuleGetFunctionFn = int (*)(void**, void*, const char*);
  using ModuleLaunchKernelFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, unsigned, void*, void**, void**);

  // Loads the library: `path` if not empty, else $ATTEST_HIP_LIBRARY if set, else the first
  // of libamdhip64.so.6, libamdhip64.so.5, libamdhip64.so that dlopen finds. Errors start with
  // "no HIP runtime: " and list what was tried and why it failed (dlerror, missing symbol).
  static Expected<std::shared_ptr<const HipApi>> Load(std::string_view path = {});

  ~HipApi();
  HipApi(const HipApi&) = delete;
  HipApi& operator=(const HipApi&) = delete;

  // "hipErrorNoDevice (100)" plus the runtime's description when it differs from the name.
  std::string Describe(int error) const;
  // Runs after a failed call: "<call> returned <Describe(error)>"; also clears HIP's sticky
  // last error (hipGetLastError), which this call's failure set.
  Error CallError(std::string_view call, int error) const;
  const std::string& library() const { return library_; }
  int runtime_version() const { return runtime_version_; }

  GetDeviceCountFn get_device_count = nullptr;
  SetDeviceFn set_device = nullptr;
  MallocFn malloc = nullptr;
  FreeFn free = nullptr;
  MemcpyFn memcpy = nullptr;
  MemsetFn memset = nullptr;
  DeviceSynchronizeFn device_synchronize = nullptr;
  StreamCreateFn stream_create = nullptr;
  StreamDestroyFn stream_destroy = nullptr;
  StreamSynchronizeFn stream_synchronize = nullptr;
  GetLastErrorFn get_last_error = nullptr;
  GetErrorNameFn get_error_name = nullptr;
  GetErrorStringFn get_error_string = nullptr;
  RuntimeGetVersionFn runtime_get_version = nullptr;
  DeviceGetNameFn device_get_name = nullptr;
  ModuleLoadDataFn module_load_data = nullptr;
  ModuleUnloadFn module_unload = nullptr;
  ModuleGetFunctionFn module_get_function = nullptr;
  ModuleLaunchKernelFn module_launch_kernel = nullptr;

 private:
  HipApi() = default;
  void* handle_ = nullptr;
  std::string library_;
  int runtime_version_ = 0;
};

// Device memory owned by attest; freed (and the free checked, reported to stderr only since
// a destructor cannot return an Error) when it goes out of scope.
class HipBuffer {
 public:
  HipBuffer() = default;
  HipBuffer(std::shared_ptr<const HipApi> api, void* ptr, size_t bytes)
      : api_(std::move(api)), ptr_(ptr), bytes_(bytes) {}
  HipBuffer(HipBuffer&& other) noexcept { *this = std::move(other); }
  HipBuffer& operator=(HipBuffer&& other) noexcept;
  ~HipBuffer() { Reset(); }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Gives up ownership without freeing (HipDevice::Free frees with the result checked).
  void* Release() {
    bytes_ = 0;
    return std::exchange(ptr_, nullptr);
  }

 private:
  void Reset();
  std::shared_ptr<const HipApi> api_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The HIP device adapter: one device and one stream. Every runtime call is checked; a failure
// is an Error naming the call, the HIP error and what attest was doing (a finding when it
// happens around a kernel call: a device error after a launch is the kernel's fault).
class HipDevice {
 public:
  // Loads the runtime (HipApi::Load(library)), counts devices, selects `device_id`, creates a
  // stream. Errors: "no HIP runtime: …", "no HIP device: hipGetDeviceCount returned …" (or
  // "… returned 0 devices"), "HIP device <id> does not exist (<n> devices)", or the call that
  // failed.
  static Expected<std::unique_ptr<HipDevice>> Open(int device_id = 0,
                                                   std::string_view library = {});
  ~HipDevice();
  HipDevice(const HipDevice&) = delete;
  HipDevice& operator=(const HipDevice&) = delete;

  // `what` names the tensor (e.g. "q") in error messages.
  Expected<HipBuffer> Allocate(size_t bytes, std::string_view what);
  // Frees now and reports a failed hipFree (the destructor can only print it).
  Status Free(HipBuffer buffer);
  Status CopyToDevice(const HipBuffer& dst, const void* src, size_t bytes, std::string_view what);
  Status CopyToHost(void* dst, const HipBuffer& src, size_t bytes, std::string_view what);
  // Fills the whole buffer with bytes 0xFF: all-ones is a NaN in every float format attest
  // passes (f64, f32, f16, bf16: exponent all ones, mantissa non-zero; e4m3fn: S.1111.111;
  // e5m2: S.11111.11), so one memset NaN-fills any output tensor.
  Status FillNaN(const HipBuffer& buffer, std::string_view what);
  // Waits for the stream and the device and collects hipGetLastError: a non-success after a
  // kernel call is that kernel's device error. `after` names the call ("forward").
  Status Synchronize(std::string_view after);

  void* stream() const { return stream_; }
  int device_id() const { return device_id_; }
  // "HIP device 0 (<name>), runtime <version>, <library>".
  std::string Describe() const;
  const std::shared_ptr<const HipApi>& api() const { return api_; }

 private:
  HipDevice() = default;
  std::shared_ptr<const HipApi> api_;
  void* stream_ = nullptr;
  int device_id_ = 0;
  std::string name_;
};

}  // namespace attest
