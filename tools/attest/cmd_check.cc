// `attest check --kernel K [--suite quick|gate|full] [--seed S] [--json F] [--junit F]
// [--markdown F] [--out DIR]` (DESIGN.md "CLI contract"; issue "verify/" item 4): the merge
// gate. One console line per verdict with its margin, reports, every failing case saved under
// DIR with its one-line `attest repro`. Exit 0 all pass, 1 any failure (kernel errors and
// refusals of claimed features included), 2 bad usage or an unknown kernel.
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "tools/attest/command.h"
#include "verify/report.h"
#include "verify/run.h"
#include "verify/suite.h"

namespace attest::cli {
namespace {

struct CheckCliOptions {
  std::string kernel;
  std::string suite = "quick";
  uint64_t seed = 0;
  std::string json, junit, markdown;
  std::string out = "attest-failures";
  std::string only_check;
  int threads = 0;
  double time_budget_s = 0;  // 0: none
  bool timings = false;
  bool verbose = false;
};

void WriteOrThrow(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  if (Status s = WriteTextFile(path, text); !s.ok()) throw UsageError(s.error().message);
}

int RunCheck(const CheckCliOptions& opt) {
  // Before the run, not when the first failing case is saved.
  if (std::error_code ec; std::filesystem::exists(opt.out, ec) &&
                          !std::filesystem::is_directory(opt.out, ec)) {
    throw UsageError("--out " + opt.out + ": exists and is not a directory");
  }
  auto kernel = Kernels().Create(opt.kernel);
  if (!kernel.ok()) throw UsageError(kernel.error().message);
  const Suite* suite = FindSuite(opt.suite);
  if (suite == nullptr) {
    throw UsageError("--suite: unknown suite '" + opt.suite + "' (quick, gate, full)");
  }
  if (!opt.only_check.empty() && FindCheck(opt.only_check) == nullptr) {
    throw UsageError("--check: unknown check '" + opt.only_check +
                     "' (see `attest list checks`)");
  }
  RunOptions ro;
  ro.kernel_spec = opt.kernel;
  ro.seed = opt.seed;
  ro.failure_dir = opt.out;
  ro.oracle.threads = opt.threads;
  ro.only_check = opt.only_check;
  ro.timings = opt.timings;
  if (opt.time_budget_s > 0) ro.time_budget_s = opt.time_budget_s;
  if (opt.verbose) ro.progress = [](const std::string& line) { std::cerr << line << "\n"; };

  auto result = RunSuite(**kernel, *suite, ro);
  if (!result.ok()) throw UsageError(result.error().message);
  const Report& report = result->report;
  std::cout << ToConsole(report);
  for (const SkippedRow& s : result->skipped) {
    std::cout << fmt::format("SKIP {} [{}]: {}\n", s.check, s.label, s.reason);
  }
  std::cout << fmt::format("{} verdicts, {} rows skipped, {:.1f} s\n", report.verdicts.size(),
                           result->skipped.size(), result->seconds);
  if (!opt.json.empty()) {
    nlohmann::json j = ToJson(report);
    nlohmann::json skipped = nlohmann::json::array();
    for (const SkippedRow& s : result->skipped) {
      skipped.push_back({{"check", s.check}, {"case", s.label}, {"reason", s.reason}});
    }
    j["skipped"] = skipped;
    WriteOrThrow(opt.json,
                 j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  WriteOrThrow(opt.junit, ToJUnitXml(report));
  WriteOrThrow(opt.markdown, ToMarkdown(report));
  return report.passed() ? kExitPass : kExitFinding;
}

Runner SetupCheck(CLI::App& sub) {
  auto opt = std::make_shared<CheckCliOptions>();
  sub.add_option("--kernel", opt->kernel,
                 "Kernel to check (`attest list kernels`, plugin:PATH[:NAME], exec:COMMAND)")
      ->required();
  sub.add_option("--suite", opt->suite, "Suite: quick (< 30 s), gate (merge gate), full")
      ->capture_default_str();
  AddUnsignedOption(sub, "--seed", opt->seed,
                    "Run seed (the same seed gives the same report; default 0)");
  sub.add_option("--json", opt->json, "Write the report as JSON");
  sub.add_option("--junit", opt->junit, "Write the report as JUnit XML");
  sub.add_option("--markdown", opt->markdown, "Write the report as Markdown");
  sub.add_option("--out", opt->out, "Directory for failing cases (*.case.json)")
      ->capture_default_str();
  sub.add_option("--check", opt->only_check, "Run only the rows of this check");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  AddSecondsOption(sub, "--time-budget", opt->time_budget_s,
                   "Wall-time budget of the suite: rows not started by then fail as not run");
  sub.add_flag("--timings", opt->timings, "Put wall times into the report");
  sub.add_flag("-v,--verbose", opt->verbose, "Print each case as it starts (stderr)");
  return [opt] { return RunCheck(*opt); };
}

}  // namespace

ATTEST_COMMAND("check", "Run a suite of checks against a kernel (the merge gate)", 20,
               SetupCheck);

}  // namespace attest::cli
