// A kernel repository's test, built against an installed (and moved) attest: only the public
// headers <attest/check.h> and <attest/gtest.h>; its own plugin built by attest_add_plugin
// passes the quick suite, the same plugin with a seeded bug fails it with the failing
// verdicts printed, and a built-in kernel passes too.
#include <attest/check.h>
#include <attest/gtest.h>

#include <gtest/gtest-spi.h>

namespace {

TEST(Consumer, ItsPluginPassesTheQuickSuite) {
  ATTEST_EXPECT_PASSES(std::string("plugin:") + CONSUMER_PLUGIN, "quick");
}

TEST(Consumer, ItsBrokenPluginFailsWithTheVerdictsPrinted) {
  EXPECT_NONFATAL_FAILURE(
      ATTEST_EXPECT_PASSES(std::string("plugin:") + CONSUMER_PLUGIN_BROKEN, "quick"),
      "FAIL accuracy o margin");
  const attest::CheckResult r =
      attest::RunChecks(std::string("plugin:") + CONSUMER_PLUGIN_BROKEN);
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_FALSE(r.failures().empty());
  EXPECT_NE(r.failures().front().repro.find("attest check --kernel plugin:"), std::string::npos);
}

TEST(Consumer, ABuiltInKernelPasses) { ATTEST_EXPECT_PASSES("cpu/flash2-fp16", "quick"); }

}  // namespace
