// The bias check (docs/checks.md "Bias"): the mean signed error of o, lse (where judged), dq,
// dk and dv against the float64 oracle, in ulps of the kernel's output format, is the mean the
// kernel's recipe implies, within a tolerance, by a t-test on row means whose false-alarm
// probability per verdict is stated (verify/metrics/bias.h). The expected bias is the recipe
// reference's (verify/tolerance/baseline.h RecipeReferenceForward/Backward: the recipe's
// roundings, in their declared directions, and float64 everywhere else) on the same inputs:
// about zero for a recipe that rounds to nearest, and what its declared directed roundings
// (reference/recipes/recipe.h Recipe::output_rounding, OperandScheme::rounding) imply
// otherwise. The recipe is the kernel's declared one, else its dtype's FlashAttention-2 recipe
// (as the consistency check takes it); a kernel that declares only a low-precision family
// profile, a sampled case, inputs of a generator other than `gaussian` (rows that share
// structure are not independent samples) and a tensor below the minimum sample abstain, with
// the reason.
#pragma once

#include <vector>

#include "verify/checks/check.h"
#include "verify/metrics/bias.h"

namespace attest {

// The check's name, as registered.
inline constexpr std::string_view kBiasCheck = "bias";

// Runs the check on ctx's case with `options` (BiasOptions{}: the registered check's).
std::vector<Verdict> CheckBias(CheckContext& ctx, const BiasOptions& options);
std::vector<Verdict> RunBias(CheckContext& ctx);

}  // namespace attest
