// Report writers (issue "verify/" item 5): a console line per check with its margin, JSON
// with stable keys, JUnit XML (the Ant/Jenkins schema: testsuites/testsuite/testcase/failure,
// checked against verify/testdata/junit.xsd) and Markdown. Failures carry their repro line.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "reference/problem/case_file.h"
#include "reference/status.h"
#include "verify/verdict.h"

namespace attest {

// One line per verdict: "PASS accuracy o  margin 0.41  err <= 2x baseline + 2 ulp(row)
// worst (b=0, h=1, i=5, d=3) observed ... reference ...", then for each failure its message
// and "  repro: <command>", then a summary line.
std::string ToConsole(const Report& report);
// The failing verdict of lowest check.h DiagnosisRank (in a report of RunSuite, which sorts
// by it, the first failing one), or nullptr: the diagnosis of the run. Console and JSON
// reports name it ("first_failure").
const Verdict* FirstFailure(const Report& report);
// {"kernel", "suite", "seed", "passed", "failures", "verdicts": [{"check", "tensor",
// "policy", "pass", "observed", "allowed", "margin", "worst": {"b", "h", "i", "d", "flat",
// "observed", "reference"}, "message", "repro"}], "first_failure": {"check", "tensor",
// "margin"} or null, "timings": [{"name", "seconds"}]}.
// Non-finite numbers are written as the strings "inf", "-inf", "nan" (JSON has no such
// numbers).
nlohmann::json ToJson(const Report& report);
std::string ToJUnitXml(const Report& report);
std::string ToMarkdown(const Report& report);

// Text escaped for XML 1.0 character data and attribute values: & < > " ' as entities;
// characters XML 1.0 cannot hold (C0 controls other than tab/newline/CR, ill-formed UTF-8)
// as a visible "\xNN".
std::string XmlEscape(std::string_view text);

// Writes `text` to `path` whole or not at all (reference/io/files.h WriteFileAtomic), naming
// the path on failure.
Status WriteTextFile(const std::filesystem::path& path, std::string_view text);

// The one-line repro of a failing check: "attest repro --kernel K --case F".
std::string ReproCommand(std::string_view kernel, const std::filesystem::path& case_file);
// Saves the failing case under `dir` as "<kernel>-<check>-<tensor>-<hash>.case.json" (names
// sanitised to [A-Za-z0-9._-]) and returns its path; the hash is of the case's canonical
// text, so the same failure writes the same file.
Expected<std::filesystem::path> SaveFailureCase(const Case& c, const std::filesystem::path& dir,
                                                std::string_view kernel, const Verdict& verdict);

}  // namespace attest
