// The public API of include/attest/check.h over the run layer (run/check_run.h): what
// `attest check` does (tools/attest/cmd_check.cc), returned as values instead of printed.
#include "attest/check.h"

#include <cmath>
#include <exception>

#include <fmt/format.h>

#include "kernels/builtin.h"
#include "run/check_run.h"
#include "verify/report/exit_codes.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

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
  CheckRequest request;
  request.kernel_spec = kernel_spec;
  request.suite = options.suite;
  request.seed = options.seed;
  request.only_check = options.only_check;
  if (!options.failure_dir.empty()) request.failure_dir = options.failure_dir;
  request.threads = options.threads;
  request.oracle_device = options.oracle_device;
  if (options.time_budget_s > 0) request.time_budget_s = options.time_budget_s;
  request.max_skipped = options.max_skipped;
  request.allow_skips = options.allow_skips;
  const CheckFieldNames fields{"suite", "only_check", "max_skipped", "oracle_device"};
  try {
    ValidateCheckNames(request, fields);
    auto kernel = Kernels().Create(kernel_spec);
    if (!kernel.ok()) return usage(kernel.error().message);
    const PreparedCheck prepared = PrepareCheck(request, **kernel, fields);
    auto run = RunCheckSuite(**kernel, *prepared.suite, prepared.options, prepared.policy);
    if (!run.ok()) return usage(run.error().message);
    const Report& report = run->report;
    for (const Verdict& v : report.verdicts) {
      result.verdicts.push_back(
          {v.check, v.tensor, v.policy, v.pass, v.margin, v.message, v.repro});
    }
    result.skipped_rows = static_cast<int>(report.skipped.size());
    result.seconds = run->seconds;
    result.json = ToJsonText(report);
    result.exit_code = report.passed() ? kExitPass : kExitFinding;
  } catch (const UsageError& e) {
    return usage(e.what());
  } catch (const std::exception& e) {  // a harness fault, never the kernel's (RunSuite)
    return usage(std::string("attest: ") + e.what());
  }
  return result;
}

}  // namespace attest
