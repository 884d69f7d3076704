// The coverage guard (see coverage.h).
#include "run/coverage.h"

#include <fmt/format.h>

#include <algorithm>

#include "verify/checks/check.h"

namespace attest {

bool ReturnsLse(const Capabilities& caps) {
  // A kernel may declare "lse": false (an API such as PyTorch's public
  // scaled_dot_product_attention returns o alone); then accuracy of lse cannot be required.
  return caps.lse;
}

std::vector<std::pair<std::string, std::string>> RequiredFamilies(const Capabilities& caps,
                                                                  std::string_view only_check,
                                                                  bool forward_only) {
  std::vector<std::pair<std::string, std::string>> out = {{"accuracy", "o"}};
  if (ReturnsLse(caps)) out.push_back({"accuracy", "lse"});
  if (caps.backward && !forward_only) {
    for (const char* t : {"dq", "dk", "dv"}) out.push_back({"accuracy", t});
  }
  if (!only_check.empty()) {
    std::erase_if(out, [&](const auto& f) { return f.first != only_check; });
  }
  return out;
}

std::vector<FamilyCount> CountFamilies(
    const Report& report, const std::vector<std::pair<std::string, std::string>>& required) {
  std::vector<FamilyCount> out;
  auto find = [&](std::string_view check, std::string_view tensor) -> FamilyCount& {
    for (FamilyCount& f : out) {
      if (f.check == check && f.tensor == tensor) return f;
    }
    out.push_back({std::string(check), std::string(tensor)});
    return out.back();
  };
  for (const Verdict& v : report.verdicts) {
    if (v.check == kCoverageCheck) continue;
    FamilyCount& f = find(v.check, v.tensor);
    ++f.verdicts;
    f.failed += v.pass ? 0 : 1;
  }
  for (const auto& [check, tensor] : required) find(check, tensor).required = true;
  return out;
}

void ApplyCoverageGuard(Report& report, const CoveragePolicy& policy) {
  if (!report.capabilities) return;
  const auto required =
      RequiredFamilies(*report.capabilities, policy.only_check, policy.forward_only);
  report.coverage = CountFamilies(report, required);
  int64_t kernel_errors = 0;
  for (const Verdict& v : report.verdicts) kernel_errors += v.check == kKernelErrorCheck ? 1 : 0;
  const std::string accepted = policy.allow_skips ? " (accepted: --allow-skips)" : "";
  std::vector<Verdict> out;
  // 1. Every required family judged at least once.
  for (const FamilyCount& f : report.coverage) {
    if (!f.required) continue;
    const std::string family = fmt::format("{}/{}", f.check, f.tensor);
    const std::string policy_text = "every required family produces verdicts";
    if (f.verdicts > 0) {
      out.push_back(Passing(kCoverageCheck, family, policy_text,
                            fmt::format("{}: {} verdicts", family, f.verdicts)));
      continue;
    }
    // The message does not name the family, so that a console groups the families that
    // share one cause.
    std::string message =
        fmt::format("no verdict: {} of {} rows skipped", report.skipped.size(), report.rows);
    message += kernel_errors > 0 ? fmt::format(", {} cases ended in a kernel error", kernel_errors)
                                 : std::string("; the kernel's capabilities leave it unjudged");
    message += accepted;
    out.push_back(policy.allow_skips ? Passing(kCoverageCheck, family, policy_text, message)
                                     : Failure(kCoverageCheck, family, policy_text, message));
  }
  // A forward-only suite says which families it leaves to the others.
  if (policy.forward_only && report.capabilities->backward) {
    for (const char* t : {"dq", "dk", "dv"}) {
      if (!policy.only_check.empty() && policy.only_check != "accuracy") continue;
      out.push_back(Passing(kCoverageCheck, fmt::format("accuracy/{}", t),
                            "every required family produces verdicts",
                            fmt::format("accuracy/{}: not judged by this suite (forward only: "
                                        "sampled rows, docs/checks.md)",
                                        t)));
    }
  }
  // 2. The skipped share within the bound.
  const double share = report.rows > 0 ? static_cast<double>(report.skipped.size()) /
                                             static_cast<double>(report.rows)
                                       : 0.0;
  // Under --allow-skips any share is allowed: the margin stays a share of 1.
  const double bound = policy.allow_skips ? 1.0 : policy.max_skipped_share;
  Verdict v = Passing(kCoverageCheck, "skipped-rows",
                      fmt::format("at most {:.0f} % of rows skipped{}", 100 * bound,
                                  policy.allow_skips ? " (--allow-skips)" : ""));
  v.observed = share;
  v.allowed = bound;
  v.margin = Margin(share, bound);
  v.message = fmt::format("{} of {} rows skipped ({:.0f} %)", report.skipped.size(), report.rows,
                          100 * share);
  if (share > policy.max_skipped_share) {
    v.message += "; -v or the report's skipped list says why" + accepted;
    v.pass = policy.allow_skips;
  }
  out.push_back(std::move(v));
  for (Verdict& o : out) report.verdicts.push_back(std::move(o));
}

}  // namespace attest
