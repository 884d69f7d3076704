// The public API of include/attest/check.h over the suite runner (verify/run.h): what
// `attest check` does (tools/attest/cmd_check.cc), returned as values instead of printed.
#include "attest/check.h"

#include <cmath>
#include <exception>

#include <fmt/format.h>

#include "kernels/builtin.h"
#include "verify/exit_codes.h"
#include "verify/run.h"
#include "verify/suite.h"

namespace attest {

std::vector<CheckVerdict> CheckResult::failures() const {
  std::vector<CheckVerdict> out;
  for (const CheckVerdict& v : verdicts) {
    if (!v.pass) out.push_back(v);
  }
  return out;
}

std::string CheckResult::Summary() const {
  if (exit_code == kExitUsage) return "error: " + error + "\n";
  std::string out;
  const std::vector<CheckVerdict> failed = failures();
  for (const CheckVerdict& v : failed) {
    out += fmt::format("FAIL {} {} margin {}: {}\n", v.check, v.tensor.empty() ? "-" : v.tensor,
                       std::isinf(v.margin) ? std::string("inf") : fmt::format("{:.3g}", v.margin),
                       v.message);
    if (!v.repro.empty()) out += "  repro: " + v.repro + "\n";
  }
  out += fmt::format("{}: {} of {} verdicts failed{}, {} rows skipped\n",
                     failed.empty() ? "PASS" : "FAIL", failed.size(), verdicts.size(),
                     failed.empty() ? "" : fmt::format(" (first: {})", failed.front().check),
                     skipped_rows);
  return out;
}

CheckResult RunChecks(const std::string& kernel_spec, const CheckOptions& options) {
  CheckResult result;
  auto usage = [&](std::string why) {
    result.exit_code = kExitUsage;
    result.error = std::move(why);
    return result;
  };
  const Suite* suite = FindSuite(options.suite);
  if (suite == nullptr) {
    return usage(fmt::format("suite '{}' is not one of quick, gate, full", options.suite));
  }
  if (!options.only_check.empty() && FindCheck(options.only_check) == nullptr) {
    return usage(fmt::format("check '{}' is not registered (see `attest list checks`)",
                             options.only_check));
  }
  try {
    auto kernel = Kernels().Create(kernel_spec);
    if (!kernel.ok()) return usage(kernel.error().message);
    RunOptions ro;
    ro.kernel_spec = kernel_spec;
    ro.seed = options.seed;
    ro.oracle.threads = options.threads;
    ro.only_check = options.only_check;
    if (!options.failure_dir.empty()) ro.failure_dir = options.failure_dir;
    auto run = RunSuite(**kernel, *suite, ro);
    if (!run.ok()) return usage(run.error().message);
    for (const Verdict& v : run->report.verdicts) {
      result.verdicts.push_back(
          {v.check, v.tensor, v.policy, v.pass, v.margin, v.message, v.repro});
    }
    result.skipped_rows = static_cast<int>(run->report.skipped.size());
    result.seconds = run->seconds;
    result.exit_code = run->report.passed() ? kExitPass : kExitFinding;
  } catch (const std::exception& e) {  // a harness fault, never the kernel's (RunSuite)
    return usage(std::string("attest: ") + e.what());
  }
  return result;
}

}  // namespace attest
