// Report writers: the console (the failures in full, one summary table of check x tensor, the
// verdict line last), JSON (docs/report.schema.json), JUnit XML as CI systems read it (one
// testcase per verdict under a unique, stable name; <skipped> for skipped rows, <error> for
// kernel errors and for a run that ended in an infrastructure error; checked against
// verify/report/testdata/junit.xsd) and Markdown. Failures carry their repro line.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "reference/case/case_file.h"
#include "reference/status.h"
#include "verify/tolerance/verdict.h"

namespace attest {

// How much the console shows. Every level ends with the verdict line.
enum class Verbosity {
  kQuiet,    // the verdict line alone
  kDefault,  // the failures in full (kernel errors grouped by message), the summary table
  kVerbose,  // every verdict and every skipped row, then the summary table
};

// The console report at `verbosity`. The verdict line, e.g.
//   "FAIL: 3 of 665 verdicts failed, in 2 of 11 checks (kernel K, suite gate, seed 0; 51 of
//    716 rows skipped; 17.0 s); diagnosis: accuracy o margin 3.2"
std::string ToConsole(const Report& report, Verbosity verbosity = Verbosity::kVerbose);
// The verdict line alone (no newline).
std::string VerdictLine(const Report& report);
// The summary table, check x tensor: one row per check (diagnosis order) with its verdict and
// failure counts, the worst margin on each of o, lse, dq, dk, dv (and on anything else), and
// where the check's worst margin was (tensor, case label, location).
std::string SummaryTable(const Report& report);

// The failing verdict of lowest check.h DiagnosisRank (in a report of RunSuite, which sorts
// by it, the first failing one), or nullptr: the diagnosis of the run. Console and JSON
// reports name it ("first_failure").
const Verdict* FirstFailure(const Report& report);

// Counts of a report as its verdict line states them: verdicts and failing verdicts, checks
// (distinct Verdict::check values, kernel-error included) and failing checks, distinct cases
// judged, kernel errors; the coverage guard's verdicts apart (they judge the run, not the
// kernel).
struct ReportCounts {
  int64_t verdicts = 0, failed_verdicts = 0;
  int64_t checks = 0, failed_checks = 0;
  int64_t cases = 0;
  int64_t kernel_errors = 0;
  int64_t coverage_verdicts = 0, coverage_failed = 0;
};
ReportCounts CountReport(const Report& report);

// The JSON report, docs/report.schema.json (schema_version 1): the attest that wrote it
// (version, commit), kernel and its capabilities, suite, seed, the outcome and its counts,
// every verdict with its case as fields (problem, generator or inputs, label, saved file),
// the skipped rows, the coverage counts. Numbers are always JSON numbers: a quantity that has
// no finite value (an infinite margin, a NaN observation) or does not apply (a coordinate of
// a location without one) is null.
nlohmann::json ToJson(const Report& report);
// The JSON report as every front end writes it (`attest check --json`, attest.check(...).json,
// RunChecks' CheckResult::json): ToJson indented by 2, invalid UTF-8 in messages replaced,
// a final newline.
std::string ToJsonText(const Report& report);
inline constexpr int kReportSchemaVersion = 1;
// Testcase names of the verdicts (index i names report.verdicts[i]), then of the skipped
// rows: "<check>/<tensor> [<case label>]" ("<check> [<label>]" without a tensor), with
// " #2", " #3", ... on repeats, so that every name of a report is distinct and the same run
// gives the same names on any machine.
std::vector<std::string> TestcaseNames(const Report& report);
std::string ToJUnitXml(const Report& report);
std::string ToMarkdown(const Report& report);

// Text escaped for XML 1.0 character data and attribute values: & < > " ' as entities;
// characters XML 1.0 cannot hold (C0 controls other than tab/newline/CR, ill-formed UTF-8)
// as a visible "\xNN".
std::string XmlEscape(std::string_view text);

// Writes `text` to `path` whole or not at all (reference/io/files.h WriteFileAtomic), naming
// the path on failure.
Status WriteTextFile(const std::filesystem::path& path, std::string_view text);

// Saves the failing case under `dir` as "<kernel>-<check>-<tensor>-<hash>.case.json" (names
// sanitised to [A-Za-z0-9._-]) and returns its path; the hash is of the case's canonical
// text, so the same failure writes the same file.
Expected<std::filesystem::path> SaveFailureCase(const Case& c, const std::filesystem::path& dir,
                                                std::string_view kernel, const Verdict& verdict);

}  // namespace attest
