// The public API (include/attest/check.h, include/attest/gtest.h) as a kernel repository
// uses it: ATTEST_EXPECT_PASSES holds for a correct kernel, and fails for a mutant printing
// every failing verdict with its repro, and for an unknown kernel printing the error.
#include <attest/check.h>
#include <attest/gtest.h>

#include <gtest/gtest-spi.h>

namespace {

TEST(PublicApi, ACorrectKernelPasses) {
  ATTEST_EXPECT_PASSES("cpu/flash2-bf16", "quick");
  const attest::CheckResult r = attest::RunChecks("cpu/flash2-bf16");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_GT(r.verdicts.size(), 50u);
  EXPECT_TRUE(r.failures().empty());
  EXPECT_NE(r.Summary().find("PASS: 0 of"), std::string::npos) << r.Summary();
}

TEST(PublicApi, AMutantFailsWithItsVerdictsAndRepro) {
  // mutant/lse-log2 writes lse in base 2 (kernels/mutants/mutants.cc): accuracy of lse.
  EXPECT_NONFATAL_FAILURE(ATTEST_EXPECT_PASSES("mutant/lse-log2", "quick"),
                          "FAIL accuracy lse margin");
  EXPECT_NONFATAL_FAILURE(ATTEST_EXPECT_PASSES("mutant/lse-log2", "quick"),
                          "repro: attest check --kernel mutant/lse-log2 --suite quick");
  attest::CheckOptions o;
  o.only_check = "accuracy";
  const attest::CheckResult r = attest::RunChecks("mutant/lse-log2", o);
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_FALSE(r.failures().empty());
  EXPECT_EQ(r.failures().front().check, "accuracy");
  EXPECT_EQ(r.failures().front().tensor, "lse");
}

TEST(PublicApi, AnUnknownKernelOrSuiteIsAnErrorNamingIt) {
  EXPECT_NONFATAL_FAILURE(ATTEST_EXPECT_PASSES("cpu/no-such-kernel", "quick"),
                          "unknown kernel 'cpu/no-such-kernel'");
  attest::CheckOptions o;
  o.suite = "nightly";
  const attest::CheckResult r = attest::RunChecks("cpu/flash2-bf16", o);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.error.find("suite 'nightly'"), std::string::npos) << r.error;
}

}  // namespace
