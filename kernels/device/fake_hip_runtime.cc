// A stand-in for libamdhip64 used only by hip_runtime_test: the HIP C entry points the adapter
// loads (signatures of hip/hip_runtime_api.h, ROCm 5.2), backed by host memory, so that the
// adapter's allocate / copy / NaN-fill / synchronize paths and its error reporting run on a
// machine without an AMD GPU. It cannot run device code (module calls fail).
//
// Behaviour is set per call through the environment (the test sets it before each call):
//   ATTEST_FAKE_HIP_DEVICES=N        device count (default 1; 0 returns hipErrorNoDevice)
//   ATTEST_FAKE_HIP_FAIL=name:code   the entry point `name` returns hipError `code`
// Built twice: with ATTEST_FAKE_HIP_OMIT_LAUNCH the library lacks hipModuleLaunchKernel.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

// Test-only double: the allocation table is the fake device's memory.
struct FakeState {
  std::mutex mu;
  std::map<uintptr_t, std::vector<unsigned char>> allocations;
  int last_error = 0;
};

FakeState& State() {
  static FakeState state;
  return state;
}

// hipError_t code the named entry point must return, or 0.
int Injected(const char* name) {
  const char* spec = std::getenv("ATTEST_FAKE_HIP_FAIL");
  if (!spec) return 0;
  const std::string s(spec);
  const size_t colon = s.find(':');
  if (colon == std::string::npos || s.substr(0, colon) != name) return 0;
  return std::atoi(s.c_str() + colon + 1);
}

// The allocation containing [p, p + bytes), or nullptr.
unsigned char* Find(const void* p, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto& allocs = State().allocations;
  auto it = allocs.upper_bound(addr);
  if (it == allocs.begin()) return nullptr;
  --it;
  if (addr + bytes > it->first + it->second.size()) return nullptr;
  return it->second.data() + (addr - it->first);
}

constexpr int kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNoDevice = 100,
              kInvalidDevice = 101, kInvalidImage = 200;

}  // namespace

#define FAKE_INJECT(name)                    \
  if (int injected = Injected(name)) {       \
    State().last_error = injected;           \
    return injected;                         \
  }

extern "C" {

__attribute__((visibility("default"))) int hipGetDeviceCount(int* count) {
  FAKE_INJECT("hipGetDeviceCount");
  const char* n = std::getenv("ATTEST_FAKE_HIP_DEVICES");
  *count = n ? std::atoi(n) : 1;
  if (*count == 0) State().last_error = kNoDevice;  // sticky, as in HIP
  return *count == 0 ? kNoDevice : kSuccess;
}

__attribute__((visibility("default"))) int hipSetDevice(int id) {
  FAKE_INJECT("hipSetDevice");
  int count = 0;
  hipGetDeviceCount(&count);
  return id >= 0 && id < count ? kSuccess : kInvalidDevice;
}

__attribute__((visibility("default"))) int hipMalloc(void** ptr, size_t bytes) {
  FAKE_INJECT("hipMalloc");
  if (bytes > (size_t{1} << 32)) return kOutOfMemory;
  std::lock_guard<std::mutex> lock(State().mu);
  std::vector<unsigned char> block(bytes, 0xA5);  // garbage, as fresh device memory is
  *ptr = block.data();
  State().allocations.emplace(reinterpret_cast<uintptr_t>(*ptr), std::move(block));
  return kSuccess;
}

__attribute__((visibility("default"))) int hipFree(void* ptr) {
  FAKE_INJECT("hipFree");
  std::lock_guard<std::mutex> lock(State().mu);
  return State().allocations.erase(reinterpret_cast<uintptr_t>(ptr)) ? kSuccess
                                                                      : kInvalidValue;
}

__attribute__((visibility("default"))) int hipMemcpy(void* dst, const void* src, size_t bytes,
                                                     int kind) {
  FAKE_INJECT("hipMemcpy");
  std::lock_guard<std::mutex> lock(State().mu);
  // Kinds 1 (host to device) and 2 (device to host) are the only ones the adapter uses.
  if (kind == 1 && !Find(dst, bytes)) return kInvalidValue;
  if (kind == 2 && !Find(src, bytes)) return kInvalidValue;
  if (kind != 1 && kind != 2) return kInvalidValue;
  std::memcpy(dst, src, bytes);
  return kSuccess;
}

__attribute__((visibility("default"))) int hipMemset(void* dst, int value, size_t bytes) {
  FAKE_INJECT("hipMemset");
  std::lock_guard<std::mutex> lock(State().mu);
  unsigned char* p = Find(dst, bytes);
  if (!p) return kInvalidValue;
  std::memset(p, value, bytes);
  return kSuccess;
}

__attribute__((visibility("default"))) int hipDeviceSynchronize() {
  FAKE_INJECT("hipDeviceSynchronize");
  return kSuccess;
}

__attribute__((visibility("default"))) int hipStreamCreate(void** stream) {
  FAKE_INJECT("hipStreamCreate");
  static int token;  // any non-null handle
  *stream = &token;
  return kSuccess;
}

__attribute__((visibility("default"))) int hipStreamDestroy(void*) {
  FAKE_INJECT("hipStreamDestroy");
  return kSuccess;
}

__attribute__((visibility("default"))) int hipStreamSynchronize(void*) {
  FAKE_INJECT("hipStreamSynchronize");
  return kSuccess;
}

__attribute__((visibility("default"))) int hipGetLastError() {
  if (int injected = Injected("hipGetLastError")) return injected;
  const int e = State().last_error;
  State().last_error = 0;
  return e;
}

__attribute__((visibility("default"))) const char* hipGetErrorName(int e) {
  switch (e) {
    case 0: return "hipSuccess";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 35: return "hipErrorInsufficientDriver";
    case 100: return "hipErrorNoDevice";
    case 101: return "hipErrorInvalidDevice";
    case 200: return "hipErrorInvalidImage";
    case 700: return "hipErrorIllegalAddress";
    default: return "hipErrorUnknown";
  }
}

__attribute__((visibility("default"))) const char* hipGetErrorString(int e) {
  return e == 700 ? "an illegal memory access was encountered" : hipGetErrorName(e);
}

__attribute__((visibility("default"))) int hipRuntimeGetVersion(int* version) {
  FAKE_INJECT("hipRuntimeGetVersion");
  *version = 12345;
  return kSuccess;
}

__attribute__((visibility("default"))) int hipDeviceGetName(char* name, int len, int) {
  FAKE_INJECT("hipDeviceGetName");
  std::strncpy(name, "attest fake HIP device", static_cast<size_t>(len));
  return kSuccess;
}

__attribute__((visibility("default"))) int hipModuleLoadData(void**, const void*) {
  FAKE_INJECT("hipModuleLoadData");
  return kInvalidImage;  // the fake runs no device code
}

__attribute__((visibility("default"))) int hipModuleUnload(void*) { return kSuccess; }

__attribute__((visibility("default"))) int hipModuleGetFunction(void**, void*, const char*) {
  return kInvalidValue;
}

#ifndef ATTEST_FAKE_HIP_OMIT_LAUNCH
__attribute__((visibility("default"))) int hipModuleLaunchKernel(void*, unsigned, unsigned,
                                                                 unsigned, unsigned, unsigned,
                                                                 unsigned, unsigned, void*,
                                                                 void**, void**) {
  return kInvalidValue;
}
#endif

}  // extern "C"
