// Tests of the HIP device adapter (kernels/device/hip_runtime.h; docs/hip.md): what it says on
// this machine (the real libamdhip64 without a device, or no runtime at all), and every
// adapter path against a host-memory stand-in for the runtime (fake_hip_runtime.cc).
#include "kernels/device/hip_runtime.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "reference/formats/format.h"

namespace attest {
namespace {

bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Sets an environment variable for one test and restores "unset" afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

// The real runtime, where installed. No machine this runs on has an AMD GPU, so Open must
// fail with the exact reason; on a machine with one, the adapter must round-trip data.
TEST(HipRuntime, TheRealRuntimeSaysWhatIsMissing) {
  auto device = HipDevice::Open(0);
  if (device.ok()) {
    std::printf("found %s\n", (*device)->Describe().c_str());
    std::vector<float> host = {1.5f, -2.0f, 3.25f};
    auto buffer = (*device)->Allocate(host.size() * sizeof(float), "x");
    ASSERT_TRUE(buffer.ok()) << buffer.error().message;
    ASSERT_TRUE((*device)->CopyToDevice(*buffer, host.data(), buffer->bytes(), "x").ok());
    std::vector<float> back(host.size());
    ASSERT_TRUE((*device)->CopyToHost(back.data(), *buffer, buffer->bytes(), "x").ok());
    EXPECT_EQ(back, host);
    ASSERT_TRUE((*device)->FillNaN(*buffer, "x").ok());
    ASSERT_TRUE((*device)->CopyToHost(back.data(), *buffer, buffer->bytes(), "x").ok());
    for (float f : back) EXPECT_TRUE(std::isnan(f));
    EXPECT_TRUE((*device)->Synchronize("test").ok());
    return;
  }
  const std::string& message = device.error().message;
  std::printf("HipDevice::Open(0): %s\n", message.c_str());
  // Whether the runtime library is loadable decides which message is the right one.
  bool runtime_present = false;
  for (const char* name : {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      runtime_present = true;
      dlclose(h);
      break;
    }
  }
  if (runtime_present) {
    EXPECT_TRUE(StartsWith(message, "no HIP device: hipGetDeviceCount returned ")) << message;
  } else {
    EXPECT_TRUE(StartsWith(message, "no HIP runtime: ")) << message;
    EXPECT_NE(message.find("libamdhip64.so.5"), std::string::npos) << message;
  }
}

TEST(HipRuntime, AMissingLibraryIsNoRuntime) {
  auto api = HipApi::Load("/nonexistent/libamdhip64.so.5");
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(StartsWith(api.error().message, "no HIP runtime: /nonexistent/libamdhip64.so.5"))
      << api.error().message;
  ScopedEnv env("ATTEST_HIP_LIBRARY", "/nonexistent/libfromenv.so");
  auto device = HipDevice::Open(0);
  ASSERT_FALSE(device.ok());
  EXPECT_NE(device.error().message.find("/nonexistent/libfromenv.so"), std::string::npos)
      << device.error().message;
}

TEST(HipRuntime, ALibraryWithoutAnEntryPointIsNoRuntime) {
  auto api = HipApi::Load(ATTEST_FAKE_HIP_NOLAUNCH);
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(StartsWith(api.error().message, "no HIP runtime: "));
  EXPECT_NE(api.error().message.find("lacks symbol hipModuleLaunchKernel"), std::string::npos)
      << api.error().message;
}

TEST(HipRuntime, NoDeviceIsSaidExactly) {
  {
    ScopedEnv env("ATTEST_FAKE_HIP_DEVICES", "0");
    auto device = HipDevice::Open(0, ATTEST_FAKE_HIP);
    ASSERT_FALSE(device.ok());
    EXPECT_TRUE(StartsWith(device.error().message,
                           "no HIP device: hipGetDeviceCount returned hipErrorNoDevice (100)"))
        << device.error().message;
  }
  {
    ScopedEnv env("ATTEST_FAKE_HIP_FAIL", "hipGetDeviceCount:35");
    auto device = HipDevice::Open(0, ATTEST_FAKE_HIP);
    ASSERT_FALSE(device.ok());
    EXPECT_TRUE(StartsWith(device.error().message,
                           "no HIP device: hipGetDeviceCount returned hipErrorInsufficientDriver (35)"))
        << device.error().message;
  }
  auto device = HipDevice::Open(3, ATTEST_FAKE_HIP);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.error().message, "HIP device 3 does not exist (1 devices)");
}

TEST(HipRuntime, CopiesRoundTripAndBoundsAreChecked) {
  auto device = HipDevice::Open(0, ATTEST_FAKE_HIP);
  ASSERT_TRUE(device.ok()) << device.error().message;
  EXPECT_EQ((*device)->Describe(),
            std::string("HIP device 0 (attest fake HIP device), runtime 12345, ") +
                ATTEST_FAKE_HIP);
  EXPECT_NE((*device)->stream(), nullptr);
  std::vector<uint16_t> host(37);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(i * 977 + 3);
  auto buffer = (*device)->Allocate(host.size() * 2, "q");
  ASSERT_TRUE(buffer.ok()) << buffer.error().message;
  ASSERT_TRUE((*device)->CopyToDevice(*buffer, host.data(), host.size() * 2, "q").ok());
  std::vector<uint16_t> back(host.size());
  ASSERT_TRUE((*device)->CopyToHost(back.data(), *buffer, back.size() * 2, "q").ok());
  EXPECT_EQ(back, host);
  // One element too many in either direction is refused before the runtime is called.
  std::vector<uint16_t> big(host.size() + 1);
  Status up = (*device)->CopyToDevice(*buffer, big.data(), big.size() * 2, "q");
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.error().message, "copy of q to the HIP device: 76 bytes into a 74-byte buffer");
  Status down = (*device)->CopyToHost(big.data(), *buffer, big.size() * 2, "q");
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().message, "copy of q from the HIP device: 76 bytes out of a 74-byte buffer");
  // An empty tensor still gets a valid, distinct allocation, and copying nothing is fine.
  auto empty = (*device)->Allocate(0, "lse");
  ASSERT_TRUE(empty.ok());
  EXPECT_NE(empty->data(), nullptr);
  EXPECT_TRUE((*device)->CopyToDevice(*empty, nullptr, 0, "lse").ok());
  EXPECT_TRUE((*device)->Synchronize("forward").ok());
}

// The adapter NaN-fills with bytes 0xFF; that is a NaN in every float format attest passes.
TEST(HipRuntime, TheNanFillIsNanInEveryFloatFormat) {
  auto device = HipDevice::Open(0, ATTEST_FAKE_HIP);
  ASSERT_TRUE(device.ok()) << device.error().message;
  auto buffer = (*device)->Allocate(64, "o");
  ASSERT_TRUE(buffer.ok());
  std::vector<unsigned char> zeros(64, 0);
  ASSERT_TRUE((*device)->CopyToDevice(*buffer, zeros.data(), 64, "o").ok());
  ASSERT_TRUE((*device)->FillNaN(*buffer, "o").ok());
  std::vector<unsigned char> back(64);
  ASSERT_TRUE((*device)->CopyToHost(back.data(), *buffer, 64, "o").ok());
  for (unsigned char b : back) ASSERT_EQ(b, 0xFF);
  double f64;
  float f32;
  std::memcpy(&f64, back.data(), 8);
  std::memcpy(&f32, back.data(), 4);
  EXPECT_TRUE(std::isnan(f64));
  EXPECT_TRUE(std::isnan(f32));
  // Decoded by attest's own format table, not by bit reasoning repeated here.
  for (Format f : {Format::kBF16, Format::kF16, Format::kE4M3FN, Format::kE5M2,
                   Format::kE8M0FNU}) {
    const int bits = f == Format::kBF16 || f == Format::kF16 ? 16 : 8;
    EXPECT_TRUE(std::isnan(Decode((uint64_t{1} << bits) - 1, f))) << Name(f);
  }
}

TEST(HipRuntime, EveryFailedCallIsNamed) {
  {
    ScopedEnv env("ATTEST_FAKE_HIP_FAIL", "hipStreamCreate:2");
    auto device = HipDevice::Open(0, ATTEST_FAKE_HIP);
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.error().message, "hipStreamCreate returned hipErrorOutOfMemory (2)");
  }
  auto device = HipDevice::Open(0, ATTEST_FAKE_HIP);
  ASSERT_TRUE(device.ok()) << device.error().message;
  HipDevice& d = **device;
  {
    ScopedEnv env("ATTEST_FAKE_HIP_FAIL", "hipMalloc:2");
    auto buffer = d.Allocate(128, "dk");
    ASSERT_FALSE(buffer.ok());
    EXPECT_EQ(buffer.error().message,
              "hipMalloc(128 bytes) for dk returned hipErrorOutOfMemory (2)");
  }
  auto buffer = d.Allocate(16, "dv");
  ASSERT_TRUE(buffer.ok());
  char host[16] = {};
  {
    ScopedEnv env("ATTEST_FAKE_HIP_FAIL", "hipMemcpy:700");
    Status s = d.CopyToDevice(*buffer, host, 16, "v");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message,
              "hipMemcpy(host to device) for v returned hipErrorIllegalAddress (700): an "
              "illegal memory access was encountered");
    Status t = d.CopyToHost(host, *buffer, 16, "dv");
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(StartsWith(t.error().message, "hipMemcpy(device to host) for dv returned "));
  }
  {
    ScopedEnv env("ATTEST_FAKE_HIP_FAIL", "hipMemset:1");
    Status s = d.FillNaN(*buffer, "dv");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message, "hipMemset(NaN fill) for dv returned hipErrorInvalidValue (1)");
  }
  // A kernel's device fault surfaces at synchronisation, named after the call it followed.
  for (const char* call : {"hipStreamSynchronize", "hipDeviceSynchronize", "hipGetLastError"}) {
    ScopedEnv env("ATTEST_FAKE_HIP_FAIL", (std::string(call) + ":700").c_str());
    Status s = d.Synchronize("forward");
    ASSERT_FALSE(s.ok()) << call;
    EXPECT_EQ(s.error().message, std::string(call) +
                                     " after forward returned hipErrorIllegalAddress (700): an "
                                     "illegal memory access was encountered");
  }
  EXPECT_TRUE(d.Synchronize("forward").ok());
}

}  // namespace
}  // namespace attest
