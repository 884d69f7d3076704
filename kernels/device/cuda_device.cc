// CUDA device adapter through a dlopen'ed CUDA runtime (see cuda_device.h). Only the stable
// C entry points are used (no struct whose layout changes between runtime versions):
// cudaGetDeviceCount, cudaSetDevice, cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize,
// cudaGetLastError, cudaGetErrorName, cudaGetErrorString, cudaRuntimeGetVersion,
// cudaDriverGetVersion (CUDA Runtime API reference, "Device Management", "Memory Management").
#include "kernels/device/cuda_device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace attest {
namespace {

// cudaError_t is an int-sized enum; cudaMemcpyKind values from driver_types.h.
using CudaError = int;
constexpr CudaError kCudaSuccess = 0;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;

struct CudaApi {
  void* handle = nullptr;
  std::string library;
  CudaError (*GetDeviceCount)(int*) = nullptr;
  CudaError (*SetDevice)(int) = nullptr;
  CudaError (*Malloc)(void**, size_t) = nullptr;
  CudaError (*Free)(void*) = nullptr;
  CudaError (*Memcpy)(void*, const void*, size_t, int) = nullptr;
  CudaError (*DeviceSynchronize)() = nullptr;
  CudaError (*GetLastError)() = nullptr;
  const char* (*GetErrorName)(CudaError) = nullptr;
  const char* (*GetErrorString)(CudaError) = nullptr;
  CudaError (*RuntimeGetVersion)(int*) = nullptr;
  CudaError (*DriverGetVersion)(int*) = nullptr;
};

template <class Fn>
bool Resolve(void* handle, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  return fn != nullptr;
}

Expected<CudaApi> LoadCudaRuntime() {
  std::vector<std::string> candidates = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* root = std::getenv(env); root != nullptr && *root != '\0') {
      candidates.push_back(std::string(root) + "/lib64/libcudart.so.13");
      candidates.push_back(std::string(root) + "/lib64/libcudart.so.12");
    }
  }
  candidates.push_back("/usr/local/cuda/lib64/libcudart.so.13");
  candidates.push_back("/usr/local/cuda/lib64/libcudart.so.12");
  std::string tried;
  CudaApi api;
  for (const std::string& name : candidates) {
    api.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.handle != nullptr) {
      api.library = name;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (api.handle == nullptr) return Error{"no CUDA runtime (tried " + tried + ")"};
  bool ok = Resolve(api.handle, "cudaGetDeviceCount", api.GetDeviceCount) &&
            Resolve(api.handle, "cudaSetDevice", api.SetDevice) &&
            Resolve(api.handle, "cudaMalloc", api.Malloc) &&
            Resolve(api.handle, "cudaFree", api.Free) &&
            Resolve(api.handle, "cudaMemcpy", api.Memcpy) &&
            Resolve(api.handle, "cudaDeviceSynchronize", api.DeviceSynchronize) &&
            Resolve(api.handle, "cudaGetLastError", api.GetLastError) &&
            Resolve(api.handle, "cudaGetErrorName", api.GetErrorName) &&
            Resolve(api.handle, "cudaGetErrorString", api.GetErrorString) &&
            Resolve(api.handle, "cudaRuntimeGetVersion", api.RuntimeGetVersion) &&
            Resolve(api.handle, "cudaDriverGetVersion", api.DriverGetVersion);
  if (!ok) return Error{"CUDA runtime " + api.library + " lacks a symbol: " + dlerror()};
  return api;
}

class CudaDevice final : public DeviceAdapter {
 public:
  CudaDevice(CudaApi api, int device) : api_(std::move(api)), device_(device) {}

  // "cudaMemcpy: cudaErrorIllegalAddress (an illegal memory access was encountered)".
  Status Check(CudaError e, const char* call) const {
    if (e == kCudaSuccess) return Status::Ok();
    return Error{std::string(call) + ": " + api_.GetErrorName(e) + " (" +
                 api_.GetErrorString(e) + ")"};
  }

  Status Init() {
    int count = 0;
    if (CudaError e = api_.GetDeviceCount(&count); e != kCudaSuccess) {
      return Error{"no CUDA device (" + Check(e, "cudaGetDeviceCount").error().message + ")"};
    }
    if (count == 0) return Error{"no CUDA device (cudaGetDeviceCount returned 0)"};
    if (device_ < 0 || device_ >= count) {
      return Error{"ATTEST_CUDA_DEVICE=" + std::to_string(device_) + " but " +
                   std::to_string(count) + " CUDA device(s) are visible"};
    }
    if (Status s = Check(api_.SetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
    int runtime = 0, driver = 0;
    if (Status s = Check(api_.RuntimeGetVersion(&runtime), "cudaRuntimeGetVersion"); !s.ok()) {
      return s;
    }
    if (Status s = Check(api_.DriverGetVersion(&driver), "cudaDriverGetVersion"); !s.ok()) {
      return s;
    }
    describe_ = "CUDA device " + std::to_string(device_) + " (" + api_.library + ", runtime " +
                std::to_string(runtime) + ", driver " + std::to_string(driver) + ")";
    return Status::Ok();
  }

  std::string Describe() const override { return describe_; }
  int32_t device_type() const override { return kDeviceCuda; }
  int32_t device_id() const override { return device_; }
  void* stream() const override { return nullptr; }  // the legacy default stream

  Expected<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    // cudaMalloc(0) may return nullptr; keep every buffer a distinct valid pointer.
    if (Status s = Check(api_.Malloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc"); !s.ok()) {
      return s.error();
    }
    return p;
  }
  Status Free(void* p) override { return Check(api_.Free(p), "cudaFree"); }
  Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    return Check(api_.Memcpy(dst, src, bytes, kMemcpyHostToDevice), "cudaMemcpy(HostToDevice)");
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    return Check(api_.Memcpy(dst, src, bytes, kMemcpyDeviceToHost), "cudaMemcpy(DeviceToHost)");
  }
  Status Synchronize() override {
    // A launch failure is reported by cudaGetLastError, an execution fault by the
    // synchronisation; check both so neither hides behind the other.
    if (Status s = Check(api_.GetLastError(), "kernel launch (cudaGetLastError)"); !s.ok()) {
      return s;
    }
    return Check(api_.DeviceSynchronize(), "cudaDeviceSynchronize");
  }

 private:
  CudaApi api_;
  int device_ = 0;
  std::string describe_;
};

}  // namespace

Expected<std::shared_ptr<DeviceAdapter>> OpenCudaDevice() {
  // Opened once per process: the runtime and its context live as long as the process (in
  // isolated mode that is the kernel's child process).
  static std::mutex mutex;
  static std::shared_ptr<DeviceAdapter> device;
  static std::string failure;
  std::lock_guard<std::mutex> lock(mutex);
  if (device) return device;
  if (!failure.empty()) return Error{failure};
  int id = 0;
  if (const char* env = std::getenv("ATTEST_CUDA_DEVICE"); env != nullptr && *env != '\0') {
    id = std::atoi(env);
  }
  auto api = LoadCudaRuntime();
  if (!api.ok()) {
    failure = api.error().message;
    return api.error();
  }
  auto cuda = std::make_shared<CudaDevice>(std::move(*api), id);
  if (Status s = cuda->Init(); !s.ok()) {
    failure = s.error().message;
    return s.error();
  }
  device = cuda;
  return device;
}

}  // namespace attest
