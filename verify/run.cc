// Suite and case runs (see run.h).
#include "verify/run.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include <fmt/format.h>

#include "kernels/exec/children.h"
#include "reference/problem/inputs.h"
#include "verify/report.h"
#include "verify/tolerance.h"

namespace attest {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One check on one context; a throwing kernel or check is a finding, not a harness crash.
std::vector<Verdict> RunOne(const CheckInfo& check, CheckContext& ctx) {
  std::vector<Verdict> out;
  try {
    out = check.run(ctx);
  } catch (const InfrastructureError&) {
    throw;  // the runner turns it into an Error (exit code 2)
  } catch (const std::exception& e) {
    out = {Failure(check.name, "", "runs to completion",
                   fmt::format("the check threw while running the kernel: {}", e.what()))};
  }
  Finish(out, ctx);
  return out;
}

// Saves the case of every failing verdict and points its repro line at the file.
Status SaveFailures(std::vector<Verdict>& verdicts, const Case& c, const RunOptions& options,
                    RunResult& result) {
  for (Verdict& v : verdicts) {
    if (v.pass || !options.failure_dir) continue;
    auto path = SaveFailureCase(c, *options.failure_dir, options.kernel_spec, v);
    if (!path.ok()) return path.error();
    v.repro = ReproCommand(options.kernel_spec, *path) + " --check " + v.check;
    result.failure_cases.push_back(*path);
  }
  return {};
}

Expected<CheckContext> MakeContext(Kernel& kernel, const Case& c, const Profile* profile,
                                   const RunOptions& options) {
  CheckContext ctx;
  ctx.kernel = &kernel;
  ctx.kernel_spec = options.kernel_spec;
  ctx.case_ = c;
  auto inputs = MakeCaseInputs(c);
  if (!inputs.ok()) return inputs.error();
  ctx.inputs = std::move(inputs).value();
  ctx.profile = profile;
  ctx.oracle_options = options.oracle;
  // Perturbations drawn by checks follow the case, so a saved case reproduces them.
  ctx.seed = c.generator ? c.generator->seed : std::hash<std::string>{}(CaseToText(c));
  return ctx;
}

}  // namespace

Expected<RunResult> RunSuite(Kernel& kernel, const Suite& suite, const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Capabilities caps = kernel.capabilities();
  auto profile = ProfileFor(caps);
  if (!profile.ok()) return Error{kernel.name() + ": " + profile.error().message};
  RunResult result;
  result.report.kernel = options.kernel_spec;
  result.report.suite = suite.name;
  result.report.seed = options.seed;

  std::optional<CheckContext> ctx;
  std::string ctx_text;
  size_t index = 0;
  for (const SuiteRow& row : suite.rows) {
    ++index;
    if (StopSignal() != 0) {
      return Error{fmt::format("interrupted by {} before row {} of {}", StopSignalName(), index,
                               suite.rows.size())};
    }
    if (!options.only_check.empty() && row.check != options.only_check) continue;
    const CheckInfo* check = FindCheck(row.check);
    if (check == nullptr) {
      return Error{fmt::format("suite {}: row {} names unknown check '{}'", suite.name, index,
                               row.check)};
    }
    InstantiatedCase inst = Instantiate(row, caps, options.seed);
    if (!inst.c) {
      result.skipped.push_back({row.check, inst.label, inst.skipped});
      continue;
    }
    if (options.time_budget_s && Since(start) >= *options.time_budget_s) {
      Verdict v = Failure(row.check, "", "runs within the suite's time budget",
                          fmt::format("[{}] not run: the suite's time budget of {} s ran out",
                                      inst.label, *options.time_budget_s));
      v.repro = fmt::format("attest check --kernel {} --suite {} --seed {}", options.kernel_spec,
                            suite.name, options.seed);
      result.report.verdicts.push_back(std::move(v));
      continue;
    }
    // Consecutive rows on the same case share inputs, oracle and kernel answers.
    const std::string text = CaseToText(*inst.c);
    if (!ctx || text != ctx_text) {
      auto made = MakeContext(kernel, *inst.c, *profile, options);
      if (!made.ok()) return Error{inst.label + ": " + made.error().message};
      ctx = std::move(made).value();
      ctx_text = text;
    }
    ctx->label = inst.label;
    ctx->repro = fmt::format("attest check --kernel {} --suite {} --seed {}", options.kernel_spec,
                             suite.name, options.seed);
    if (options.progress) {
      options.progress(fmt::format("[{}/{}] {}: {}", index, suite.rows.size(), row.check,
                                   inst.label));
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Verdict> verdicts;
    try {
      verdicts = RunOne(*check, *ctx);
    } catch (const InfrastructureError& e) {  // the oracle rejected the case, a full disk
      return Error{fmt::format("{}: {}", inst.label, e.what())};
    }
    // A stop kills the kernel's processes: what this row saw is not the kernel's doing.
    if (StopSignal() != 0) {
      return Error{fmt::format("interrupted by {} during row {} of {}", StopSignalName(), index,
                               suite.rows.size())};
    }
    if (options.timings) {
      result.report.timings.push_back({fmt::format("{} [{}]", row.check, inst.label), Since(t0)});
    }
    if (verdicts.empty()) {
      // The relation or rule has nothing to say about this case (a GQA relation on an MHA
      // case, an honest refusal): listed, so that a row that never judges anything shows.
      result.skipped.push_back({row.check, inst.label, "not applicable to this case"});
      continue;
    }
    if (Status s = SaveFailures(verdicts, *inst.c, options, result); !s.ok()) return s.error();
    for (Verdict& v : verdicts) result.report.verdicts.push_back(std::move(v));
  }
  SortByDiagnosis(result.report.verdicts);
  result.seconds = Since(start);
  return result;
}

Expected<RunResult> RunCase(Kernel& kernel, const Case& c,
                            std::span<const CheckInfo* const> checks, const RunOptions& options,
                            const std::string& label) {
  const auto start = std::chrono::steady_clock::now();
  auto profile = ProfileFor(kernel.capabilities());
  if (!profile.ok()) return Error{kernel.name() + ": " + profile.error().message};
  RunResult result;
  result.report.kernel = options.kernel_spec;
  result.report.suite = "repro";
  result.report.seed = c.generator ? c.generator->seed : 0;
  auto made = MakeContext(kernel, c, *profile, options);
  if (!made.ok()) return made.error();
  CheckContext ctx = std::move(made).value();
  ctx.label = label;
  for (const CheckInfo* check : checks) {
    ctx.repro = fmt::format("attest repro --kernel {} --case {} --check {}", options.kernel_spec,
                            label, check->name);
    std::vector<Verdict> verdicts;
    try {
      verdicts = RunOne(*check, ctx);
    } catch (const InfrastructureError& e) {
      return Error{fmt::format("{}: {}", label, e.what())};
    }
    if (StopSignal() != 0)
      return Error{fmt::format("{}: interrupted by {}", label, StopSignalName())};
    for (Verdict& v : verdicts) result.report.verdicts.push_back(std::move(v));
  }
  SortByDiagnosis(result.report.verdicts);
  result.seconds = Since(start);
  return result;
}

void SortByDiagnosis(std::vector<Verdict>& verdicts) {
  // Stable: within a step, verdicts keep the suite's row order (case by case).
  std::stable_sort(verdicts.begin(), verdicts.end(), [](const Verdict& a, const Verdict& b) {
    return DiagnosisRank(a.check, a.tensor) < DiagnosisRank(b.check, b.tensor);
  });
}

}  // namespace attest
