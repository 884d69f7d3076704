// "did you mean": distances, and the suggestions the command line gives for the typos a new
// user makes (names.h).
#include "reference/names.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace attest {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsSubstitutionsAndTranspositions) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("gate", "gate"), 0);
  EXPECT_EQ(EditDistance("sute", "suite"), 1);     // insertion
  EXPECT_EQ(EditDistance("gatee", "gate"), 1);     // deletion
  EXPECT_EQ(EditDistance("quack", "quick"), 1);    // substitution
  EXPECT_EQ(EditDistance("acuracy", "accuracy"), 1);
  EXPECT_EQ(EditDistance("honsety", "honesty"), 1);  // transposition
  EXPECT_EQ(EditDistance("abc", "xyz"), 3);
}

TEST(DidYouMean, SuggestsTheNearNameOnly) {
  const std::vector<std::string> suites = {"quick", "gate", "full", "long"};
  EXPECT_EQ(DidYouMean("gat", suites), " (did you mean 'gate'?)");
  EXPECT_EQ(DidYouMean("quik", suites), " (did you mean 'quick'?)");
  EXPECT_EQ(DidYouMean("nightly", suites), "");
  const std::vector<std::string> kernels = {"cpu/flash2-bf16", "cpu/flash2-fp16",
                                            "mutant/lse-log2"};
  EXPECT_EQ(DidYouMean("flash2-bf16", kernels), " (did you mean 'cpu/flash2-bf16'?)");
  EXPECT_EQ(DidYouMean("cpu/flash2-bf61", kernels), " (did you mean 'cpu/flash2-bf16'?)");
  EXPECT_EQ(DidYouMean("cpu/flash3-bf16", kernels), " (did you mean 'cpu/flash2-bf16'?)");
  EXPECT_EQ(DidYouMean("--sute", std::vector<std::string>{"--suite", "--seed"}),
            " (did you mean '--suite'?)");
  EXPECT_EQ(DidYouMean("", suites), "");
}

}  // namespace
}  // namespace attest
