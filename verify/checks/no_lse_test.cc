// Checks honour Capabilities::lse (kernels/kernel.h): a correct kernel whose forward returns
// no lse (cpu/flash2-bf16 behind kernels/no_lse_test_kernel.h) passes the quick suite and the
// gate with no lse verdict and o and the gradients still judged; the same wrapper around a
// mutant with a wrong o still fails accuracy of o; and a kernel that drops lse while claiming
// it fails unwritten-outputs first, as before the flag existed.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "kernels/no_lse_test_kernel.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

std::unique_ptr<Kernel> WithoutLse(const std::string& inner, bool declare = true) {
  auto k = Kernels().Create(inner);
  EXPECT_TRUE(k.ok()) << (k.ok() ? "" : k.error().message);
  return std::make_unique<NoLseTestKernel>(std::move(k).value(), declare);
}

RunResult RunSuiteOn(Kernel& kernel, const std::string& suite, const std::string& only = "") {
  RunOptions o;
  o.kernel_spec = kernel.name();
  o.only_check = only;
  auto r = RunSuite(kernel, *FindSuite(suite), o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : RunResult{};
}

// Verdicts per tensor, and whether a check judged a tensor at all.
int Count(const RunResult& r, std::string_view check, std::string_view tensor) {
  int n = 0;
  for (const Verdict& v : r.report.verdicts) n += v.check == check && v.tensor == tensor;
  return n;
}
int CountTensor(const RunResult& r, std::string_view tensor) {
  int n = 0;
  for (const Verdict& v : r.report.verdicts) n += v.tensor == tensor;
  return n;
}

TEST(NoLse, ACorrectKernelWithoutLsePassesTheQuickSuiteAndTheGate) {
  auto kernel = WithoutLse("cpu/flash2-bf16");
  ASSERT_FALSE(kernel->capabilities().lse);
  for (const char* suite : {"quick", "gate"}) {
    const RunResult r = RunSuiteOn(*kernel, suite);
    EXPECT_TRUE(r.report.passed()) << suite << "\n" << ToConsole(r.report);
    EXPECT_EQ(CountTensor(r, "lse"), 0) << suite << ": a check judged the lse it never got";
    // o and the gradients are still judged, by every family that judges them.
    for (const char* check : {"accuracy", "special-values", "unwritten-outputs"}) {
      EXPECT_GT(Count(r, check, "o"), 0) << suite << " " << check;
    }
    for (const char* t : {"dq", "dk", "dv"}) EXPECT_GT(Count(r, "accuracy", t), 0) << t;
    EXPECT_GT(Count(r, "consistency", "dk"), 0) << suite;
    EXPECT_GT(Count(r, "non-interference", "o"), 0) << suite;
    EXPECT_GT(Count(r, "determinism", "dq"), 0) << suite;
  }
}

TEST(NoLse, AWrongOStillFailsAccuracyOfO) {
  // Mutants whose forward o is wrong (kernels/mutants/mutants.cc: bug class accuracy).
  for (const char* mutant : {"mutant/store-permutation", "mutant/rowsum-before-p-cast"}) {
    auto kernel = WithoutLse(mutant);
    const RunResult r = RunSuiteOn(*kernel, "quick", "accuracy");
    bool o_fails = false;
    for (const Verdict& v : r.report.verdicts) o_fails |= !v.pass && v.tensor == "o";
    EXPECT_TRUE(o_fails) << mutant << "\n" << ToConsole(r.report);
    EXPECT_EQ(CountTensor(r, "lse"), 0) << mutant;
  }
}

TEST(NoLse, AKernelThatOmitsLseItClaimsFailsUnwrittenOutputsFirst) {
  auto kernel = WithoutLse("cpu/flash2-bf16", /*declare=*/false);
  ASSERT_TRUE(kernel->capabilities().lse);
  const RunResult r = RunSuiteOn(*kernel, "quick");
  ASSERT_FALSE(r.report.passed());
  const Verdict* first = nullptr;
  for (const Verdict& v : r.report.verdicts) {
    if (!v.pass) {
      first = &v;
      break;
    }
  }
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->check, "unwritten-outputs") << ToConsole(r.report);
  EXPECT_EQ(first->tensor, "lse");
  EXPECT_NE(first->message.find("not returned"), std::string::npos) << first->message;
}

}  // namespace
}  // namespace attest
