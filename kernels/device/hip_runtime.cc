// The HIP runtime loaded with dlopen, and the HIP device adapter (see hip_runtime.h; function
// signatures from hip/hip_runtime_api.h of ROCm 5.2, Debian 12's libamdhip64-dev).
#include "kernels/device/hip_runtime.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace attest {
namespace {

std::string DlError() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// Resolves `name` into `fn`; false (with `missing` set) if the library lacks it.
template <class Fn>
bool Resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn) missing = name;
  return fn != nullptr;
}

}  // namespace

Expected<std::shared_ptr<const HipApi>> HipApi::Load(std::string_view path) {
  std::vector<std::string> candidates;
  if (!path.empty()) {
    candidates.emplace_back(path);
  } else if (const char* env = std::getenv("ATTEST_HIP_LIBRARY"); env && *env) {
    candidates.emplace_back(env);
  } else {
    // ROCm 6 ships .so.6, ROCm 5 (Debian 12) .so.5; the unversioned name needs the -dev link.
    candidates = {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"};
  }
  std::string tried;
  for (const std::string& name : candidates) {
    // RTLD_LOCAL: the runtime's symbols stay out of the global namespace (a plugin that links
    // libamdhip64 itself gets the same library instance from the loader anyway).
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      tried += (tried.empty() ? "" : "; ") + DlError();
      continue;
    }
    std::shared_ptr<HipApi> api(new HipApi());  // private constructor: no make_shared
    api->handle_ = handle;
    api->library_ = name;
    std::string missing;
    const bool ok =
        Resolve(handle, "hipGetDeviceCount", api->get_device_count, missing) &&
        Resolve(handle, "hipSetDevice", api->set_device, missing) &&
        Resolve(handle, "hipMalloc", api->malloc, missing) &&
        Resolve(handle, "hipFree", api->free, missing) &&
        Resolve(handle, "hipMemcpy", api->memcpy, missing) &&
        Resolve(handle, "hipMemset", api->memset, missing) &&
        Resolve(handle, "hipDeviceSynchronize", api->device_synchronize, missing) &&
        Resolve(handle, "hipStreamCreate", api->stream_create, missing) &&
        Resolve(handle, "hipStreamDestroy", api->stream_destroy, missing) &&
        Resolve(handle, "hipStreamSynchronize", api->stream_synchronize, missing) &&
        Resolve(handle, "hipGetLastError", api->get_last_error, missing) &&
        Resolve(handle, "hipGetErrorName", api->get_error_name, missing) &&
        Resolve(handle, "hipGetErrorString", api->get_error_string, missing) &&
        Resolve(handle, "hipRuntimeGetVersion", api->runtime_get_version, missing) &&
        Resolve(handle, "hipDeviceGetName", api->device_get_name, missing) &&
        Resolve(handle, "hipModuleLoadData", api->module_load_data, missing) &&
        Resolve(handle, "hipModuleUnload", api->module_unload, missing) &&
        Resolve(handle, "hipModuleGetFunction", api->module_get_function, missing) &&
        Resolve(handle, "hipModuleLaunchKernel", api->module_launch_kernel, missing);
    if (!ok) {
      tried += (tried.empty() ? "" : "; ") + name + " lacks symbol " + missing;
      continue;
    }
    if (int e = api->runtime_get_version(&api->runtime_version_); e != kHipSuccess) {
      return Error{"no HIP runtime: " + name + ": hipRuntimeGetVersion returned " +
                   api->Describe(e)};
    }
    return std::shared_ptr<const HipApi>(std::move(api));
  }
  return Error{"no HIP runtime: " + tried};
}

// The library is never dlclosed: a GPU runtime starts threads and registers exit handlers,
// and unloading it under them is unsafe; a process loads it at most a few times.
HipApi::~HipApi() = default;

std::string HipApi::Describe(int error) const {
  const char* name = get_error_name ? get_error_name(error) : nullptr;
  const char* text = get_error_string ? get_error_string(error) : nullptr;
  std::string out = (name ? name : "hipError") + std::string(" (") + std::to_string(error) + ")";
  // ROCm 5.2 returns the name again as the "string"; say it once.
  if (text && (!name || std::string_view(text) != name)) out += ": " + std::string(text);
  return out;
}

Error HipApi::CallError(std::string_view call, int error) const {
  // HIP keeps the last failed call's error until hipGetLastError reads it; this failure is
  // reported here, so consume it, lest a later Synchronize blame the next kernel call for it.
  (void)get_last_error();
  return Error{std::string(call) + " returned " + Describe(error)};
}

HipBuffer& HipBuffer::operator=(HipBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    api_ = std::move(other.api_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void HipBuffer::Reset() {
  if (ptr_ && api_) {
    if (int e = api_->free(ptr_); e != kHipSuccess) {
      // A destructor cannot return the error; a failed free after a kernel ran usually
      // repeats a device error Synchronize has already reported.
      std::fprintf(stderr, "attest: hipFree returned %s\n", api_->Describe(e).c_str());
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

Expected<std::unique_ptr<HipDevice>> HipDevice::Open(int device_id, std::string_view library) {
  auto api = HipApi::Load(library);
  if (!api) return api.error();
  const HipApi& hip = **api;
  int count = 0;
  if (int e = hip.get_device_count(&count); e != kHipSuccess) {
    (void)hip.get_last_error();  // consumed: reported here (see CallError)
    return Error{"no HIP device: hipGetDeviceCount returned " + hip.Describe(e) + " (runtime " +
                 std::to_string(hip.runtime_version()) + ", " + hip.library() + ")"};
  }
  if (count == 0) {
    return Error{"no HIP device: hipGetDeviceCount returned 0 devices (runtime " +
                 std::to_string(hip.runtime_version()) + ", " + hip.library() + ")"};
  }
  if (device_id < 0 || device_id >= count) {
    return Error{"HIP device " + std::to_string(device_id) + " does not exist (" +
                 std::to_string(count) + " devices)"};
  }
  if (int e = hip.set_device(device_id); e != kHipSuccess) {
    return hip.CallError("hipSetDevice(" + std::to_string(device_id) + ")", e);
  }
  std::unique_ptr<HipDevice> device(new HipDevice());
  device->api_ = *api;
  device->device_id_ = device_id;
  char name[256] = {};
  if (int e = hip.device_get_name(name, sizeof(name) - 1, device_id); e != kHipSuccess) {
    return hip.CallError("hipDeviceGetName", e);
  }
  device->name_ = name;
  if (int e = hip.stream_create(&device->stream_); e != kHipSuccess) {
    return hip.CallError("hipStreamCreate", e);
  }
  return device;
}

HipDevice::~HipDevice() {
  if (stream_ && api_) {
    if (int e = api_->stream_destroy(stream_); e != kHipSuccess) {
      std::fprintf(stderr, "attest: hipStreamDestroy returned %s\n", api_->Describe(e).c_str());
    }
  }
}

Expected<HipBuffer> HipDevice::Allocate(size_t bytes, std::string_view what) {
  void* ptr = nullptr;
  // hipMalloc(0) may return nullptr; allocate at least one byte so every tensor, even an
  // empty one, has a distinct valid device address.
  if (int e = api_->malloc(&ptr, bytes == 0 ? 1 : bytes); e != kHipSuccess) {
    return api_->CallError("hipMalloc(" + std::to_string(bytes) + " bytes) for " +
                               std::string(what),
                           e);
  }
  return HipBuffer(api_, ptr, bytes);
}

Status HipDevice::Free(HipBuffer buffer) {
  void* ptr = buffer.Release();
  if (!ptr) return Status::Ok();
  if (int e = api_->free(ptr); e != kHipSuccess) return api_->CallError("hipFree", e);
  return Status::Ok();
}

Status HipDevice::CopyToDevice(const HipBuffer& dst, const void* src, size_t bytes,
                               std::string_view what) {
  if (bytes > dst.bytes()) {
    return Error{"copy of " + std::string(what) + " to the HIP device: " +
                 std::to_string(bytes) + " bytes into a " + std::to_string(dst.bytes()) +
                 "-byte buffer"};
  }
  if (bytes == 0) return Status::Ok();
  if (int e = api_->memcpy(dst.data(), src, bytes, kHipMemcpyHostToDevice); e != kHipSuccess) {
    return api_->CallError("hipMemcpy(host to device) for " + std::string(what), e);
  }
  return Status::Ok();
}

Status HipDevice::CopyToHost(void* dst, const HipBuffer& src, size_t bytes,
                             std::string_view what) {
  if (bytes > src.bytes()) {
    return Error{"copy of " + std::string(what) + " from the HIP device: " +
                 std::to_string(bytes) + " bytes out of a " + std::to_string(src.bytes()) +
                 "-byte buffer"};
  }
  if (bytes == 0) return Status::Ok();
  if (int e = api_->memcpy(dst, src.data(), bytes, kHipMemcpyDeviceToHost); e != kHipSuccess) {
    return api_->CallError("hipMemcpy(device to host) for " + std::string(what), e);
  }
  return Status::Ok();
}

Status HipDevice::FillNaN(const HipBuffer& buffer, std::string_view what) {
  if (buffer.bytes() == 0) return Status::Ok();
  if (int e = api_->memset(buffer.data(), 0xFF, buffer.bytes()); e != kHipSuccess) {
    return api_->CallError("hipMemset(NaN fill) for " + std::string(what), e);
  }
  return Status::Ok();
}

Status HipDevice::Synchronize(std::string_view after) {
  // The stream first (a kernel's fault surfaces here), then the device (anything else
  // queued), then the sticky last error (a launch failure that returned success).
  if (int e = api_->stream_synchronize(stream_); e != kHipSuccess) {
    return api_->CallError("hipStreamSynchronize after " + std::string(after), e);
  }
  if (int e = api_->device_synchronize(); e != kHipSuccess) {
    return api_->CallError("hipDeviceSynchronize after " + std::string(after), e);
  }
  if (int e = api_->get_last_error(); e != kHipSuccess) {
    return api_->CallError("hipGetLastError after " + std::string(after), e);
  }
  return Status::Ok();
}

std::string HipDevice::Describe() const {
  return "HIP device " + std::to_string(device_id_) + " (" + name_ + "), runtime " +
         std::to_string(api_->runtime_version()) + ", " + api_->library();
}

}  // namespace attest
