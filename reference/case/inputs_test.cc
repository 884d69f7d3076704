// Case inputs (inputs.h): a case whose problem is over the memory budget
// (reference/problem/budget.h) is refused before its inputs are allocated, with the fields that
// make it large. Built into case_file_test.
#include "reference/case/inputs.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>

namespace attest {
namespace {

TEST(CaseInputs, RefusesAnOverBudgetCaseBeforeAllocating) {
  ::unsetenv("ATTEST_MEMORY_BUDGET");
  Case c;
  c.problem.batch = 1000000;
  c.problem.head_dim = c.problem.head_dim_v = 64;
  c.generator = GeneratorSpec{"gaussian", 1, nlohmann::json::object()};
  const auto t0 = std::chrono::steady_clock::now();
  auto in = MakeCaseInputs(c);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.error().message.find("batch 1000000"), std::string::npos) << in.error().message;
  EXPECT_NE(in.error().message.find("over the 8 GiB memory budget (ATTEST_MEMORY_BUDGET"),
            std::string::npos)
      << in.error().message;
}

}  // namespace
}  // namespace attest
