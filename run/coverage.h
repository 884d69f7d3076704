// The coverage guard of `attest check`: a run passes only if it judged what the kernel
// claims. A kernel whose capabilities leave most suite rows outside (a forward-only f32 MHA
// worker on the quick suite) would otherwise pass on the few rows left, or on none. The guard
// counts the verdicts of every check family (check x tensor), requires the families every
// kernel must be judged on (RequiredFamilies), and bounds the share of skipped rows; what it
// finds are verdicts of class check.h kCoverageCheck, which rank after every finding about
// the kernel itself.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/kernel.h"
#include "verify/tolerance/verdict.h"

namespace attest {

struct CoveragePolicy {
  // The largest share of the run's rows that may be skipped (outside the capabilities, or
  // with nothing to judge on their case). Of the built-in models cpu/fp8-e4m3-tensor (no GQA,
  // no varlen) and cpu/tile64-bf16 (shape limits) skip rows; docs/checks.md "Coverage".
  double max_skipped_share = 0.8;
  // --allow-skips: what is missing is reported (passing coverage verdicts saying so), not a
  // failure.
  bool allow_skips = false;
  // The run was restricted to this check (`--check`): only its families are required.
  std::string only_check;
  // The suite judges the forward only (suite.h Suite::forward_only: the long suite's sampled
  // rows): the backward's families are not required, and a passing verdict per family says so.
  bool forward_only = false;
};

// Whether the kernel returns lse, which makes accuracy of lse a required family.
bool ReturnsLse(const Capabilities& caps);

// The (check, tensor) families a run must produce verdicts for: accuracy of o, of lse when
// the kernel returns it, and of dq, dk, dv when it claims a backward; restricted to
// `only_check` when set; without dq, dk, dv when `forward_only`.
std::vector<std::pair<std::string, std::string>> RequiredFamilies(const Capabilities& caps,
                                                                  std::string_view only_check,
                                                                  bool forward_only = false);

// Verdict counts of every family of `report`, in verdict order, with the required families
// (zero counts included) marked.
std::vector<FamilyCount> CountFamilies(
    const Report& report, const std::vector<std::pair<std::string, std::string>>& required);

// Sets report.coverage and appends the guard's verdicts: one per required family (fails with
// no verdicts), one for the skipped share (fails above the policy's bound). Under
// allow_skips both pass and say what was accepted. Needs report.capabilities (a report
// without them is left as it is).
void ApplyCoverageGuard(Report& report, const CoveragePolicy& policy);

}  // namespace attest
