// The accuracy check (docs/design.md "Checks", first bullet; docs/checks.md): o, lse and,
// for kernels with a backward, dq, dk, dv against the float64 oracle, judged by the kernel's
// tolerance profile (baseline ratio with a ULP floor for bf16/f16/f32, verify/tolerance/tolerance.h),
// localised per element; any NaN/Inf where the oracle is finite fails.
#pragma once

#include <string_view>
#include <vector>

#include "verify/checks/check.h"

namespace attest {

// Judges a kernel's outputs on ctx's case against ctx's oracle with ctx.profile (computing
// the same-precision baseline when the profile needs one). `bwd` may be null (forward only).
// Verdicts are named `check`, so that honesty and special-values can reuse the rule.
std::vector<Verdict> JudgeAgainstOracle(CheckContext& ctx, std::string_view check,
                                        const ForwardResult& fwd, const BackwardResult* bwd);

// The "accuracy" check: the kernel's forward (and backward when it claims one and the case
// has a "do") on the case, judged by JudgeAgainstOracle. Not applicable when the kernel
// honestly refuses a case outside its capabilities.
std::vector<Verdict> RunAccuracy(CheckContext& ctx);

}  // namespace attest
