// Tests of the HIP DeviceAdapter (kernels/device/hip_device.h) that plugin calls go through: on
// the host-memory stand-in runtime, and what OpenHipDevice says on this machine.
#include "kernels/device/hip_device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace attest {
namespace {

TEST(HipDeviceAdapter, AllocatesCopiesAndFreesThroughTheRuntime) {
  auto adapter = MakeHipDeviceAdapter(0, ATTEST_FAKE_HIP);
  ASSERT_TRUE(adapter.ok()) << adapter.error().message;
  DeviceAdapter& d = **adapter;
  EXPECT_EQ(d.device_type(), kDeviceHip);
  EXPECT_EQ(d.device_id(), 0);
  EXPECT_NE(d.stream(), nullptr);
  EXPECT_NE(d.Describe().find("attest fake HIP device"), std::string::npos) << d.Describe();
  std::vector<float> host = {0.5f, 1.0f, -7.0f, 1e-30f};
  auto ptr = d.Allocate(host.size() * sizeof(float));
  ASSERT_TRUE(ptr.ok()) << ptr.error().message;
  ASSERT_TRUE(d.CopyToDevice(*ptr, host.data(), host.size() * sizeof(float)).ok());
  std::vector<float> back(host.size());
  ASSERT_TRUE(d.CopyToHost(back.data(), *ptr, back.size() * sizeof(float)).ok());
  EXPECT_EQ(back, host);
  Status over = d.CopyToHost(back.data(), *ptr, (back.size() + 1) * sizeof(float));
  EXPECT_FALSE(over.ok());
  EXPECT_TRUE(d.Synchronize().ok());
  ASSERT_TRUE(d.Free(*ptr).ok());
  // Freed memory is no longer the adapter's: a second free and a copy are refused.
  Status again = d.Free(*ptr);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().message, "hipFree: pointer was not allocated by this HIP adapter");
  EXPECT_FALSE(d.CopyToDevice(*ptr, host.data(), 4).ok());
}

TEST(HipDeviceAdapter, AFailedFreeIsAFinding) {
  auto adapter = MakeHipDeviceAdapter(0, ATTEST_FAKE_HIP);
  ASSERT_TRUE(adapter.ok()) << adapter.error().message;
  auto ptr = (*adapter)->Allocate(8);
  ASSERT_TRUE(ptr.ok());
  setenv("ATTEST_FAKE_HIP_FAIL", "hipFree:700", 1);
  Status s = (*adapter)->Free(*ptr);
  unsetenv("ATTEST_FAKE_HIP_FAIL");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "hipFree returned hipErrorIllegalAddress (700): an illegal memory access was "
            "encountered");
}

// No machine this runs on has an AMD GPU: the cached process adapter says why, the same way
// every time it is asked.
TEST(HipDeviceAdapter, ThisMachineHasNoHipDevice) {
  auto first = OpenHipDevice();
  if (first.ok()) GTEST_SKIP() << "a HIP device exists here: " << (*first)->Describe();
  const std::string& message = first.error().message;
  std::printf("OpenHipDevice: %s\n", message.c_str());
  EXPECT_TRUE(message.rfind("no HIP device: hipGetDeviceCount returned ", 0) == 0 ||
              message.rfind("no HIP runtime: ", 0) == 0)
      << message;
  auto second = OpenHipDevice();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().message, message);
}

}  // namespace
}  // namespace attest
