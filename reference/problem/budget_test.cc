// The memory budget (budget.h): estimates from the sizes, refusals naming the fields and the
// ATTEST_MEMORY_BUDGET override (reference/case/inputs_test.cc: a case over the budget is
// refused before its inputs are allocated).
#include "reference/problem/budget.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace attest {
namespace {

TEST(MemoryBudget, ParsesByteCounts) {
  EXPECT_EQ(*ParseByteCount("1024"), 1024u);
  EXPECT_EQ(*ParseByteCount("8G"), uint64_t{8} << 30);
  EXPECT_EQ(*ParseByteCount("512MiB"), uint64_t{512} << 20);
  for (const char* bad :
       {"", "-1", "1.5G", "8X", "G", "0", "99999999999999999999", "20000000000T", " 8G"}) {
    EXPECT_FALSE(ParseByteCount(bad).ok()) << bad;
  }
}

TEST(MemoryBudget, EstimatesFromTheSizesAndSaturates) {
  Problem p;
  p.batch = 2;
  p.heads_q = p.heads_kv = 1;
  p.seqlen_q = p.seqlen_k = 4;
  p.head_dim = p.head_dim_v = 8;
  // q, dq, o, do, k, dk, v, dv: 8 tensors of 2*4*8 elements, lse 2*4; f64, 4 copies.
  EXPECT_EQ(EstimatedProblemBytes(p), (8u * 64 + 8) * 8 * kWorkingCopies);
  p.batch = p.seqlen_q = p.seqlen_k = p.head_dim = p.head_dim_v = 2147483647;
  p.heads_q = p.heads_kv = 2147483647;
  EXPECT_EQ(EstimatedProblemBytes(p), UINT64_MAX);
}

TEST(MemoryBudget, RefusesNamingTheFields) {
  ::unsetenv("ATTEST_MEMORY_BUDGET");
  Problem p;
  p.batch = 1000000;
  p.head_dim = p.head_dim_v = 64;
  const Status refused = CheckProblemBudget(p);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("batch 1000000"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("over the 8 GiB memory budget (ATTEST_MEMORY_BUDGET"),
            std::string::npos)
      << refused.error().message;
  // The variable raises (or lowers) it; a malformed value is an error naming it.
  ::setenv("ATTEST_MEMORY_BUDGET", "64G", 1);
  EXPECT_TRUE(CheckProblemBudget(p).ok());
  ::setenv("ATTEST_MEMORY_BUDGET", "1K", 1);
  p.batch = 1;
  EXPECT_FALSE(CheckProblemBudget(p).ok());
  ::setenv("ATTEST_MEMORY_BUDGET", "lots", 1);
  auto bad = CheckProblemBudget(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("ATTEST_MEMORY_BUDGET: 'lots'", 0), 0u);
  ::unsetenv("ATTEST_MEMORY_BUDGET");
}

}  // namespace
}  // namespace attest
