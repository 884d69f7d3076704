// The CUDA oracle's host wrapper (oracle_cuda_host.h) where there may be no library or GPU:
// a missing library and a machine without a GPU give a std::runtime_error that says so; bad
// inputs give std::invalid_argument naming the tensor, before anything is loaded. With
// ATTEST_ORACLE_CUDA_TEST_LIBRARY set (by ctest when the library is built) and a GPU present,
// a small problem must agree with the CPU oracle within the certification bounds.
#include "reference/oracle/cuda/oracle_cuda_host.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

#include "reference/oracle/oracle_test_util.h"

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

}  // namespace
}  // namespace attest
