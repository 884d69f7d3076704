// Tests of verify/report/report.h: the console (failures, summary table, verdict line last; -v,
// --quiet), JSON with stable keys, numbers as numbers or null and its validation against
// docs/report.schema.json (verify/report/validate_report.py), Markdown escaping, JUnit XML (distinct
// testcase names, skipped, error, times, escaping) and its validation by `xmllint --schema
// verify/report/testdata/junit.xsd` (libxml2-utils), plus the failure-case writer.
#include "verify/report/repro.h"
#include "verify/report/report.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

namespace fs = std::filesystem;
constexpr double kInf = std::numeric_limits<double>::infinity();

Report SampleReport() {
  Report r;
  r.kernel = "exec:python3 worker.py --name \"a<b>&c\"";
  r.suite = "quick";
  r.seed = 42;
  Verdict pass;
  pass.check = "accuracy";
  pass.tensor = "o";
  pass.policy = "err <= 2x baseline + 2 ulp(row)";
  pass.pass = true;
  pass.observed = 1e-3;
  pass.allowed = 4e-3;
  pass.margin = 0.25;
  pass.worst = Location{0, 1, 5, 3, 77, 0.125, 0.124};
  Verdict fail = pass;
  fail.tensor = "dq";
  fail.pass = false;
  fail.observed = 3;
  fail.allowed = 0;
  fail.margin = kInf;
  fail.worst.observed = std::numeric_limits<double>::quiet_NaN();
  fail.message =
      "dq: 3 non-finite value(s) <first> at (b=0, h=1, i=5, d=3) & more 'quoted' "
      "\x01 control \xff bad utf-8 \xe2\x89\xa4 fine";
  fail.repro = "attest repro --kernel cpu/x --case /tmp/a.case.json";
  r.verdicts = {pass, fail};
  r.timings = {{"oracle", 0.5}, {"kernel", 0.25}};
  return r;
}

TEST(Report, ConsoleShowsFailuresTheTableAndTheVerdictLineLast) {
  const Report r = SampleReport();
  const std::string out = ToConsole(r, Verbosity::kDefault);
  // The failure in full, not the passing verdict.
  EXPECT_NE(out.find("FAIL accuracy dq margin     inf"), std::string::npos) << out;
  EXPECT_NE(out.find("worst (b=0, h=1, i=5, d=3) observed nan"), std::string::npos) << out;
  EXPECT_NE(out.find("     repro: attest repro --kernel cpu/x"), std::string::npos) << out;
  EXPECT_EQ(out.find("PASS accuracy o"), std::string::npos) << out;
  // One table row per check: the worst margin per tensor and where.
  EXPECT_NE(out.find("accuracy         2       1    0.250        -      inf"), std::string::npos)
      << out;
  EXPECT_NE(out.find("dq (b=0, h=1, i=5, d=3)"), std::string::npos) << out;
  // The verdict line last, counting verdicts as verdicts and checks as checks.
  const std::string last = out.substr(out.rfind('\n', out.size() - 2) + 1);
  EXPECT_EQ(last.rfind("FAIL: 1 of 2 verdicts failed, in 1 of 1 checks", 0), 0u) << last;
  EXPECT_NE(last.find("diagnosis: accuracy dq margin inf"), std::string::npos) << last;
  // -v: every verdict; --quiet: the line alone.
  const std::string verbose = ToConsole(r, Verbosity::kVerbose);
  EXPECT_NE(verbose.find("PASS accuracy o  margin   0.250"), std::string::npos) << verbose;
  EXPECT_EQ(ToConsole(r, Verbosity::kQuiet), VerdictLine(r) + "\n");
}

TEST(Report, VerdictLineCountsVerdictsAndChecksApart) {
  Report r = SampleReport();
  Verdict other = r.verdicts[0];
  other.check = "determinism";
  r.verdicts.push_back(other);
  r.verdicts.push_back(other);
  EXPECT_EQ(VerdictLine(r).rfind("FAIL: 1 of 4 verdicts failed, in 1 of 2 checks", 0), 0u)
      << VerdictLine(r);
  const ReportCounts c = CountReport(r);
  EXPECT_EQ(c.verdicts, 4);
  EXPECT_EQ(c.checks, 2);
  EXPECT_EQ(c.failed_checks, 1);
  r.error = "exec:w: cannot start";
  EXPECT_EQ(VerdictLine(r).rfind("ERROR: the run did not finish", 0), 0u) << VerdictLine(r);
  EXPECT_FALSE(r.passed());
}

TEST(Report, KernelErrorsAreGroupedByMessageOnTheConsole) {
  Report r = SampleReport();
  r.verdicts.clear();
  for (const char* label : {"case one", "case two", "case three"}) {
    Verdict e;
    e.check = "kernel-error";
    e.policy = "every kernel call answers without error";
    e.margin = kInf;
    e.case_label = label;
    e.message = std::string("[") + label + "] forward: TypeError: bad keyword";
    e.detail = "Traceback (most recent call last):\nTypeError: bad keyword";
    e.repro = std::string("attest repro --case ") + label;
    r.verdicts.push_back(e);
  }
  const std::string out = ToConsole(r, Verbosity::kDefault);
  EXPECT_NE(out.find("FAIL kernel-error on 3 cases: forward: TypeError: bad keyword\n"
                     "     first case: [case one]\n"
                     "     repro: attest repro --case case one\n"
                     "       | Traceback (most recent call last):\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("case two"), std::string::npos) << out;
  EXPECT_NE(ToConsole(r, Verbosity::kVerbose).find("[case two] forward"), std::string::npos);
}

TEST(Report, JsonNumbersAreNumbersOrNull) {
  const nlohmann::json j = ToJson(SampleReport());
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_TRUE(j["attest"]["version"].is_string());
  EXPECT_TRUE(j["attest"]["commit"].is_null());  // the library alone knows no commit
  EXPECT_EQ(j["kernel"], SampleReport().kernel);
  EXPECT_EQ(j["seed"], 42);
  EXPECT_EQ(j["passed"], false);
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["failures"], 1);
  EXPECT_EQ(j["summary"]["verdicts"], 2);
  EXPECT_EQ(j["summary"]["failed_checks"], 1);
  ASSERT_EQ(j["verdicts"].size(), 2u);
  const auto& f = j["verdicts"][1];
  for (const char* key : {"check", "tensor", "policy", "pass", "observed", "allowed", "margin",
                          "worst", "message", "detail", "repro", "case"}) {
    EXPECT_TRUE(f.contains(key)) << key;
  }
  // inf and NaN have no JSON number: null, never a string.
  EXPECT_TRUE(f["margin"].is_null());
  EXPECT_TRUE(f["worst"]["observed"].is_null());
  EXPECT_EQ(f["worst"]["d"], 3);
  EXPECT_EQ(j["verdicts"][0]["margin"], 0.25);
  // A location without coordinates has null ones, not -1.
  Report r = SampleReport();
  r.verdicts[0].worst = Location{};
  const nlohmann::json k = ToJson(r);
  EXPECT_TRUE(k["verdicts"][0]["worst"]["b"].is_null());
  EXPECT_TRUE(k["verdicts"][0]["worst"]["flat"].is_null());
  // Wall times only when asked for (the same seed gives the same bytes).
  EXPECT_TRUE(j["timings"].empty());
  EXPECT_FALSE(j["verdicts"][0].contains("seconds"));
  r.wall_times = true;
  EXPECT_EQ(ToJson(r)["timings"][0]["name"], "oracle");
  EXPECT_TRUE(ToJson(r)["verdicts"][0].contains("seconds"));
  // The dump must be valid JSON even with the bad UTF-8 in the message: nlohmann replaces it.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXPECT_TRUE(nlohmann::json::parse(text).is_object());
}

TEST(Report, JsonCarriesTheCaseAndCapabilities) {
  Report r = SampleReport();
  Case c;
  c.problem.batch = 2;
  c.problem.heads_q = c.problem.heads_kv = 2;
  c.problem.seqlen_q = c.problem.seqlen_k = 8;
  c.problem.head_dim = c.problem.head_dim_v = 16;
  c.generator = GeneratorSpec{"gaussian", 7, nlohmann::json::object()};
  r.verdicts[1].case_ = c;
  r.verdicts[1].case_label = "tile+1: B2";
  r.verdicts[1].case_file = "/tmp/a.case.json";
  r.capabilities = Capabilities{};
  r.capabilities->causal = true;
  const nlohmann::json j = ToJson(r);
  const auto& jc = j["verdicts"][1]["case"];
  EXPECT_EQ(jc["label"], "tile+1: B2");
  EXPECT_EQ(jc["problem"]["batch"], 2);
  EXPECT_EQ(jc["generator"]["seed"], 7);
  EXPECT_TRUE(jc["inputs"].is_null());
  EXPECT_EQ(jc["file"], "/tmp/a.case.json");
  EXPECT_TRUE(j["verdicts"][0]["case"].is_null());
  EXPECT_EQ(j["capabilities"]["causal"], true);
}

#ifdef ATTEST_PYTHON
// verify/report/validate_report.py's exit code on `report` (77: jsonschema missing).
int ValidateJson(const nlohmann::json& report, const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / "attest_report_schema";
  fs::create_directories(dir);
  const fs::path path = dir / (name + ".json");
  EXPECT_TRUE(WriteTextFile(path, report.dump(2, ' ', false,
                                              nlohmann::json::error_handler_t::replace))
                  .ok());
  const std::string cmd = std::string(ATTEST_PYTHON) + " " + std::string(ATTEST_SOURCE_DIR) +
                          "/verify/report/validate_report.py " + path.string() + " > " + path.string() +
                          ".log 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
#endif

TEST(Report, JsonValidatesAgainstTheSchema) {
#ifndef ATTEST_PYTHON
  GTEST_SKIP() << "no Python at configure time";
#else
  Report full = SampleReport();
  full.wall_times = true;
  full.capabilities = Capabilities{};
  full.verdicts[0].worst = Location{};
  Report error;
  error.kernel = "exec:missing";
  error.error = "exec:missing: cannot start";
  const int rc = ValidateJson(ToJson(SampleReport()), "sample");
  if (rc == 77) GTEST_SKIP() << ATTEST_PYTHON << " has no jsonschema (tools/bootstrap)";
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ValidateJson(ToJson(full), "full"), 0);
  EXPECT_EQ(ValidateJson(ToJson(Report{}), "empty"), 0);
  EXPECT_EQ(ValidateJson(ToJson(error), "error"), 0);
  // The validation can fail: the old "inf" strings, a -1 coordinate, a missing field.
  nlohmann::json bad = ToJson(SampleReport());
  bad["verdicts"][1]["margin"] = "inf";
  EXPECT_EQ(ValidateJson(bad, "inf-string"), 1);
  bad = ToJson(SampleReport());
  bad["verdicts"][0]["worst"]["b"] = -1;
  EXPECT_EQ(ValidateJson(bad, "minus-one"), 1);
  bad = ToJson(SampleReport());
  bad.erase("schema_version");
  EXPECT_EQ(ValidateJson(bad, "no-version"), 1);
#endif
}

TEST(Report, TestcaseNamesAreDistinctAndStable) {
  Report r = SampleReport();
  for (Verdict& v : r.verdicts) v.case_label = "tile+1: B1 H2:2 Sq65";
  r.verdicts.push_back(r.verdicts[1]);
  r.skipped = {{"gqa-mha", "MHA: B1 H2:2", "not applicable to this case"}};
  const std::vector<std::string> names = TestcaseNames(r);
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0], "accuracy/o [tile+1: B1 H2:2 Sq65]");
  EXPECT_EQ(names[1], "accuracy/dq [tile+1: B1 H2:2 Sq65]");
  EXPECT_EQ(names[2], "accuracy/dq [tile+1: B1 H2:2 Sq65] #2");
  EXPECT_EQ(names[3], "gqa-mha [MHA: B1 H2:2]");
  EXPECT_EQ(TestcaseNames(r), names);
}

TEST(Report, XmlEscape) {
  EXPECT_EQ(XmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
  EXPECT_EQ(XmlEscape("x\x01y\tz\n"), "x\\x01y\tz\n");
  EXPECT_EQ(XmlEscape("\xff\xe2\x89\xa4"), "\\xff\xe2\x89\xa4");
  EXPECT_EQ(XmlEscape("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
  EXPECT_EQ(XmlEscape("\xef\xbf\xbf"), "\\xef\\xbf\\xbf");  // U+FFFF is not an XML char
}

TEST(Report, MarkdownEscapesCells) {
  Report r = SampleReport();
  r.verdicts[1].message = "a|b";
  const std::string md = ToMarkdown(r);
  EXPECT_NE(md.find("a\\|b"), std::string::npos) << md;
  EXPECT_NE(md.find("FAIL: 1 of 2 verdicts failed"), std::string::npos) << md;
  EXPECT_NE(md.find("```\ncheck "), std::string::npos) << md;  // the summary table
  EXPECT_NE(md.find("## Failures"), std::string::npos);
  EXPECT_NE(md.find("`attest repro --kernel cpu/x"), std::string::npos);
}

#ifdef ATTEST_XMLLINT
int XmlLint(const fs::path& xml) {
  const std::string cmd = std::string(ATTEST_XMLLINT) + " --noout --schema " +
                          std::string(ATTEST_SOURCE_DIR) + "/verify/report/testdata/junit.xsd " +
                          xml.string() + " > " + xml.string() + ".log 2>&1";
  return std::system(cmd.c_str());
}
#endif

TEST(Report, JUnitValidatesAgainstTheSchema) {
#ifndef ATTEST_XMLLINT
  GTEST_SKIP() << "xmllint not found at configure time (Debian package libxml2-utils)";
#else
  const fs::path dir = fs::path(testing::TempDir()) / "attest_report_test";
  fs::create_directories(dir);
  const fs::path good = dir / "good.xml";
  const std::string xml = ToJUnitXml(SampleReport());
  ASSERT_TRUE(WriteTextFile(good, xml).ok());
  EXPECT_EQ(XmlLint(good), 0) << xml;
  EXPECT_NE(xml.find("<failure message=\"dq: 3 non-finite value(s) &lt;first&gt;"),
            std::string::npos);
  EXPECT_NE(xml.find("tests=\"2\" failures=\"1\" errors=\"0\""), std::string::npos) << xml;
  // An empty report is valid too, and so is the report of a run that did not finish.
  const fs::path empty = dir / "empty.xml";
  ASSERT_TRUE(WriteTextFile(empty, ToJUnitXml(Report{})).ok());
  EXPECT_EQ(XmlLint(empty), 0);
  Report error;
  error.kernel = "exec:missing";
  error.error = "exec:missing: cannot start 'missing'";
  const fs::path errored = dir / "error.xml";
  ASSERT_TRUE(WriteTextFile(errored, ToJUnitXml(error)).ok());
  EXPECT_EQ(XmlLint(errored), 0);
  // The validation can fail: a testcase without a name, and unescaped text, are rejected.
  std::string broken = xml;
  const size_t at = broken.find("<testcase name=");
  broken.replace(at, 15, "<testcase nome=");
  const fs::path bad = dir / "bad.xml";
  ASSERT_TRUE(WriteTextFile(bad, broken).ok());
  EXPECT_NE(XmlLint(bad), 0);
  const fs::path bad2 = dir / "bad2.xml";
  ASSERT_TRUE(
      WriteTextFile(bad2, "<testsuites><testsuite name=\"a&b\" tests=\"0\"/></testsuites>").ok());
  EXPECT_NE(XmlLint(bad2), 0);
#endif
}

TEST(Report, JUnitSkipsErrorsAndTimes) {
  Report r = SampleReport();
  r.seconds = 1.5;
  r.verdicts[0].seconds = 0.25;
  Verdict e = r.verdicts[1];
  e.check = "kernel-error";
  e.tensor = "";
  e.message = "forward: TypeError: bad keyword";
  e.detail = "Traceback (most recent call last):\nTypeError: bad keyword";
  r.verdicts.push_back(e);
  r.skipped = {{"gqa-mha", "MHA: B1", "not applicable to this case"}};
  const std::string xml = ToJUnitXml(r);
  EXPECT_NE(xml.find("tests=\"4\" failures=\"1\" errors=\"1\" skipped=\"1\" time=\"1.500\""),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testcase name=\"accuracy/o\" classname=\"accuracy\" time=\"0.250000\">"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<error message=\"forward: TypeError: bad keyword\" type=\"kernel-error\">"
                     "Traceback (most recent call last):\nTypeError: bad keyword"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testcase name=\"gqa-mha [MHA: B1]\" classname=\"gqa-mha\" "
                     "time=\"0.000000\">\n      <skipped message=\"not applicable to this case\"/>"),
            std::string::npos)
      << xml;
  Report error;
  error.error = "cannot start";
  const std::string ex = ToJUnitXml(error);
  EXPECT_NE(ex.find("tests=\"1\" failures=\"0\" errors=\"1\""), std::string::npos) << ex;
  EXPECT_NE(ex.find("<error message=\"cannot start\" type=\"infrastructure\">"),
            std::string::npos)
      << ex;
}

TEST(Report, FailureCaseAndRepro) {
  Case c;
  c.problem.batch = 1;
  c.problem.heads_q = c.problem.heads_kv = 2;
  c.problem.seqlen_q = c.problem.seqlen_k = 8;
  c.problem.head_dim = c.problem.head_dim_v = 16;
  c.generator = GeneratorSpec{"gaussian", 7, nlohmann::json::object()};
  Verdict v;
  v.check = "accuracy";
  v.tensor = "dq";
  const fs::path dir = fs::path(testing::TempDir()) / "attest_report_cases";
  fs::remove_all(dir);
  auto path = SaveFailureCase(c, dir, "exec:python3 w.py", v);
  ASSERT_TRUE(path.ok()) << path.error().message;
  EXPECT_EQ(path->parent_path(), dir);
  EXPECT_EQ(path->filename().string().rfind("exec_python3_w.py-accuracy-dq-", 0), 0u)
      << path->filename();
  auto loaded = LoadCase(*path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->problem, c.problem);
  // Same failure, same file.
  EXPECT_EQ(*SaveFailureCase(c, dir, "exec:python3 w.py", v), *path);
  EXPECT_EQ(ReproCommand("cpu/flash2-bf16", "/tmp/x.case.json"),
            "attest repro --kernel cpu/flash2-bf16 --case /tmp/x.case.json");
  EXPECT_EQ(ReproCommand("exec:python3 w.py", "a b.json"),
            "attest repro --kernel 'exec:python3 w.py' --case 'a b.json'");
  EXPECT_EQ(ReproCommand("cpu/flash2-bf16", "x.case.json", "gqa-mha"),
            "attest repro --kernel cpu/flash2-bf16 --case x.case.json --check gqa-mha");
  EXPECT_EQ(CheckCommand("exec:python3 -m attest.worker m:f", "gate", 7),
            "attest check --kernel 'exec:python3 -m attest.worker m:f' --suite gate --seed 7");
  EXPECT_EQ(AuditCommand("cpu/mxfp8-cudnn", 0), "attest audit --kernel cpu/mxfp8-cudnn --seed 0");
  EXPECT_EQ(PendingReproCommand("cpu/flash2-bf16", "tile+1: B1 H2:2", "accuracy"),
            "attest repro --kernel cpu/flash2-bf16 --case 'tile+1: B1 H2:2' --check accuracy");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
}

}  // namespace
}  // namespace attest
