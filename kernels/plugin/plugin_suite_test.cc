// The example plugins through the loader (kernels/plugin/examples/): the CPU build of the
// CUDA example's row code passes the quick suite in f32, bf16 and f16 in an isolated child,
// and each seeded bug of the mutant build fails it with the check that names the bug class.
#include <string>

#include <gtest/gtest.h>

#include "kernels/plugin/plugin.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

std::string Lib(const char* name) { return std::string(ATTEST_PLUGIN_DIR) + "/lib" + name + ".so"; }

// The CPU build of the CUDA example's row code through the loader: the quick suite passes
// for bf16 and f16, and the two seeded bugs are each caught.
Report RunQuick(const std::string& spec) {
  PluginOptions isolated;
  auto k = LoadPluginKernel(spec, isolated);
  EXPECT_TRUE(k.ok()) << (k.ok() ? "" : k.error().message);
  if (!k.ok()) return {};
  RunOptions o;
  o.kernel_spec = "plugin:" + spec;
  auto r = RunSuite(**k, *FindSuite("quick"), o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r->report : Report{};
}

std::string Failures(const Report& r) {
  std::string out;
  for (const Verdict& v : r.verdicts) {
    if (!v.pass) out += v.check + " " + v.tensor + ": " + v.message + "\n";
  }
  return out;
}

TEST(ExamplePlugins, QuickSuitePassesThroughTheLoader) {
  for (const char* name : {"flash-bf16", "flash-f16", "flash-f32"}) {
    const Report r = RunQuick(Lib("attest_example_host") + ":" + name);
    EXPECT_FALSE(r.verdicts.empty()) << name;
    EXPECT_TRUE(r.passed()) << name << "\n" << Failures(r);
  }
}

TEST(ExamplePlugins, QuickSuiteCatchesTheMutants) {
  const Report off = RunQuick(Lib("attest_example_host_mutant") + ":mutant-causal-off-by-one");
  EXPECT_FALSE(off.passed());
  bool leak = false;
  for (const Verdict& v : off.verdicts) leak |= !v.pass && v.check == "non-interference";
  EXPECT_TRUE(leak) << Failures(off);
  const Report rescale = RunQuick(Lib("attest_example_host_mutant") + ":mutant-no-rescale");
  EXPECT_FALSE(rescale.passed());
  bool accuracy = false;
  for (const Verdict& v : rescale.verdicts) accuracy |= !v.pass && v.check == "accuracy";
  EXPECT_TRUE(accuracy) << Failures(rescale);
}

}  // namespace
}  // namespace attest
