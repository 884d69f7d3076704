// `attest audit`'s three renderings of the same data (docs/audit.md): report.html (one
// self-contained page: inline CSS and SVG charts from svg.h, no script, no network, polyglot
// markup that parses as XML), report.md and report.json. Several results render side by side
// (`attest audit --compare K1 K2 ...`): every chart carries one series per kernel beside the
// baseline, and every table one block per kernel.
#pragma once

#include <span>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "run/audit/audit.h"

namespace attest {

// {"tool", "baseline", "passed", "kernels": [{"kernel", "description", "profile", "recipe",
//  "passed", "failures", "leaks", "seconds", "seed", "plan", "sweeps": {"seqlen", "head_dim",
//  "distribution"}, "leak_maps", "non_interference", "consistency", "bias", "verdicts"}]}.
// Non-finite numbers are the strings "inf", "-inf", "nan" (as in verify/report/report.h).
nlohmann::json AuditToJson(std::span<const AuditResult> results);
std::string AuditToMarkdown(std::span<const AuditResult> results);
std::string AuditToHtml(std::span<const AuditResult> results);

// The ids of the charts AuditToHtml draws for `results` (what a screenshot test expects to
// find), in page order.
std::vector<std::string> AuditPlotIds(std::span<const AuditResult> results);

}  // namespace attest
