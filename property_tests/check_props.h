// Shared body of the per-family properties: a check holds on a case drawn inside a random
// cpu/ model's capabilities (property_tests/*_props_test.cc, one file per check family).
#pragma once

#include <fmt/format.h>
#include <rapidcheck.h>

#include <string>
#include <string_view>
#include <vector>

#include "property_tests/rc_gen.h"
#include "run/suite.h"

namespace attest {

// Draws a model of `models` and a case inside its capabilities, runs `check`, and fails the
// property with the check's message and the case file when the check fails.
inline void CheckHoldsOnModels(std::string_view check_name, const std::vector<std::string>& models,
                               const DrawLimits& limits = {}) {
  const CheckInfo* check = FindCheck(check_name);
  RC_ASSERT(check != nullptr);
  RC_ASSERT(!models.empty());
  const std::string name = *rc::gen::elementOf(models);
  auto kernel = Kernels().Create(name);
  RC_ASSERT(kernel.ok());
  const Case c = *GenCase((*kernel)->capabilities(), limits);
  auto outcome = RunCheckOnCase(**kernel, name, c, *check);
  if (!outcome.ok()) RC_FAIL("harness error: " + outcome.error().message);
  RC_CLASSIFY(outcome->applicable, "applicable");
  if (outcome->failed()) {
    RC_FAIL(fmt::format("{} fails {} on {}: {}\n{}", name, check_name, DescribeProblem(c.problem),
                        outcome->failing.front().message, CaseToText(c)));
  }
}

// The same over every cpu/ model.
inline void CheckHoldsOnCpuModels(std::string_view check_name, const DrawLimits& limits = {}) {
  CheckHoldsOnModels(check_name, CpuModelNames(), limits);
}

}  // namespace attest
