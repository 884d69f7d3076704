// `attest check --kernel K [--suite quick|gate|full|long] [--seed S] [--json F] [--junit F]
// [--markdown F] [--out DIR] [--oracle-device auto|cpu|cuda] [-v | --quiet] [--allow-skips]`
// (docs/design.md "CLI contract"): the merge gate. A progress line on stderr while it runs; then on
// stdout the failures in full, one summary table (check x tensor) and the verdict line last (-v:
// every verdict and skipped row; --quiet: the verdict line alone). The coverage guard
// (run/coverage.h) fails a run that left a required family unjudged or skipped too many rows,
// unless --allow-skips. Reports are written also when the run cannot finish (exit 2: the report
// says why). Exit 0 all pass, 1 any failure (kernel errors, refusals of claimed features and
// coverage included), 2 bad usage, an unknown kernel or an infrastructure error. --time-budget
// bounds the suite's wall time (rows not started by then fail as not run).
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "run/build_info.h"
#include "run/check_run.h"
#include "tools/attest/command.h"
#include "tools/attest/progress.h"
#include "run/coverage.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

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
  std::string oracle_device = "auto";
  std::string gpu = "auto";
  double time_budget_s = 0;  // 0: none
  bool timings = false;
  bool verbose = false;
  bool quiet = false;
  bool allow_skips = false;
  double max_skipped = CoveragePolicy{}.max_skipped_share;
};

// A report file that could not be written (exit 2). The error report of an exit 2 is then not
// attempted: the file keeps what it held (whole, WriteTextFile writes atomically), rather than
// an error report replacing a previous run's report because it happens to be smaller.
struct ReportWriteError : UsageError {
  using UsageError::UsageError;
};

// Writes every requested report of `report`; a report that cannot be written is a usage error.
void WriteReports(const CheckCliOptions& opt, const Report& report) {
  const auto write = [](const std::string& path, const std::string& text) {
    if (path.empty()) return;
    if (Status s = WriteTextFile(path, text); !s.ok()) throw ReportWriteError(s.error().message);
  };
  write(opt.json, ToJsonText(report));
  write(opt.junit, ToJUnitXml(report));
  write(opt.markdown, ToMarkdown(report));
}

Report EmptyReport(const CheckCliOptions& opt) {
  Report r;
  r.kernel = opt.kernel;
  r.suite = opt.suite;
  r.seed = opt.seed;
  r.attest_version = std::string(AttestVersion());
  r.attest_commit = std::string(AttestCommit());
  return r;
}

int RunCheck(const CheckCliOptions& opt) {
  if (opt.verbose && opt.quiet) throw UsageError("-v and --quiet exclude each other");
  CheckRequest request;
  request.kernel_spec = opt.kernel;
  request.suite = opt.suite;
  request.seed = opt.seed;
  request.only_check = opt.only_check;
  request.failure_dir = opt.out;
  request.threads = opt.threads;
  request.oracle_device = opt.oracle_device;
  if (opt.time_budget_s > 0) request.time_budget_s = opt.time_budget_s;
  request.timings = opt.timings;
  request.max_skipped = opt.max_skipped;
  request.allow_skips = opt.allow_skips;
  ValidateCheckNames(request);
  // Before the run, not when the first failing case is saved.
  if (std::error_code ec; std::filesystem::exists(opt.out, ec) &&
                          !std::filesystem::is_directory(opt.out, ec)) {
    throw UsageError("--out " + opt.out + ": exists and is not a directory");
  }
  const auto gpu = ApplyGpuOption(opt.gpu, opt.quiet, "check");
  auto kernel = Kernels().Create(opt.kernel);
  if (!kernel.ok()) throw UsageError(kernel.error().message);
  ProgressLine progress(
      ProgressLine::Detect(fmt::format("check {} {}", opt.kernel, opt.suite), opt.quiet));
  request.progress = [&](const RunOptions::Progress& p) {
    progress.Update(static_cast<int64_t>(p.done), static_cast<int64_t>(p.total),
                    fmt::format("rows, {} failing verdict{}; {}", p.failures,
                                p.failures == 1 ? "" : "s", p.what));
  };
  const PreparedCheck prepared = PrepareCheck(request, **kernel);
  if (!prepared.oracle_note.empty() && !opt.quiet) {
    std::cerr << "attest check: " << prepared.oracle_note << "\n";
  }
  auto result = RunCheckSuite(**kernel, *prepared.suite, prepared.options, prepared.policy);
  progress.Finish();
  if (!result.ok()) throw UsageError(result.error().message);
  Report& report = result->report;
  if (gpu) {
    std::string visible;
    for (const auto& v : gpu->visible) visible += (visible.empty() ? "" : ",") + v;
    report.gpu = Report::LauncherGpu{gpu->local_rank, gpu->rank_source, visible,
                                     gpu->visible_source, gpu->chosen};
  }
  const Verbosity verbosity = opt.quiet     ? Verbosity::kQuiet
                              : opt.verbose ? Verbosity::kVerbose
                                            : Verbosity::kDefault;
  std::cout << ToConsole(report, verbosity);
  WriteReports(opt, report);
  return report.passed() ? kExitPass : kExitFinding;
}

Runner SetupCheck(CLI::App& sub) {
  auto opt = std::make_shared<CheckCliOptions>();
  sub.add_option("--kernel", opt->kernel,
                 "Kernel to check (`attest list kernels`, plugin:PATH[:NAME], exec:COMMAND)")
      ->required();
  sub.add_option("--suite", opt->suite,
                 "Suite: quick (< 30 s), gate (merge gate), full, long (8k-128k, sampled)")
      ->capture_default_str();
  AddUnsignedOption(sub, "--seed", opt->seed,
                    "Run seed (the same seed gives the same report; default 0)");
  sub.add_option("--json", opt->json, "Write the report as JSON (docs/report.schema.json)");
  sub.add_option("--junit", opt->junit, "Write the report as JUnit XML");
  sub.add_option("--markdown", opt->markdown, "Write the report as Markdown");
  sub.add_option("--out", opt->out, "Directory for failing cases (*.case.json)")
      ->capture_default_str();
  sub.add_option("--check", opt->only_check, "Run only the rows of this check");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  sub.add_option("--oracle-device", opt->oracle_device, kOracleDeviceHelp)->capture_default_str();
  AddGpuOption(sub, opt->gpu);
  AddSecondsOption(sub, "--time-budget", opt->time_budget_s,
                   "Wall-time budget of the suite: rows not started by then fail as not run");
  sub.add_flag("--timings", opt->timings, "Put wall times into the JSON report");
  sub.add_flag("-v,--verbose", opt->verbose, "Print every verdict and every skipped row");
  sub.add_flag("-q,--quiet", opt->quiet, "Print the verdict line alone (no progress)");
  sub.add_flag("--allow-skips", opt->allow_skips,
               "Accept a run that leaves required check families unjudged or skips more "
               "than --max-skipped of its rows (reported, not failed)");
  sub.add_option("--max-skipped", opt->max_skipped,
                 "Largest share of rows that may be skipped without --allow-skips")
      ->capture_default_str();
  return [opt] {
    try {
      return RunCheck(*opt);
    } catch (const ReportWriteError&) {
      throw;
    } catch (const UsageError& e) {
      // Exit 2 still leaves the reports CI asked for, saying why the run did not finish.
      Report r = EmptyReport(*opt);
      r.error = e.what();
      try {
        WriteReports(*opt, r);
      } catch (const UsageError&) {
        // The report path itself is unusable: the message below names the first error.
      }
      throw;
    }
  };
}

}  // namespace

ATTEST_COMMAND("check", "Run a suite of checks against a kernel (the merge gate)", 20,
               SetupCheck);

}  // namespace attest::cli
