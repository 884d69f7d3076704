// What `attest check` is (check_run.h).
#include "tools/attest/check_run.h"

#include <string>

#include <fmt/format.h>

#include "tools/attest/build_info.h"
#include "tools/attest/command.h"
#include "reference/names.h"
#include "verify/checks/check.h"
#include "verify/tolerance.h"

namespace attest::cli {

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

}  // namespace attest::cli
