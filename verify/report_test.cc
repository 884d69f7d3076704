// Tests of verify/report.h: console lines with margins and repro lines, JSON with stable
// keys and non-finite numbers as strings, Markdown escaping, JUnit XML escaping and its
// validation by `xmllint --schema verify/testdata/junit.xsd` (libxml2-utils), plus the
// failure-case writer.
#include "verify/report.h"

#include <gtest/gtest.h>

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

TEST(Report, ConsoleHasOneLinePerCheckWithMarginAndRepro) {
  const std::string out = ToConsole(SampleReport());
  EXPECT_NE(out.find("PASS accuracy o  margin   0.250"), std::string::npos) << out;
  EXPECT_NE(out.find("FAIL accuracy dq margin     inf"), std::string::npos) << out;
  EXPECT_NE(out.find("worst (b=0, h=1, i=5, d=3) observed 0.125"), std::string::npos) << out;
  EXPECT_NE(out.find("     repro: attest repro --kernel cpu/x"), std::string::npos) << out;
  EXPECT_NE(out.find("FAIL: 1 of 2 checks failed"), std::string::npos) << out;
}

TEST(Report, JsonKeysAreStable) {
  const nlohmann::json j = ToJson(SampleReport());
  EXPECT_EQ(j["kernel"], SampleReport().kernel);
  EXPECT_EQ(j["seed"], 42);
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["failures"], 1);
  ASSERT_EQ(j["verdicts"].size(), 2u);
  const auto& f = j["verdicts"][1];
  for (const char* key : {"check", "tensor", "policy", "pass", "observed", "allowed", "margin",
                          "worst", "message", "repro"}) {
    EXPECT_TRUE(f.contains(key)) << key;
  }
  EXPECT_EQ(f["margin"], "inf");
  EXPECT_EQ(f["worst"]["observed"], "nan");
  EXPECT_EQ(f["worst"]["d"], 3);
  EXPECT_EQ(j["verdicts"][0]["margin"], 0.25);
  EXPECT_EQ(j["timings"][0]["name"], "oracle");
  // The dump must be valid JSON even with the bad UTF-8 in the message: nlohmann replaces it.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXPECT_TRUE(nlohmann::json::parse(text).is_object());
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
  r.verdicts[0].policy = "a|b";
  const std::string md = ToMarkdown(r);
  EXPECT_NE(md.find("a\\|b"), std::string::npos);
  EXPECT_NE(md.find("| **FAIL** | accuracy | dq | inf |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Failures"), std::string::npos);
  EXPECT_NE(md.find("`attest repro --kernel cpu/x"), std::string::npos);
}

#ifdef ATTEST_XMLLINT
int XmlLint(const fs::path& xml) {
  const std::string cmd = std::string(ATTEST_XMLLINT) + " --noout --schema " +
                          std::string(ATTEST_SOURCE_DIR) + "/verify/testdata/junit.xsd " +
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
  EXPECT_NE(xml.find("tests=\"2\" failures=\"1\""), std::string::npos);
  // An empty report is valid too.
  const fs::path empty = dir / "empty.xml";
  ASSERT_TRUE(WriteTextFile(empty, ToJUnitXml(Report{})).ok());
  EXPECT_EQ(XmlLint(empty), 0);
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
}

}  // namespace
}  // namespace attest
