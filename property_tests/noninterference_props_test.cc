// Properties of the non-interference check family (verify/checks/noninterference.h) over
// every cpu/ model: outputs of rows that must not see a set of inputs (future keys, keys
// outside the window, other documents or sequences) are bitwise unchanged when those inputs
// are perturbed, on cases drawn inside the model's capabilities. A model whose recipe shares
// scales across positions (reference/recipes/recipe.h SharesScalesAcrossPositions:
// cpu/mxfp8-cudnn, by design) must instead be caught leaking, like a mutant.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <vector>

#include "property_tests/check_props.h"
#include "run/fuzz.h"
#include "reference/recipes/recipe.h"

namespace attest {
namespace {

bool LeaksByDesign(const std::string& model) {
  auto kernel = Kernels().Create(model);
  if (!kernel.ok()) return false;
  const Recipe* r = FindRecipe((*kernel)->capabilities().recipe);
  return r != nullptr && SharesScalesAcrossPositions(*r);
}

std::vector<std::string> CpuModels(bool leaking) {
  std::vector<std::string> out;
  for (const std::string& m : CpuModelNames()) {
    if (LeaksByDesign(m) == leaking) out.push_back(m);
  }
  return out;
}

RC_GTEST_PROP(NonInterferenceProperties, NoLeakFreeCpuModelLetsAMaskedInputMoveAVisibleOutput,
              ()) {
  CheckHoldsOnModels("non-interference", CpuModels(false));
}

TEST(NonInterferenceProperties, TheModelsThatShareScalesAcrossPositionsAreExactlyCudnn) {
  EXPECT_EQ(CpuModels(true), std::vector<std::string>{"cpu/mxfp8-cudnn"});
  EXPECT_GE(CpuModels(false).size(), 6u);
}

TEST(NonInterferenceProperties, AModelThatSharesScalesAcrossPositionsIsCaughtLeaking) {
  // A bounded search, as for a mutant (mutation_kill_test): within 60 drawn cases the check
  // must find the leak that the recipe has by construction.
  for (const std::string& model : CpuModels(true)) {
    auto kernel = Kernels().Create(model);
    ASSERT_TRUE(kernel.ok()) << model;
    FuzzOptions o;
    o.kernel_spec = model;
    o.seed = 20261202;
    o.cases = 60;
    o.checks = {"non-interference"};
    o.shrink = false;
    o.max_failures = 1;
    auto report = RunFuzz(**kernel, o);
    ASSERT_TRUE(report.ok()) << report.error().message;
    ASSERT_FALSE(report->failures.empty()) << model << ": no leak found in 60 cases";
    std::printf("%s leaks at case %lld: %s\n", model.c_str(),
                static_cast<long long>(report->failures.front().case_index),
                report->failures.front().message.c_str());
  }
}

}  // namespace
}  // namespace attest
