// What `attest check` is, for every front end (check_run.h).
#include "run/check_run.h"

#include <string>

#include <fmt/format.h>

#include "run/build_info.h"
#include "reference/names.h"
#include "verify/checks/check.h"
#include "verify/tolerance/tolerance.h"

namespace attest {

namespace {

template <class Rows>
std::vector<std::string> NamesOf(const Rows& rows) {
  std::vector<std::string> names;
  for (const auto& r : rows) names.emplace_back(r.name);
  return names;
}

}  // namespace

const Suite& SuiteNamed(std::string_view name, std::string_view field) {
  const Suite* suite = FindSuite(name);
  if (suite == nullptr) {
    throw UsageError(fmt::format("{}: unknown suite '{}'{} (quick, gate, full, long)", field,
                                 name, DidYouMean(name, NamesOf(AllSuites()))));
  }
  return *suite;
}

void RequireCheck(std::string_view name, std::string_view field) {
  if (!name.empty() && FindCheck(name) == nullptr) {
    throw UsageError(fmt::format("{}: unknown check '{}'{} (see `attest list checks`)", field,
                                 name, DidYouMean(name, NamesOf(AllChecks()))));
  }
}

const Profile& ProfileNamed(std::string_view name, std::string_view field) {
  const Profile* profile = FindProfile(name);
  if (profile == nullptr) {
    throw UsageError(fmt::format("{}: unknown profile '{}'{} (see `attest list profiles`)", field,
                                 name, DidYouMean(name, NamesOf(AllProfiles()))));
  }
  return *profile;
}

CoveragePolicy CoverageFor(double max_skipped, bool allow_skips, std::string_view field) {
  if (!(max_skipped >= 0 && max_skipped <= 1)) {
    throw UsageError(fmt::format("{}: {} is not a share in [0, 1]", field, max_skipped));
  }
  CoveragePolicy policy;
  policy.max_skipped_share = max_skipped;
  policy.allow_skips = allow_skips;
  return policy;
}

std::optional<CudaOracleOptions> OracleDeviceFor(std::string_view choice, const Kernel& kernel,
                                                 std::string_view field, std::string* note) {
  auto r = ResolveOracleDevice(choice, kernel.capabilities(), field, note);
  if (!r.ok()) throw UsageError(r.error().message);
  return *r;
}

Expected<RunResult> RunCheckSuite(Kernel& kernel, const Suite& suite, const RunOptions& options,
                                  CoveragePolicy policy) {
  auto result = RunSuite(kernel, suite, options);
  if (!result.ok()) return result;
  Report& report = result->report;
  report.attest_version = std::string(AttestVersion());
  report.attest_commit = std::string(AttestCommit());
  policy.only_check = options.only_check;
  policy.forward_only = suite.forward_only;
  ApplyCoverageGuard(report, policy);
  return result;
}

void ValidateCheckNames(const CheckRequest& request, const CheckFieldNames& fields) {
  SuiteNamed(request.suite, fields.suite);
  RequireCheck(request.only_check, fields.check);
  CoverageFor(request.max_skipped, request.allow_skips, fields.max_skipped);
}

PreparedCheck PrepareCheck(const CheckRequest& request, const Kernel& kernel,
                           const CheckFieldNames& fields) {
  PreparedCheck out;
  out.suite = &SuiteNamed(request.suite, fields.suite);
  RequireCheck(request.only_check, fields.check);
  out.policy = CoverageFor(request.max_skipped, request.allow_skips, fields.max_skipped);
  RunOptions& ro = out.options;
  ro.kernel_spec = request.kernel_spec;
  ro.seed = request.seed;
  ro.failure_dir = request.failure_dir;
  ro.oracle.threads = request.threads;
  ro.cuda_oracle = OracleDeviceFor(request.oracle_device, kernel, fields.oracle_device,
                                   &out.oracle_note);
  ro.only_check = request.only_check;
  ro.timings = request.timings;
  ro.time_budget_s = request.time_budget_s;
  ro.progress = request.progress;
  return out;
}

}  // namespace attest
