// `attest fuzz --kernel K --seed S (--cases N | --time SEC) [--shard I/N] [--out DIR]` and
// `attest fuzz --merge DIR...` (docs/design.md "CLI contract"; docs/fuzz.md): draws
// (check, case) pairs inside the kernel's capabilities, shrinks the first failure, writes
// DIR/<check>-<hash>.case.json and prints its one-line repro. Exit codes: 0 nothing failed,
// 1 a failure was found (or a merged report holds one), 2 usage or infrastructure error.
// A progress line on stderr (tools/attest/progress.h): cases/s, failures, shrinking.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <regex>

#include "kernels/builtin.h"
#include "run/fuzz.h"
#include "reference/case/case_file.h"
#include "reference/data/generate.h"
#include "tools/attest/command.h"
#include "tools/attest/progress.h"
#include "verify/report/report.h"
#include "run/suite.h"

namespace attest::cli {
namespace {

struct FuzzCliOptions {
  std::string kernel;
  std::string baseline;
  uint64_t seed = 0;
  int64_t cases = -1;
  double seconds = -1;
  std::string shard = "0/1";
  std::string out;
  std::vector<std::string> merge;
  std::vector<std::string> checks;
  std::vector<std::string> generators;
  int64_t max_seqlen = 160;
  int max_failures = 1;
  bool no_shrink = false;
  bool quiet = false;
  bool case_log = false;
  std::string gpu = "auto";
};

// The run's progress (tools/attest/progress.h): cases done, rate, failures, shrinking.
void ShowProgress(ProgressLine& line, const FuzzOptions::Progress& p) {
  const double rate = p.seconds > 0 ? static_cast<double>(p.done) / p.seconds : 0.0;
  line.Update(p.done, p.planned,
              fmt::format("cases, {:.1f} cases/s, {} failure{}{}", rate, p.failures,
                          p.failures == 1 ? "" : "s", p.shrinking ? " (shrinking a failure)" : ""),
              /*force=*/p.shrinking);
}

int RunMerge(const FuzzCliOptions& opt) {
  std::vector<std::filesystem::path> dirs(opt.merge.begin(), opt.merge.end());
  auto merged = MergeFuzzReports(dirs);
  if (!merged.ok()) throw UsageError(merged.error().message);
  const auto& j = *merged;
  std::cout << fmt::format("merged {} shard report(s) of {} (seed {}): {} cases, {} failure(s)\n",
                           j["shards"].size(), j["kernel"].get<std::string>(), j["seed"].dump(),
                           j["cases_run"].get<int64_t>(), j["failures"].size());
  if (!j["missing_shards"].empty()) {
    std::cout << "missing shards: " << j["missing_shards"].dump() << "\n";
  }
  for (const auto& f : j["failures"]) {
    std::cout << fmt::format("FAIL {} (case {}, shard {}): {}\n  {}\n",
                             f["check"].get<std::string>(), f["case_index"].get<int64_t>(),
                             f["shard"].get<int64_t>(), f["message"].get<std::string>(),
                             f["repro"].get<std::string>());
  }
  auto case_log = MergeFuzzCaseLogs(dirs);
  if (!case_log.ok()) throw UsageError(case_log.error().message);
  if (!opt.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt.out, ec);
    const auto path = std::filesystem::path(opt.out) / "fuzz-merged.json";
    if (Status s = WriteTextFile(path, j.dump(2) + "\n"); !s.ok())
      throw UsageError(s.error().message);
    std::cout << "wrote " << path.string() << "\n";
    if (case_log->has_value()) {
      const auto log = std::filesystem::path(opt.out) / kFuzzCaseLogFile;
      if (Status s = WriteTextFile(log, **case_log); !s.ok()) throw UsageError(s.error().message);
      std::cout << "wrote " << log.string() << "\n";
    }
  }
  return j["failures"].empty() ? kExitPass : kExitFinding;
}

int RunFuzzCli(const FuzzCliOptions& opt) {
  if (!opt.merge.empty()) {
    if (!opt.kernel.empty() || opt.cases >= 0 || opt.seconds >= 0) {
      throw UsageError("--merge combines reports: give no --kernel, --cases or --time");
    }
    return RunMerge(opt);
  }
  if (opt.kernel.empty()) throw UsageError("--kernel is required (or --merge DIR...)");
  if ((opt.cases >= 0) == (opt.seconds >= 0))
    throw UsageError("give exactly one of --cases N and --time SEC");
  FuzzOptions fo;
  if (opt.shard == "auto") {
    auto shard = ShardFromLauncher(ProcessEnvironment());
    if (!shard.ok()) throw UsageError("--shard auto: " + shard.error().message);
    fo.shard_index = shard->index;
    fo.shard_count = shard->count;
    if (!opt.quiet) {
      std::cerr << fmt::format("attest fuzz: shard {}/{} from {}\n", shard->index, shard->count,
                               shard->source);
    }
  } else {
    std::smatch m;
    static const std::regex kShard(R"(^(\d+)/(\d+)$)");
    if (!std::regex_match(opt.shard, m, kShard)) {
      throw UsageError("--shard: expected I/N (e.g. 0/4) or auto, got '" + opt.shard + "'");
    }
    auto count = ParseInteger(m[2].str(), 1, int64_t{1} << 40);
    if (!count) throw UsageError("--shard: the count N: " + count.error().message);
    auto index = ParseInteger(m[1].str(), 0, *count - 1);
    if (!index) throw UsageError("--shard: the index I: " + index.error().message);
    fo.shard_index = *index;
    fo.shard_count = *count;
  }
  fo.kernel_spec = opt.kernel;
  fo.seed = opt.seed;
  if (opt.cases >= 0) fo.cases = opt.cases;
  if (opt.seconds >= 0) fo.seconds = opt.seconds;
  if (!opt.out.empty()) fo.out_dir = opt.out;
  if (opt.case_log && opt.out.empty()) throw UsageError("--case-log needs --out DIR");
  fo.case_log = opt.case_log;
  fo.checks = opt.checks;
  fo.limits.max_seqlen = opt.max_seqlen;
  for (const auto& g : opt.generators) {
    const auto names = GeneratorNames();
    if (std::find(names.begin(), names.end(), g) == names.end()) {
      throw UsageError("--generator: unknown generator '" + g + "'");
    }
  }
  fo.limits.generators = opt.generators;
  fo.shrink = !opt.no_shrink;
  fo.max_failures = opt.max_failures;
  if (fo.max_failures < 1) throw UsageError("--max-failures: must be >= 1");
  if (fo.limits.max_seqlen < 2) throw UsageError("--max-seqlen: must be >= 2");

  if (const auto gpu = ApplyGpuOption(opt.gpu, opt.quiet, "fuzz")) fo.gpu = gpu->ToJson();
  auto kernel = Kernels().Create(opt.kernel);
  if (!kernel.ok()) throw UsageError(kernel.error().message);
  std::unique_ptr<Kernel> baseline;
  if (!opt.baseline.empty()) {
    auto b = Kernels().Create(opt.baseline);
    if (!b.ok()) throw UsageError("--baseline: " + b.error().message);
    baseline = std::move(b).value();
    fo.baseline = baseline.get();
    fo.baseline_spec = opt.baseline;
  }
  ProgressLine printer(ProgressLine::Detect("fuzz " + opt.kernel, opt.quiet));
  fo.progress = [&](const FuzzOptions::Progress& p) { ShowProgress(printer, p); };
  auto report = RunFuzz(**kernel, fo);
  printer.Finish();
  if (!report.ok()) throw UsageError(report.error().message);
  const double rate = report->seconds > 0 ? report->cases_run / report->seconds : 0.0;
  std::cout << fmt::format(
      "fuzz {} seed {} shard {}/{}: {} cases in {:.1f} s ({:.1f} cases/s), "
      "{} failure(s)\n",
      opt.kernel, opt.seed, fo.shard_index, fo.shard_count, report->cases_run, report->seconds,
      rate, report->failures.size());
  if (!report->interrupted.empty()) {
    std::cout << fmt::format("interrupted by {}: the report covers the {} cases run{}\n",
                             report->interrupted, report->cases_run,
                             opt.out.empty() ? "" : " (" + opt.out + "/fuzz-report.json)");
  }
  for (const FuzzFailure& f : report->failures) {
    std::cout << fmt::format("FAIL {} {} (case {}; shrunk in {} steps from {} to {}): {}\n",
                             f.check, f.tensor.empty() ? "" : f.tensor, f.case_index,
                             f.shrink_steps, DescribeProblem(f.original.problem),
                             DescribeProblem(f.shrunk.problem), f.message);
    if (!f.case_file) std::cout << CaseToText(f.shrunk);
    std::cout << f.repro << "\n";
  }
  return report->failures.empty() ? kExitPass : kExitFinding;
}

Runner SetupFuzz(CLI::App& sub) {
  auto opt = std::make_shared<FuzzCliOptions>();
  sub.add_option("--kernel", opt->kernel, "Kernel to fuzz (see `attest list kernels`)");
  AddUnsignedOption(sub, "--seed", opt->seed,
                    "Run seed: the same seed draws the same cases anywhere");
  AddIntegerOption(sub, "--cases", opt->cases, 1, int64_t{1} << 62,
                   "Number of cases (over all shards)");
  AddSecondsOption(sub, "--time", opt->seconds, "Wall-time budget in seconds, shrinking included (instead of --cases)");
  sub.add_option("--shard", opt->shard,
                 "I/N: run the cases n with n mod N = I (default 0/1); auto: I/N from the job "
                 "launcher (Slurm array or tasks, torchrun, MPI, a Kubernetes Indexed Job with "
                 "ATTEST_SHARD_COUNT; docs/fuzz.md)");
  sub.add_option("--out", opt->out,
                 "Directory for <check>-<hash>.case.json files and fuzz-report.json");
  sub.add_option("--merge", opt->merge, "Combine the fuzz-report.json of these shard directories")
      ->expected(1, -1);
  sub.add_option("--baseline", opt->baseline,
                 "Differential mode: count a failure only if this kernel passes the same case "
                 "(e.g. a mutant's parent)");
  sub.add_option("--check", opt->checks, "Check families to draw (repeatable; default all)");
  sub.add_option("--generator", opt->generators,
                 "Value distributions to draw (repeatable; default: the calibrated domain, "
                 "see docs/fuzz.md)");
  AddIntegerOption(sub, "--max-seqlen", opt->max_seqlen, 2, 2147483647,
                   "Largest Sq, Sk drawn (default 160)");
  AddIntegerOption(sub, "--max-failures", opt->max_failures, 1, 1000000,
                 "Stop after this many failing cases (default 1)");
  sub.add_flag("--no-shrink", opt->no_shrink, "Save failing cases as drawn");
  sub.add_flag("--quiet", opt->quiet, "No progress output");
  sub.add_flag("--case-log", opt->case_log,
               "Also write DIR/fuzz-cases.jsonl: each case's check, case hash and verdict "
               "digest (--merge joins the shards' logs; docs/fuzz.md)");
  AddGpuOption(sub, opt->gpu);
  return [opt] { return RunFuzzCli(*opt); };
}

}  // namespace

ATTEST_COMMAND("fuzz", "Search for failing cases from a seed, shrink them, save repro cases", 30,
               SetupFuzz);

}  // namespace attest::cli
