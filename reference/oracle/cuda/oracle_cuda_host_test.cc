// The CUDA oracle's host wrapper (oracle_cuda_host.h) where there may be no library or GPU:
// a missing library and a machine without a GPU give a std::runtime_error that says so; bad
// inputs give std::invalid_argument naming the tensor, before anything is loaded. With
// ATTEST_ORACLE_CUDA_TEST_LIBRARY set (by ctest when the library is built) and a GPU present,
// a small problem must agree with the CPU oracle within the certification bounds. Through the
// CPU-emulated library (ATTEST_ORACLE_CUDA_EMULATED), the C interface itself: device pointers
// (host memory there) give the bits host pointers give, and a bad problem is an error code
// with a message naming the field, and a GPU older than compute capability 8.0 (the emulated
// library standing for one) counts as no usable device, with the reason. Learnable sinks,
// learnable relative biases and paged or seqused problems are declined, and the CPU oracle runs
// them.
#include "reference/oracle/cuda/oracle_cuda_host.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>
#include <functional>
#include <stdexcept>
#include <string>

#include "reference/oracle/cuda/oracle_cuda.h"
#include "reference/oracle/oracle_test_util.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

using oracle_test::Base;
using oracle_test::MaxAbsDiff;
using oracle_test::RandomInputs;

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(OracleCudaHostTest, MissingLibraryIsAClearError) {
  const Problem p = Base(1, 1, 1, 3, 4, 8, 8);
  const auto in = RandomInputs(p, 1);
  CudaOracleOptions options;
  options.library = "/nonexistent/libattest_oracle_cuda.so";
  EXPECT_THROW(CudaForward(p, in.q, in.k, in.v, options), std::runtime_error);
  const std::string what = ErrorOf([&] { CudaForward(p, in.q, in.k, in.v, options); });
  EXPECT_NE(what.find("cannot load libattest_oracle_cuda.so"), std::string::npos) << what;
  EXPECT_NE(what.find("/nonexistent/libattest_oracle_cuda.so"), std::string::npos) << what;
  EXPECT_NE(what.find("ATTEST_ORACLE_CUDA"), std::string::npos) << what;
}

TEST(OracleCudaHostTest, BadInputsNameTheTensorBeforeLoading) {
  const Problem p = Base(1, 1, 1, 3, 4, 8, 8);
  const auto in = RandomInputs(p, 2);
  CudaOracleOptions options;
  options.library = "/nonexistent/libattest_oracle_cuda.so";
  const std::string what = ErrorOf([&] { CudaForward(p, in.k, in.k, in.v, options); });
  EXPECT_NE(what.find("q"), std::string::npos) << what;
  EXPECT_THROW(CudaForward(p, in.k, in.k, in.v, options), std::invalid_argument);
}

TEST(OracleCudaHostTest, LearnableSinksAreDeclinedAndRunOnTheCpuOracle) {
  // oracle_cuda_host.h: CudaForward / CudaBackward decline a problem with a sink (naming
  // problem.sink, before loading anything); OracleForwardOn / OracleBackwardOn run it on the
  // CPU oracle even with GPU options (here a library that does not exist).
  Problem p = Base(1, 2, 1, 5, 4, 8, 8);
  p.causal = true;
  p.sink = true;
  const auto in = RandomInputs(p, 4);
  const Tensor sink = Tensor::FromF64({2}, {0.5, -1.0});
  CudaOracleOptions options;
  options.library = "/nonexistent/libattest_oracle_cuda.so";
  EXPECT_THROW(CudaForward(p, in.q, in.k, in.v, options), std::invalid_argument);
  const std::string what = ErrorOf([&] { CudaBackward(p, in.q, in.k, in.v, in.dout, options); });
  EXPECT_NE(what.find("problem.sink: the CUDA oracle declines learnable sinks"),
            std::string::npos)
      << what;
  OracleOptions cpu;
  cpu.sink = &sink;
  const BackwardOut on = OracleBackwardOn(&options, p, in.q, in.k, in.v, in.dout, cpu);
  const BackwardOut want = Backward<double>(p, in.q, in.k, in.v, in.dout, cpu);
  EXPECT_TRUE(on.dsink.BitwiseEqual(want.dsink) && on.dq.BitwiseEqual(want.dq));
  const ForwardOut f = OracleForwardOn(&options, p, in.q, in.k, in.v, cpu);
  EXPECT_TRUE(f.lse.BitwiseEqual(want.lse));
}

TEST(OracleCudaHostTest, LearnableRelativeBiasesAreDeclinedAndRunOnTheCpuOracle) {
  Problem p = Base(1, 2, 1, 5, 4, 8, 8);
  p.rel_bias = true;
  const auto in = RandomInputs(p, 5);
  std::vector<double> table(16);
  for (size_t e = 0; e < table.size(); ++e) table[e] = 0.25 * static_cast<double>(e) - 1.0;
  const Tensor bias = Tensor::FromF64(p.RelBiasShape(), table);
  CudaOracleOptions options;
  options.library = "/nonexistent/libattest_oracle_cuda.so";
  const std::string what = ErrorOf([&] { CudaForward(p, in.q, in.k, in.v, options); });
  EXPECT_NE(what.find("problem.rel_bias: the CUDA oracle declines learnable relative biases"),
            std::string::npos)
      << what;
  OracleOptions cpu;
  cpu.rel_bias = &bias;
  const BackwardOut on = OracleBackwardOn(&options, p, in.q, in.k, in.v, in.dout, cpu);
  const BackwardOut want = Backward<double>(p, in.q, in.k, in.v, in.dout, cpu);
  EXPECT_TRUE(on.drel_bias.BitwiseEqual(want.drel_bias) && on.dq.BitwiseEqual(want.dq));
  EXPECT_TRUE(OracleForwardOn(&options, p, in.q, in.k, in.v, cpu).o.BitwiseEqual(want.o));
}

TEST(OracleCudaHostTest, PagedAndSequsedProblemsAreDeclinedAndRunOnTheCpuOracle) {
  // The same for paged KV and seqused (docs/semantics.md "Paged KV and seqused").
  Problem p = Base(2, 2, 1, 5, 9, 8, 8);
  p.causal = true;
  p.page_size = 4;
  p.seqused_k = std::vector<int32_t>{9, 3};
  FillPagedDefaults(p);
  const auto in = RandomInputs(p, 5);
  CudaOracleOptions options;
  options.library = "/nonexistent/libattest_oracle_cuda.so";
  const std::string what = ErrorOf([&] { CudaForward(p, in.q, in.k, in.v, options); });
  EXPECT_NE(what.find("the CUDA oracle declines paged and seqused problems"), std::string::npos)
      << what;
  EXPECT_THROW(CudaBackward(p, in.q, in.k, in.v, in.dout, options), std::invalid_argument);
  const BackwardOut on = OracleBackwardOn(&options, p, in.q, in.k, in.v, in.dout, {});
  const BackwardOut want = Backward<double>(p, in.q, in.k, in.v, in.dout);
  EXPECT_TRUE(on.dk.BitwiseEqual(want.dk) && on.dq.BitwiseEqual(want.dq));
  EXPECT_TRUE(OracleForwardOn(&options, p, in.q, in.k, in.v, {}).o.BitwiseEqual(want.o));
}

TEST(OracleCudaHostTest, BuiltLibraryRunsOrSaysThereIsNoGpu) {
  const char* library = std::getenv("ATTEST_ORACLE_CUDA_TEST_LIBRARY");
  if (library == nullptr || *library == '\0') GTEST_SKIP() << "the CUDA oracle is not built";
  CudaOracleOptions options;
  options.library = library;
  EXPECT_EQ(CudaOracleLibrary(options), library);
  Problem p = Base(1, 2, 1, 37, 41, 16, 8);
  p.causal = true;
  const auto in = RandomInputs(p, 3);
  BackwardOut gpu;
  try {
    gpu = CudaBackward(p, in.q, in.k, in.v, in.dout, options);
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no usable GPU"), std::string::npos) << what;
    return;
  }
  const BackwardOut cpu = Backward<double>(p, in.q, in.k, in.v, in.dout);
  EXPECT_LE(MaxAbsDiff(gpu.o, cpu.o), 2 * ErrorBound(cpu.stats, OracleTensor::kO));
  EXPECT_LE(MaxAbsDiff(gpu.dq, cpu.dq), 2 * ErrorBound(cpu.stats, OracleTensor::kDq));
  EXPECT_LE(MaxAbsDiff(gpu.dk, cpu.dk), 2 * ErrorBound(cpu.stats, OracleTensor::kDk));
  EXPECT_LE(MaxAbsDiff(gpu.dv, cpu.dv), 2 * ErrorBound(cpu.stats, OracleTensor::kDv));
  EXPECT_EQ(gpu.stats.empty_rows, cpu.stats.empty_rows);
}

TEST(OracleCudaHostTest, CInterfaceDevicePointersAndErrors) {
  const char* library = std::getenv("ATTEST_ORACLE_CUDA_EMULATED");
  if (library == nullptr || *library == '\0') GTEST_SKIP() << "no emulated library given";
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto run = reinterpret_cast<decltype(&attest_oracle_cuda_run)>(
      dlsym(handle, "attest_oracle_cuda_run"));
  ASSERT_NE(run, nullptr);
  Problem p = Base(2, 4, 2, 21, 37, 16, 8);
  p.causal = true;
  const auto in = RandomInputs(p, 5);
  AttestOracleCudaProblem c{};
  c.batch = p.batch;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.seqlen_q = p.seqlen_q;
  c.seqlen_k = p.seqlen_k;
  c.head_dim = p.head_dim;
  c.head_dim_v = p.head_dim_v;
  c.scale = p.EffectiveScale();
  c.causal = 1;
  c.window_left = c.window_right = -1;
  const auto n = [](const Shape& s) { return static_cast<size_t>(Tensor::NumElements(s)); };
  struct Out {
    std::vector<double> o, lse, dq, dk, dv, delta;
  };
  auto call = [&](int flags, Out& out) {
    out.o.assign(n(p.OShape()), 0);
    out.lse.assign(n(p.LseShape()), 0);
    out.dq.assign(n(p.QShape()), 0);
    out.dk.assign(n(p.KShape()), 0);
    out.dv.assign(n(p.VShape()), 0);
    out.delta.assign(n(p.LseShape()), 0);
    AttestOracleCudaStats stats{};
    char message[256] = {0};
    const int rc = run(&c, in.q.data<double>(), in.k.data<double>(), in.v.data<double>(),
                       in.dout.data<double>(), out.o.data(), out.lse.data(), out.dq.data(),
                       out.dk.data(), out.dv.data(), out.delta.data(), flags, &stats, message,
                       sizeof message);
    EXPECT_EQ(rc, 0) << message;
  };
  Out host, device;
  call(0, host);
  call(ATTEST_ORACLE_CUDA_DEVICE_POINTERS, device);
  for (auto [a, b] : {std::pair{&host.o, &device.o}, {&host.lse, &device.lse},
                      {&host.dq, &device.dq}, {&host.dk, &device.dk}, {&host.dv, &device.dv},
                      {&host.delta, &device.delta}}) {
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(double)), 0);
  }
  c.heads_kv = 3;  // 4 is not a multiple of 3
  char message[256] = {0};
  Out bad;
  bad.o.assign(n(p.OShape()), 0);
  bad.lse.assign(n(p.LseShape()), 0);
  EXPECT_NE(run(&c, in.q.data<double>(), in.k.data<double>(), in.v.data<double>(), nullptr,
                bad.o.data(), bad.lse.data(), nullptr, nullptr, nullptr, nullptr, 0, nullptr,
                message, sizeof message),
            0);
  EXPECT_NE(std::string(message).find("heads_q"), std::string::npos) << message;
  dlclose(handle);
}

// A GPU older than compute capability 8.0 (the emulated library standing for one) is no usable
// device: the count is 0 with the reason, so that --oracle-device auto falls back to the CPU.
TEST(OracleCudaHostTest, OlderGpuIsNoUsableDevice) {
  const char* library = std::getenv("ATTEST_ORACLE_CUDA_EMULATED");
  if (library == nullptr || *library == '\0') GTEST_SKIP() << "no emulated library given";
  CudaOracleOptions options;
  options.library = library;
  std::string why;
  ASSERT_EQ(setenv("ATTEST_ORACLE_CUDA_EMULATE_CC", "7.5", 1), 0);
  EXPECT_EQ(CudaDeviceCount(&why, options), 0);
  EXPECT_NE(why.find("compute capability 7.5; the CUDA oracle needs 8.0"), std::string::npos)
      << why;
  ASSERT_EQ(setenv("ATTEST_ORACLE_CUDA_EMULATE_CC", "8.0", 1), 0);
  why.clear();
  EXPECT_EQ(CudaDeviceCount(&why, options), 1) << why;
  ASSERT_EQ(unsetenv("ATTEST_ORACLE_CUDA_EMULATE_CC"), 0);
  EXPECT_EQ(CudaDeviceCount(&why, options), 1) << why;
}

}  // namespace
}  // namespace attest
