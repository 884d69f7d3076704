// Report writers (see report.h). JUnit follows the Ant/Jenkins JUnit XML schema as commonly
// consumed by CI (testsuites > testsuite > properties, testcase > failure, system-out);
// verify/testdata/junit.xsd is the schema report_test validates against.
#include "verify/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "reference/io/files.h"
#include "verify/checks/check.h"

namespace attest {
namespace {

nlohmann::json Number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

std::string Margin3(double m) {
  if (std::isinf(m)) return "inf";
  return fmt::format("{:.3f}", m);
}

double TotalSeconds(const Report& r) {
  double s = 0;
  for (const Timing& t : r.timings) s += t.seconds;
  return s;
}

std::string CaseName(const Verdict& v) {
  std::string name = v.check;
  if (!v.tensor.empty()) name += "/" + v.tensor;
  if (!v.policy.empty()) name += " [" + v.policy + "]";
  return name;
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

std::string Sanitize(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out.substr(0, 80);
}

}  // namespace

double Margin(double observed, double allowed) {
  if (std::isnan(observed) || std::isnan(allowed)) return std::numeric_limits<double>::infinity();
  if (observed == 0) return 0.0;
  if (allowed <= 0) return std::numeric_limits<double>::infinity();
  return observed / allowed;
}

bool Report::passed() const { return failures() == 0; }

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

std::string ToConsole(const Report& r) {
  std::string out;
  size_t check_w = 5, tensor_w = 1;
  for (const Verdict& v : r.verdicts) {
    check_w = std::max(check_w, v.check.size());
    tensor_w = std::max(tensor_w, v.tensor.size());
  }
  for (const Verdict& v : r.verdicts) {
    out += fmt::format("{} {:<{}} {:<{}} margin {:>7}  {}", v.pass ? "PASS" : "FAIL", v.check,
                       check_w, v.tensor, tensor_w, Margin3(v.margin), v.policy);
    if (v.worst.flat >= 0 || v.worst.b >= 0 || v.worst.h >= 0) {
      out += "  worst " + v.worst.ToString();
    }
    out += "\n";
    if (!v.pass) {
      if (!v.message.empty()) out += "     " + v.message + "\n";
      if (!v.repro.empty()) out += "     repro: " + v.repro + "\n";
    }
  }
  out += fmt::format("{}: {} of {} checks failed (kernel {}, suite {}, seed {})\n",
                     r.passed() ? "PASS" : "FAIL", r.failures(), r.verdicts.size(), r.kernel,
                     r.suite, r.seed);
  if (const Verdict* f = FirstFailure(r)) {
    out += fmt::format("first failing check (the diagnosis): {}{} margin {}\n", f->check,
                       f->tensor.empty() ? "" : " " + f->tensor, Margin3(f->margin));
  }
  return out;
}

nlohmann::json ToJson(const Report& r) {
  nlohmann::json verdicts = nlohmann::json::array();
  for (const Verdict& v : r.verdicts) {
    verdicts.push_back({{"check", v.check},
                        {"tensor", v.tensor},
                        {"policy", v.policy},
                        {"pass", v.pass},
                        {"observed", Number(v.observed)},
                        {"allowed", Number(v.allowed)},
                        {"margin", Number(v.margin)},
                        {"worst",
                         {{"b", v.worst.b},
                          {"h", v.worst.h},
                          {"i", v.worst.i},
                          {"d", v.worst.d},
                          {"flat", v.worst.flat},
                          {"observed", Number(v.worst.observed)},
                          {"reference", Number(v.worst.reference)}}},
                        {"message", v.message},
                        {"repro", v.repro}});
  }
  nlohmann::json timings = nlohmann::json::array();
  for (const Timing& t : r.timings) timings.push_back({{"name", t.name}, {"seconds", t.seconds}});
  nlohmann::json first = nullptr;
  if (const Verdict* f = FirstFailure(r)) {
    first = {{"check", f->check}, {"tensor", f->tensor}, {"margin", Number(f->margin)}};
  }
  return {{"kernel", r.kernel},     {"suite", r.suite},         {"seed", r.seed},
          {"passed", r.passed()},   {"failures", r.failures()}, {"verdicts", verdicts},
          {"first_failure", first}, {"timings", timings}};
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

std::string ToJUnitXml(const Report& r) {
  const std::string suite = r.suite.empty() ? r.kernel : r.kernel + " " + r.suite;
  const double seconds = TotalSeconds(r);
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += fmt::format(
      "<testsuites name=\"attest\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
      "time=\"{:.3f}\">\n",
      r.verdicts.size(), r.failures(), seconds);
  x += fmt::format(
      "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" "
      "skipped=\"0\" time=\"{:.3f}\">\n",
      XmlEscape(suite), r.verdicts.size(), r.failures(), seconds);
  x += "    <properties>\n";
  x += fmt::format("      <property name=\"kernel\" value=\"{}\"/>\n", XmlEscape(r.kernel));
  x += fmt::format("      <property name=\"suite\" value=\"{}\"/>\n", XmlEscape(r.suite));
  x += fmt::format("      <property name=\"seed\" value=\"{}\"/>\n", r.seed);
  for (const Timing& t : r.timings) {
    x += fmt::format("      <property name=\"time.{}\" value=\"{:.6f}\"/>\n", XmlEscape(t.name),
                     t.seconds);
  }
  x += "    </properties>\n";
  for (const Verdict& v : r.verdicts) {
    x += fmt::format("    <testcase name=\"{}\" classname=\"attest.{}\" time=\"0\">\n",
                     XmlEscape(CaseName(v)), XmlEscape(r.kernel));
    if (!v.pass) {
      x += fmt::format("      <failure message=\"{}\" type=\"{}\">", XmlEscape(v.message),
                       XmlEscape(v.check));
      x += XmlEscape(fmt::format("margin {} (observed {:.6g}, allowed {:.6g})\nworst {}\n{}",
                                 Margin3(v.margin), v.observed, v.allowed, v.worst.ToString(),
                                 v.repro.empty() ? "" : "repro: " + v.repro));
      x += "</failure>\n";
    }
    x += fmt::format("      <system-out>margin {} observed {:.6g} allowed {:.6g}</system-out>\n",
                     Margin3(v.margin), v.observed, v.allowed);
    x += "    </testcase>\n";
  }
  x += "  </testsuite>\n</testsuites>\n";
  return x;
}

std::string ToMarkdown(const Report& r) {
  std::string md =
      fmt::format("# attest: {} — {}\n\n", MdCell(r.kernel), r.passed() ? "PASS" : "FAIL");
  md += fmt::format("Suite `{}`, seed {}: {} of {} checks failed.\n\n", MdCell(r.suite), r.seed,
                    r.failures(), r.verdicts.size());
  md += "| result | check | tensor | margin | observed | allowed | policy | worst |\n";
  md += "|---|---|---|---:|---:|---:|---|---|\n";
  for (const Verdict& v : r.verdicts) {
    md += fmt::format("| {} | {} | {} | {} | {:.3g} | {:.3g} | {} | {} |\n",
                      v.pass ? "PASS" : "**FAIL**", MdCell(v.check), MdCell(v.tensor),
                      Margin3(v.margin), v.observed, v.allowed, MdCell(v.policy),
                      MdCell(v.worst.ToString()));
  }
  bool any = false;
  for (const Verdict& v : r.verdicts) {
    if (v.pass) continue;
    if (!any) md += "\n## Failures\n\n";
    any = true;
    md += fmt::format("- **{} {}**: {}\n", MdCell(v.check), MdCell(v.tensor), v.message);
    if (!v.repro.empty()) md += fmt::format("  `{}`\n", v.repro);
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

std::string ReproCommand(std::string_view kernel, const std::filesystem::path& case_file) {
  // Single quotes keep spaces of exec: kernels together in a shell.
  const auto quote = [](std::string_view s) {
    if (s.find_first_of(" \t'\"$\\;&|<>()*?") == std::string_view::npos) return std::string(s);
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  return fmt::format("attest repro --kernel {} --case {}", quote(kernel),
                     quote(case_file.string()));
}

Expected<std::filesystem::path> SaveFailureCase(const Case& c, const std::filesystem::path& dir,
                                                std::string_view kernel, const Verdict& verdict) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error{fmt::format("{}: cannot create directory: {}", dir.string(), ec.message())};
  const std::string text = CaseToText(c);
  const size_t hash = std::hash<std::string>{}(text);
  const std::string name = fmt::format(
      "{}-{}-{}-{:08x}.case.json", Sanitize(kernel), Sanitize(verdict.check),
      Sanitize(verdict.tensor.empty() ? "all" : verdict.tensor), static_cast<uint32_t>(hash));
  const std::filesystem::path path = dir / name;
  if (Status s = SaveCase(path, c); !s.ok()) return s.error();
  return path;
}

}  // namespace attest
