// Report writers (see report.h). JUnit follows the Ant/Jenkins JUnit XML structure that CI
// systems read (testsuites > testsuite > properties, testcase > skipped | error | failure,
// system-out; the Jenkins JUnit plugin, GitLab's "Unit test reports", GitHub test-report
// actions): verify/report/testdata/junit.xsd is the schema report_test validates against, and
// verify/junit_consumer_test.py reads the reports with junitparser as those consumers do.
#include "verify/report/report.h"

#include "verify/report/repro.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "reference/io/files.h"
#include "verify/checks/check.h"

#ifndef ATTEST_VERSION
#define ATTEST_VERSION "unknown"
#endif

namespace attest {
namespace {

using nlohmann::json;

// A JSON number, or null where the value has none (JSON has no inf or NaN).
json Number(double x) {
  if (!std::isfinite(x)) return nullptr;
  return x;
}

// A coordinate, or null where the location has none (-1).
json Index(int64_t i) {
  if (i < 0) return nullptr;
  return i;
}

std::string Margin3(double m) {
  if (std::isinf(m)) return "inf";
  if (std::isnan(m)) return "nan";
  return fmt::format("{:.3f}", m);
}

bool HasLocation(const Location& w) { return w.flat >= 0 || w.b >= 0 || w.h >= 0; }

bool IsKernelError(const Verdict& v) { return v.check == kKernelErrorCheck; }

// The message without the "[case label] " that check.h Finish puts in front of it.
std::string_view Unlabelled(const Verdict& v) {
  std::string_view m = v.message;
  const std::string tag = "[" + v.case_label + "] ";
  if (!v.case_label.empty() && m.substr(0, tag.size()) == tag) m.remove_prefix(tag.size());
  return m;
}

std::string FamilyName(std::string_view check, std::string_view tensor) {
  return tensor.empty() ? std::string(check) : fmt::format("{}/{}", check, tensor);
}

// Markdown table cells: '|' would end the cell, newlines the row.
std::string MdCell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// Length of the well-formed UTF-8 sequence starting at s[i] (Unicode §3.9 table 3-7), or 0.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  // U+FFFE and U+FFFF are not XML characters.
  if (n == 3 && c == 0xEF && b(i + 1) == 0xBF && (b(i + 2) == 0xBE || b(i + 2) == 0xBF)) return 0;
  return n;
}


}  // namespace

double Margin(double observed, double allowed) {
  if (std::isnan(observed) || std::isnan(allowed)) return std::numeric_limits<double>::infinity();
  if (observed == 0) return 0.0;
  if (allowed <= 0) return std::numeric_limits<double>::infinity();
  return observed / allowed;
}

bool Report::passed() const { return failures() == 0 && error.empty(); }

int Report::failures() const {
  return static_cast<int>(
      std::count_if(verdicts.begin(), verdicts.end(), [](const Verdict& v) { return !v.pass; }));
}

const Verdict* FirstFailure(const Report& report) {
  const Verdict* best = nullptr;
  size_t best_rank = 0;
  for (const Verdict& v : report.verdicts) {
    if (v.pass) continue;
    const size_t rank = DiagnosisRank(v.check, v.tensor);
    if (best == nullptr || rank < best_rank) {
      best = &v;
      best_rank = rank;
    }
  }
  return best;
}

ReportCounts CountReport(const Report& r) {
  ReportCounts c;
  std::set<std::string> checks, failed_checks, cases;
  for (const Verdict& v : r.verdicts) {
    if (v.check == kCoverageCheck) {
      ++c.coverage_verdicts;
      c.coverage_failed += v.pass ? 0 : 1;
      continue;
    }
    ++c.verdicts;
    checks.insert(v.check);
    if (!v.pass) {
      ++c.failed_verdicts;
      failed_checks.insert(v.check);
    }
    if (IsKernelError(v)) ++c.kernel_errors;
    if (v.case_) cases.insert(CaseToText(*v.case_));
  }
  c.checks = static_cast<int64_t>(checks.size());
  c.failed_checks = static_cast<int64_t>(failed_checks.size());
  c.cases = static_cast<int64_t>(cases.size());
  return c;
}

namespace {

// "coverage: accuracy/o, accuracy/lse judged; 3 of 17 rows skipped" (what the guard saw).
std::string CoverageClause(const Report& r) {
  if (r.coverage.empty()) return {};
  std::string missing, judged;
  for (const FamilyCount& f : r.coverage) {
    if (!f.required) continue;
    std::string& list = f.verdicts > 0 ? judged : missing;
    list += (list.empty() ? "" : ", ") + FamilyName(f.check, f.tensor);
  }
  bool failed = false;
  for (const Verdict& v : r.verdicts) failed = failed || (v.check == kCoverageCheck && !v.pass);
  std::string out = "; coverage: ";
  if (!missing.empty()) out += "no verdict for " + missing + (failed ? "" : " (accepted)");
  if (!missing.empty() && !judged.empty()) out += "; ";
  if (!judged.empty()) out += judged + " judged";
  bool share_failed = false, share_accepted = false;
  for (const Verdict& v : r.verdicts) {
    if (v.check != kCoverageCheck || v.tensor != "skipped-rows") continue;
    share_failed = share_failed || !v.pass;
    // Under --allow-skips the share verdict passes with its policy naming the flag.
    share_accepted = share_accepted || (v.pass && v.message.find("(accepted") != std::string::npos);
  }
  if (share_failed) out += "; too many rows skipped";
  if (share_accepted) out += "; too many rows skipped (accepted)";
  return out;
}

}  // namespace

std::string VerdictLine(const Report& r) {
  const ReportCounts c = CountReport(r);
  std::string context = fmt::format("kernel {}", r.kernel);
  if (!r.suite.empty()) context += fmt::format(", suite {}", r.suite);
  context += fmt::format(", seed {}", r.seed);
  if (r.rows > 0) context += fmt::format("; {} of {} rows skipped", r.skipped.size(), r.rows);
  if (r.seconds > 0) context += fmt::format("; {:.1f} s", r.seconds);
  if (!r.error.empty()) {
    return fmt::format("ERROR: the run did not finish ({}): {}", context, r.error);
  }
  std::string line;
  if (c.failed_verdicts == 0) {
    line = fmt::format("{}: {} verdicts, none failed, from {} checks on {} cases{} ({})",
                       r.passed() ? "PASS" : "FAIL", c.verdicts, c.checks, c.cases,
                       CoverageClause(r), context);
  } else {
    line =
        fmt::format("FAIL: {} of {} verdicts failed, in {} of {} checks{} ({})", c.failed_verdicts,
                    c.verdicts, c.failed_checks, c.checks, CoverageClause(r), context);
  }
  if (const Verdict* f = FirstFailure(r)) {
    line += fmt::format("; diagnosis: {}{} margin {}", f->check,
                        f->tensor.empty() ? "" : " " + f->tensor, Margin3(f->margin));
  }
  return line;
}

std::string SummaryTable(const Report& r) {
  // One row per check (coverage is the verdict line's clause), in diagnosis order of its
  // first step; one column per output tensor holding the worst margin of the check on it.
  static constexpr std::string_view kTensors[] = {"o", "lse", "dq", "dk", "dv"};
  constexpr size_t kOther = std::size(kTensors);
  struct Row {
    std::string check;
    int64_t verdicts = 0, failed = 0;
    const Verdict* cell[kOther + 1] = {};
    const Verdict* worst = nullptr;
    size_t rank = 0;
  };
  std::vector<Row> rows;
  for (const Verdict& v : r.verdicts) {
    if (v.check == kCoverageCheck) continue;
    auto it =
        std::find_if(rows.begin(), rows.end(), [&](const Row& x) { return x.check == v.check; });
    if (it == rows.end()) {
      rows.push_back({v.check});
      rows.back().rank = DiagnosisRank(v.check, v.tensor);
      it = rows.end() - 1;
    }
    Row& row = *it;
    ++row.verdicts;
    row.failed += v.pass ? 0 : 1;
    row.rank = std::min(row.rank, DiagnosisRank(v.check, v.tensor));
    size_t col = kOther;
    for (size_t t = 0; t < kOther; ++t) {
      if (v.tensor == kTensors[t]) col = t;
    }
    // The worst margin wins; NaN counts as worst.
    if (row.cell[col] == nullptr || !(v.margin <= row.cell[col]->margin)) row.cell[col] = &v;
    if (row.worst == nullptr || !(v.margin <= row.worst->margin)) row.worst = &v;
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.rank < b.rank; });
  size_t check_w = 5;
  for (const Row& row : rows) check_w = std::max(check_w, row.check.size());
  std::string out = fmt::format("{:<{}}  {:>8}  {:>6}", "check", check_w, "verdicts", "failed");
  for (std::string_view t : kTensors) out += fmt::format("  {:>7}", t);
  out += fmt::format("  {:>7}  worst at\n", "other");
  for (const Row& row : rows) {
    out += fmt::format("{:<{}}  {:>8}  {:>6}", row.check, check_w, row.verdicts, row.failed);
    for (const Verdict* v : row.cell) out += fmt::format("  {:>7}", v ? Margin3(v->margin) : "-");
    // Where the check came closest to (or past) its bound; nothing to show at margin 0.
    std::string where;
    if (row.worst != nullptr && !(row.worst->margin <= 0)) {
      const Verdict& w = *row.worst;
      const auto add = [&](const std::string& part) {
        if (!part.empty()) where += (where.empty() ? "" : " ") + part;
      };
      add(w.tensor);
      if (!w.case_label.empty()) add(fmt::format("[{}]", w.case_label));
      if (HasLocation(w.worst)) add(w.worst.Coordinates());
    }
    out += "  " + where;
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  // What the numbers are, for a reader who has not read docs/reports.md.
  out += "o .. other: the largest margin of the check's verdicts on that output (margin = error / "
         "allowed; a verdict fails above 1)\n"
         "a row is one check on one suite case; a case, one problem with its inputs; a verdict, "
         "one judgment of one output\n";
  return out;
}

namespace {

// "PASS accuracy o  margin   0.250  <policy>  worst (b=0, ...) observed ... reference ..."
std::string VerdictRow(const Verdict& v, size_t check_w, size_t tensor_w) {
  std::string out = fmt::format("{} {:<{}} {:<{}} margin {:>7}  {}", v.pass ? "PASS" : "FAIL",
                                v.check, check_w, v.tensor, tensor_w, Margin3(v.margin), v.policy);
  if (HasLocation(v.worst)) out += "  worst " + v.worst.ToString();
  return out + "\n";
}

std::string FailureBody(const Verdict& v) {
  std::string out;
  if (!v.message.empty()) out += "     " + v.message + "\n";
  if (!v.repro.empty()) out += "     repro: " + v.repro + "\n";
  return out;
}

// The detail of a kernel error, indented, at most `max_lines` lines.
std::string IndentedDetail(std::string_view detail, size_t max_lines) {
  std::string out;
  size_t lines = 0;
  for (size_t at = 0; at < detail.size() && lines < max_lines; ++lines) {
    const size_t nl = std::min(detail.find('\n', at), detail.size());
    out += "       | " + std::string(detail.substr(at, nl - at)) + "\n";
    at = nl + 1;
  }
  return out;
}

}  // namespace

std::string ToConsole(const Report& r, Verbosity verbosity) {
  if (verbosity == Verbosity::kQuiet) return VerdictLine(r) + "\n";
  std::string out;
  size_t check_w = 5, tensor_w = 1;
  for (const Verdict& v : r.verdicts) {
    check_w = std::max(check_w, v.check.size());
    tensor_w = std::max(tensor_w, v.tensor.size());
  }
  if (verbosity == Verbosity::kVerbose) {
    for (const Verdict& v : r.verdicts) {
      out += VerdictRow(v, check_w, tensor_w);
      if (!v.pass) out += FailureBody(v);
    }
    for (const SkippedRow& s : r.skipped) {
      out += fmt::format("SKIP {} [{}]: {}\n", s.check, s.label, s.reason);
    }
  } else {
    // The failures in full, except that kernel errors (one per case) and coverage failures
    // (one per family) are shown once per distinct message, naming how many share it and, for
    // kernel errors, the first case's label, repro and detail.
    struct Group {
      const Verdict* first = nullptr;
      std::vector<const Verdict*> all;
    };
    std::vector<std::pair<std::string, Group>> groups;  // in verdict (diagnosis) order
    std::string singles;
    for (const Verdict& v : r.verdicts) {
      if (v.pass) continue;
      if (!IsKernelError(v) && v.check != kCoverageCheck) {
        singles += VerdictRow(v, check_w, tensor_w) + FailureBody(v);
        continue;
      }
      const std::string key = v.check + "\n" + std::string(Unlabelled(v));
      auto it =
          std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) {
        groups.push_back({key, Group{&v, {}}});
        it = groups.end() - 1;
      }
      it->second.all.push_back(&v);
    }
    const auto print_group = [&](const Group& g) {
      const Verdict& first = *g.first;
      if (IsKernelError(first)) {
        out += fmt::format("FAIL {} on {} case{}: {}\n", first.check, g.all.size(),
                           g.all.size() == 1 ? "" : "s", Unlabelled(first));
        if (!first.case_label.empty())
          out += fmt::format("     first case: [{}]\n", first.case_label);
        if (!first.repro.empty()) out += "     repro: " + first.repro + "\n";
        if (!first.detail.empty()) out += IndentedDetail(first.detail, 16);
        return;
      }
      std::string families;
      for (const Verdict* v : g.all) families += (families.empty() ? "" : ", ") + v->tensor;
      out += fmt::format("FAIL {} {}: {}\n", first.check, families, Unlabelled(first));
    };
    // Kernel errors rank first, coverage last (check.h DiagnosisOrder).
    for (const auto& [key, g] : groups) {
      if (IsKernelError(*g.first)) print_group(g);
    }
    out += singles;
    for (const auto& [key, g] : groups) {
      if (!IsKernelError(*g.first)) print_group(g);
    }
    if (!r.skipped.empty()) {
      // The reasons, most frequent first (ties in order of appearance), three at most.
      std::vector<std::pair<std::string, int>> reasons;
      for (const SkippedRow& k : r.skipped) {
        auto it = std::find_if(reasons.begin(), reasons.end(),
                               [&](const auto& x) { return x.first == k.reason; });
        if (it == reasons.end()) {
          reasons.push_back({k.reason, 1});
        } else {
          ++it->second;
        }
      }
      std::stable_sort(reasons.begin(), reasons.end(),
                       [](const auto& a, const auto& b) { return a.second > b.second; });
      std::string why;
      for (size_t n = 0; n < reasons.size() && n < 3; ++n) {
        why += fmt::format("{}{} {}", n ? ", " : "", reasons[n].second, reasons[n].first);
      }
      if (reasons.size() > 3) why += ", ...";
      out += fmt::format("{} rows skipped ({}; -v lists them)\n", r.skipped.size(), why);
    }
  }
  if (!r.verdicts.empty() || !r.coverage.empty()) out += SummaryTable(r);
  return out + VerdictLine(r) + "\n";
}

std::string ToJsonText(const Report& r) {
  return ToJson(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

json ToJson(const Report& r) {
  json verdicts = json::array();
  for (const Verdict& v : r.verdicts) {
    json c = nullptr;
    if (v.case_) {
      c = {{"label", v.case_label},
           {"problem", ProblemToJson(v.case_->problem)},
           {"generator", nullptr},
           {"inputs", nullptr},
           {"file", v.case_file.empty() ? json(nullptr) : json(v.case_file)}};
      if (v.case_->generator) {
        c["generator"] = {{"name", v.case_->generator->name},
                          {"seed", v.case_->generator->seed},
                          {"params", v.case_->generator->params}};
      }
      if (v.case_->inputs) c["inputs"] = *v.case_->inputs;
    }
    json j = {{"check", v.check},
              {"tensor", v.tensor},
              {"policy", v.policy},
              {"pass", v.pass},
              {"observed", Number(v.observed)},
              {"allowed", Number(v.allowed)},
              {"margin", Number(v.margin)},
              {"worst",
               {{"b", Index(v.worst.b)},
                {"h", Index(v.worst.h)},
                {"i", Index(v.worst.i)},
                {"d", Index(v.worst.d)},
                {"seq_axis", v.worst.seq_name},
                {"flat", Index(v.worst.flat)},
                {"observed", Number(v.worst.observed)},
                {"reference", Number(v.worst.reference)}}},
              {"message", v.message},
              {"detail", v.detail.empty() ? json(nullptr) : json(v.detail)},
              {"repro", v.repro},
              {"case", c}};
    if (r.wall_times) j["seconds"] = v.seconds;
    verdicts.push_back(std::move(j));
  }
  json skipped = json::array();
  for (const SkippedRow& s : r.skipped) {
    skipped.push_back({{"check", s.check}, {"case", s.label}, {"reason", s.reason}});
  }
  json coverage = json::array();
  for (const FamilyCount& f : r.coverage) {
    coverage.push_back({{"check", f.check},
                        {"tensor", f.tensor},
                        {"verdicts", f.verdicts},
                        {"failed", f.failed},
                        {"required", f.required}});
  }
  json timings = json::array();
  if (r.wall_times) {
    for (const Timing& t : r.timings) timings.push_back({{"name", t.name}, {"seconds", t.seconds}});
  }
  json first = nullptr;
  if (const Verdict* f = FirstFailure(r)) {
    first = {{"check", f->check}, {"tensor", f->tensor}, {"margin", Number(f->margin)}};
  }
  const ReportCounts c = CountReport(r);
  json summary = {{"verdicts", c.verdicts},
                  {"failed_verdicts", c.failed_verdicts},
                  {"checks", c.checks},
                  {"failed_checks", c.failed_checks},
                  {"cases", c.cases},
                  {"kernel_errors", c.kernel_errors},
                  {"rows", r.rows},
                  {"skipped_rows", r.skipped.size()},
                  {"coverage_verdicts", c.coverage_verdicts},
                  {"coverage_failed", c.coverage_failed}};
  json out = {
      {"schema_version", kReportSchemaVersion},
      {"attest",
       {{"version", r.attest_version.empty() ? std::string(ATTEST_VERSION) : r.attest_version},
        {"commit", r.attest_commit.empty() ? json(nullptr) : json(r.attest_commit)}}},
      {"kernel", r.kernel},
      {"capabilities", r.capabilities ? CapabilitiesToJson(*r.capabilities) : json(nullptr)},
      {"suite", r.suite},
      {"seed", r.seed},
      {"passed", r.passed()},
      {"error", r.error.empty() ? json(nullptr) : json(r.error)},
      {"failures", r.failures()},
      {"summary", summary},
      {"first_failure", first},
      {"verdicts", verdicts},
      {"skipped", skipped},
      {"coverage", coverage},
      {"timings", timings}};
  if (!r.oracle_device.empty()) out["oracle_device"] = r.oracle_device;
  if (r.gpu) {
    out["gpu"] = {{"local_rank", r.gpu->local_rank},
                  {"local_rank_from", r.gpu->local_rank_from},
                  {"visible", r.gpu->visible},
                  {"visible_from", r.gpu->visible_from},
                  {"chosen", r.gpu->chosen}};
  }
  if (r.wall_times) out["seconds"] = r.seconds;
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&':
        out += "&amp;";
        ++i;
        continue;
      case '<':
        out += "&lt;";
        ++i;
        continue;
      case '>':
        out += "&gt;";
        ++i;
        continue;
      case '"':
        out += "&quot;";
        ++i;
        continue;
      case '\'':
        out += "&apos;";
        ++i;
        continue;
      default:
        break;
    }
    if (u < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      out += fmt::format("\\x{:02x}", u);
      ++i;
      continue;
    }
    const size_t n = Utf8Length(text, i);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", u);
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

std::vector<std::string> TestcaseNames(const Report& r) {
  std::vector<std::string> names;
  std::map<std::string, int> seen;
  auto add = [&](std::string name) {
    const int n = ++seen[name];
    names.push_back(n == 1 ? name : fmt::format("{} #{}", name, n));
  };
  for (const Verdict& v : r.verdicts) {
    std::string name = FamilyName(v.check, v.tensor);
    if (!v.case_label.empty()) name += " [" + v.case_label + "]";
    add(std::move(name));
  }
  for (const SkippedRow& s : r.skipped) add(fmt::format("{} [{}]", s.check, s.label));
  return names;
}

std::string ToJUnitXml(const Report& r) {
  const ReportCounts c = CountReport(r);
  const std::string suite = r.suite.empty() ? r.kernel : r.kernel + " " + r.suite;
  double seconds = r.seconds;
  if (seconds <= 0) {
    for (const Verdict& v : r.verdicts) seconds += v.seconds;
  }
  const bool infra = !r.error.empty();
  const size_t tests = r.verdicts.size() + r.skipped.size() + (infra ? 1 : 0);
  const int64_t failures = c.failed_verdicts - c.kernel_errors;
  const int64_t errors = c.kernel_errors + (infra ? 1 : 0);
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += fmt::format(
      "<testsuites name=\"attest\" tests=\"{}\" failures=\"{}\" errors=\"{}\" "
      "time=\"{:.3f}\">\n",
      tests, failures, errors, seconds);
  x += fmt::format(
      "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" "
      "skipped=\"{}\" time=\"{:.3f}\">\n",
      XmlEscape(suite), tests, failures, errors, r.skipped.size(), seconds);
  x += "    <properties>\n";
  const auto property = [&](std::string_view name, std::string_view value) {
    x += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", XmlEscape(name),
                     XmlEscape(value));
  };
  property("kernel", r.kernel);
  property("suite", r.suite);
  property("seed", std::to_string(r.seed));
  property("attest.version", r.attest_version.empty() ? ATTEST_VERSION : r.attest_version);
  if (!r.attest_commit.empty()) property("attest.commit", r.attest_commit);
  if (r.capabilities) property("capabilities", CapabilitiesToJson(*r.capabilities).dump());
  for (const Timing& t : r.timings) {
    property("time." + t.name, fmt::format("{:.6f}", t.seconds));
  }
  x += "    </properties>\n";
  const std::vector<std::string> names = TestcaseNames(r);
  const auto testcase = [&](std::string_view name, std::string_view classname, double time) {
    x += fmt::format("    <testcase name=\"{}\" classname=\"{}\" time=\"{:.6f}\">\n",
                     XmlEscape(name), XmlEscape(classname), std::max(time, 0.0));
  };
  if (infra) {
    testcase("attest run", "infrastructure", 0);
    x += fmt::format(
        "      <error message=\"{}\" type=\"infrastructure\">{}</error>\n", XmlEscape(r.error),
        XmlEscape("attest exited with code 2 (usage or infrastructure error): " + r.error));
    x += "    </testcase>\n";
  }
  for (size_t n = 0; n < r.verdicts.size(); ++n) {
    const Verdict& v = r.verdicts[n];
    testcase(names[n], v.check, v.seconds);
    std::string text = fmt::format("margin {} (observed {:.6g}, allowed {:.6g})", Margin3(v.margin),
                                   v.observed, v.allowed);
    if (!v.policy.empty()) text += "\npolicy: " + v.policy;
    if (HasLocation(v.worst)) text += "\nworst " + v.worst.ToString();
    if (!v.case_label.empty()) text += "\ncase: " + v.case_label;
    if (!v.case_file.empty()) text += "\ncase file: " + v.case_file;
    if (!v.pass) {
      const char* element = IsKernelError(v) ? "error" : "failure";
      std::string body;
      if (!v.detail.empty()) body += v.detail + "\n";
      body += text;
      if (!v.repro.empty()) body += "\nrepro: " + v.repro;
      x += fmt::format("      <{} message=\"{}\" type=\"{}\">{}</{}>\n", element,
                       XmlEscape(Unlabelled(v)), XmlEscape(v.check), XmlEscape(body), element);
    }
    x += fmt::format("      <system-out>{}</system-out>\n", XmlEscape(text));
    x += "    </testcase>\n";
  }
  for (size_t n = 0; n < r.skipped.size(); ++n) {
    const SkippedRow& s = r.skipped[n];
    testcase(names[r.verdicts.size() + n], s.check, 0);
    x += fmt::format("      <skipped message=\"{}\"/>\n", XmlEscape(s.reason));
    x += "    </testcase>\n";
  }
  x += "  </testsuite>\n</testsuites>\n";
  return x;
}

std::string ToMarkdown(const Report& r) {
  const std::string outcome = !r.error.empty() ? "ERROR" : r.passed() ? "PASS" : "FAIL";
  std::string md = fmt::format("# attest: {} — {}\n\n", MdCell(r.kernel), outcome);
  md += MdCell(VerdictLine(r)) + "\n\n";
  // The console's summary table, monospaced.
  if (!r.verdicts.empty()) md += "```\n" + SummaryTable(r) + "```\n";
  bool any = false;
  for (const Verdict& v : r.verdicts) {
    if (v.pass) continue;
    if (!any) md += "\n## Failures\n\n";
    any = true;
    md += fmt::format("- **{} {}** (margin {}): {}\n", MdCell(v.check), MdCell(v.tensor),
                      Margin3(v.margin), MdCell(v.message));
    if (!v.repro.empty()) md += fmt::format("  `{}`\n", v.repro);
  }
  if (!r.verdicts.empty()) {
    // Every verdict, folded away (a gate has hundreds).
    md += fmt::format("\n<details><summary>All {} verdicts</summary>\n\n", r.verdicts.size());
    md += "| result | check | tensor | margin | observed | allowed | case | policy | worst |\n";
    md += "|---|---|---|---:|---:|---:|---|---|---|\n";
    for (const Verdict& v : r.verdicts) {
      md += fmt::format("| {} | {} | {} | {} | {:.3g} | {:.3g} | {} | {} | {} |\n",
                        v.pass ? "PASS" : "**FAIL**", MdCell(v.check), MdCell(v.tensor),
                        Margin3(v.margin), v.observed, v.allowed, MdCell(v.case_label),
                        MdCell(v.policy), MdCell(v.worst.ToString()));
    }
    md += "\n</details>\n";
  }
  if (!r.skipped.empty()) {
    md += fmt::format("\n<details><summary>{} rows skipped</summary>\n\n", r.skipped.size());
    for (const SkippedRow& s : r.skipped) {
      md += fmt::format("- {} [{}]: {}\n", MdCell(s.check), MdCell(s.label), MdCell(s.reason));
    }
    md += "\n</details>\n";
  }
  if (!r.timings.empty()) {
    md += "\n| phase | seconds |\n|---|---:|\n";
    for (const Timing& t : r.timings)
      md += fmt::format("| {} | {:.3f} |\n", MdCell(t.name), t.seconds);
  }
  return md;
}

Status WriteTextFile(const std::filesystem::path& path, std::string_view text) {
  return WriteFileAtomic(path, text);
}

Expected<std::filesystem::path> SaveFailureCase(const Case& c, const std::filesystem::path& dir,
                                                std::string_view kernel, const Verdict& verdict) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error{fmt::format("{}: cannot create directory: {}", dir.string(), ec.message())};
  const std::filesystem::path path =
      dir / FailureCaseFileName(CaseToText(c), kernel, verdict.check, verdict.tensor);
  if (Status s = SaveCase(path, c); !s.ok()) return s.error();
  return path;
}

}  // namespace attest
