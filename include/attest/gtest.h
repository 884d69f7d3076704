// GoogleTest helpers over <attest/check.h> (installed as <attest/gtest.h>):
//   ATTEST_EXPECT_PASSES("plugin:" + path, "gate");   // non-fatal
//   ATTEST_ASSERT_PASSES("exec:python3 my_worker.py", "quick");
// A failure prints every failing verdict (check, tensor, margin, message) with its one-line
// repro, or the infrastructure error (unknown kernel, a worker that cannot start).
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "attest/check.h"

namespace attest::testing {

// The predicate-formatter behind the macros (GoogleTest "Using a Predicate-Formatter").
inline ::testing::AssertionResult PassesSuite(const char* kernel_expr, const char* suite_expr,
                                              const std::string& kernel,
                                              const std::string& suite) {
  CheckOptions options;
  options.suite = suite;
  const CheckResult r = RunChecks(kernel, options);
  if (r.passed()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "attest suite " << suite_expr << " (" << suite << ") on kernel " << kernel_expr
         << " (" << kernel << ") " << (r.exit_code == 2 ? "could not run" : "failed") << ":\n"
         << r.Summary();
}

}  // namespace attest::testing

#define ATTEST_EXPECT_PASSES(kernel, suite) \
  EXPECT_PRED_FORMAT2(::attest::testing::PassesSuite, kernel, suite)
#define ATTEST_ASSERT_PASSES(kernel, suite) \
  ASSERT_PRED_FORMAT2(::attest::testing::PassesSuite, kernel, suite)
