// Suite and case runs (see run.h).
#include "run/run.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <map>

#include <fmt/format.h>

#include "kernels/exec/children.h"
#include "reference/case/inputs.h"
#include "reference/problem/paged.h"
#include "run/logical_view.h"
#include "verify/report/repro.h"
#include "verify/report/report.h"
#include "verify/tolerance/tolerance.h"

namespace attest {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One check on one context; a throwing kernel or check is a kernel error, not a harness crash.
// Why a row judged nothing: the check's own reason, else the generic one.
std::string NotApplicable(const CheckContext& ctx) {
  return ctx.not_applicable.empty() ? "not applicable to this case"
                                    : "not applicable: " + ctx.not_applicable;
}

// The checks that judge a paged or seqused problem on its logical view: one call's values
// against the oracle or a rule, or repeated calls on the same inputs; and `layouts`, which
// on these cases relates the paged call to the contiguous one (PagedAgreesWithContiguous).
bool OnLogicalView(std::string_view check) {
  constexpr std::string_view kOnView[] = {"accuracy",    "unwritten-outputs", "special-values",
                                          "determinism", "bias",              "consistency",
                                          "honesty",     kPagedAgreementCheck};
  return std::find(std::begin(kOnView), std::end(kOnView), check) != std::end(kOnView);
}

// `view`: the case's logical view, made on first use (a paged or seqused case).
std::vector<Verdict> RunOne(const CheckInfo& check, CheckContext& ctx,
                            std::unique_ptr<LogicalView>& view) {
  std::vector<Verdict> out;
  ctx.not_applicable.clear();
  // A learnable sink: only the checks whose rule includes it (CheckInfo::sink); the others
  // would re-call the kernel without it, or relate outputs by rules the sink breaks.
  if (ctx.case_.problem.sink && !check.sink) {
    ctx.not_applicable = "problem.sink: this check's rule does not model the learnable sink";
    return out;
  }
  // Likewise a learnable relative bias (CheckInfo::rel_bias).
  if (ctx.case_.problem.rel_bias && !check.rel_bias) {
    ctx.not_applicable =
        "problem.rel_bias: this check's rule does not model the learnable relative bias";
    return out;
  }
  // Paged and seqused problems (docs/semantics.md "Paged KV and seqused"): the checks that
  // judge one call's values, or repeated calls on the same inputs, run on the logical view
  // (logical_view.h); the relations build related problems from contiguous k, v and full
  // lengths, which a paged problem does not have.
  CheckContext* run_on = &ctx;
  if (HasLogicalView(ctx.case_.problem) && check.name != "non-interference") {
    if (!OnLogicalView(check.name)) {
      ctx.not_applicable = "paged or seqused problems: this relation builds contiguous problems";
      Finish(out, ctx);
      return out;
    }
    if (!view) view = MakeLogicalView(ctx);
    view->ctx.label = ctx.label;
    view->ctx.repro = ctx.repro;
    view->ctx.not_applicable.clear();
    run_on = &view->ctx;
  }
  try {
    out = run_on == &ctx || check.name != kPagedAgreementCheck
              ? check.run(*run_on)
              : PagedAgreesWithContiguous(*view, *ctx.kernel);
  } catch (const InfrastructureError&) {
    throw;  // the runner turns it into an Error (exit code 2)
  } catch (const std::exception& e) {
    out = {KernelError(*ctx.kernel, fmt::format("{} (the check threw)", check.name), e.what())};
  }
  if (run_on != &ctx) {
    ctx.not_applicable = run_on->not_applicable;
    // The values attest defines outside the used rows are empty rows and unseen keys
    // (docs/semantics.md), special-values' rule: every call on the case so far broke them.
    if (check.name == "special-values") {
      for (const std::string& broken : view->kernel->violations()) {
        out.push_back(Failure(check.name, broken.substr(0, broken.find(':')),
                              "the defined values outside the used rows", broken));
      }
    }
  }
  Finish(out, *run_on);
  return out;
}

// Saves the case of every failing verdict and points its repro line at the file. The repro
// runs `check`, the row's check (a kernel-error verdict names no check of its own).
Status SaveFailures(std::vector<Verdict>& verdicts, const Case& c, std::string_view check,
                    const RunOptions& options, RunResult& result) {
  for (Verdict& v : verdicts) {
    if (v.pass || !options.failure_dir) continue;
    auto path = SaveFailureCase(c, *options.failure_dir, options.kernel_spec, v);
    if (!path.ok()) return path.error();
    v.repro = ReproCommand(options.kernel_spec, *path, check);
    v.case_file = path->string();
    result.failure_cases.push_back(*path);
  }
  return {};
}

// One kernel-error verdict per case (run.h): the first one met; later ones on the same case
// are dropped and their checks named in its detail.
class KernelErrorFolder {
 public:
  // Removes from `verdicts` (the row `check` on the case `case_text`) the kernel errors of a
  // case that already has one in `kept`; returns whether it removed any.
  bool Fold(std::vector<Verdict>& verdicts, const std::string& case_text, std::string_view check,
            const std::vector<Verdict>& kept) {
    bool folded = false;
    std::vector<Verdict> out;
    for (Verdict& v : verdicts) {
      if (v.check != kKernelErrorCheck) {
        out.push_back(std::move(v));
        continue;
      }
      auto [it, first] = first_.try_emplace(case_text, Entry{kept.size() + out.size(), {}});
      if (first) {
        it->second.checks.push_back(std::string(check));
        out.push_back(std::move(v));
        continue;
      }
      folded = true;
      auto& checks = it->second.checks;
      if (std::find(checks.begin(), checks.end(), check) == checks.end()) {
        checks.push_back(std::string(check));
      }
    }
    verdicts = std::move(out);
    return folded;
  }
  // Names, in each kept verdict's detail, the checks of its case that met a kernel error.
  void Annotate(std::vector<Verdict>& kept) const {
    for (const auto& [text, e] : first_) {
      if (e.checks.size() < 2) continue;
      std::string names;
      for (const std::string& c : e.checks) names += (names.empty() ? "" : ", ") + c;
      Verdict& v = kept[e.index];
      v.detail = fmt::format("reported once for the case; the checks that met it: {}\n{}", names,
                             v.detail);
    }
  }

 private:
  struct Entry {
    size_t index;                     // of the kept verdict
    std::vector<std::string> checks;  // that met a kernel error on the case, in order
  };
  std::map<std::string, Entry> first_;
};

// Sets the case fields and shares the row's time between its verdicts.
void Attribute(std::vector<Verdict>& verdicts, const std::string& label, const Case& c,
               double seconds) {
  for (Verdict& v : verdicts) {
    v.case_label = label;
    v.case_ = c;
    v.seconds = seconds / static_cast<double>(verdicts.size());
  }
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
  ctx.cuda_oracle = options.cuda_oracle;
  // Perturbations drawn by checks follow the case, so a saved case reproduces them.
  ctx.seed = CaseSeed(c);
  // Long cases: sampled rows, drawn from the case's seed (a saved case samples the same rows).
  if (ShouldSample(c.problem, options.sample_above)) {
    ctx.sample = SampleRows(c.problem, {.seed = ctx.seed,
                                        .query_budget = kSampleBudget,
                                        .key_budget = kSampleBudget});
  }
  return ctx;
}

}  // namespace

Expected<std::optional<CudaOracleOptions>> ResolveOracleDevice(std::string_view choice,
                                                               const Capabilities& caps,
                                                               std::string_view field,
                                                               std::string* note) {
  if (note != nullptr) note->clear();
  if (choice != "auto" && choice != "cpu" && choice != "cuda") {
    return Error{fmt::format("{}: unknown oracle device '{}' (auto, cpu, cuda)", field, choice)};
  }
  const bool on_gpu = caps.device == "cuda";
  if (choice == "cpu" || (choice == "auto" && !on_gpu)) return std::optional<CudaOracleOptions>();
  // Whether the CUDA oracle runs here: its library loads and finds a GPU.
  std::string why;
  int devices = 0;
  try {
    devices = CudaDeviceCount(&why);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (devices > 0) {
    // The FP64 tensor-core path: the same expressions and bound as the FMA path, certified
    // against the CPU oracle on every feature (oracle_cuda_check), 2.3x faster on an H100.
    // ATTEST_ORACLE_CUDA_FMA=1 takes the plain FMA path instead (to tell the two apart, and
    // for the CPU-emulated library, whose FMA path is 7x faster than its emulated mma).
    CudaOracleOptions options;
    const char* fma = std::getenv("ATTEST_ORACLE_CUDA_FMA");
    options.mma = fma == nullptr || std::string_view(fma) != "1";
    return std::optional<CudaOracleOptions>(options);
  }
  if (choice == "cuda") return Error{fmt::format("{} cuda: {}", field, why)};
  if (note != nullptr) {
    *note = fmt::format("the kernel's tensors live on a CUDA GPU, but the float64 oracle runs on "
                        "the CPU: {}", why);
  }
  return std::optional<CudaOracleOptions>();
}

Expected<RunResult> RunSuite(Kernel& kernel, const Suite& suite, const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Capabilities caps = kernel.capabilities();
  auto profile = ProfileFor(caps);
  if (!profile.ok()) return Error{kernel.name() + ": " + profile.error().message};
  RunResult result;
  Report& report = result.report;
  report.kernel = options.kernel_spec;
  report.suite = suite.name;
  report.seed = options.seed;
  report.capabilities = caps;
  report.oracle_device = options.cuda_oracle ? "cuda" : "cpu";
  report.wall_times = options.timings;

  // The table, the rows generated from the capabilities, the fuzz tail (suite.h RowsFor).
  const std::vector<SuiteRow> rows = RowsFor(suite, caps, options.seed);
  size_t total = 0;
  for (const SuiteRow& row : rows) {
    if (options.only_check.empty() || row.check == options.only_check) ++total;
  }
  RunOptions::Progress progress{0, total, 0, {}};
  std::optional<CheckContext> ctx;
  std::string ctx_text;
  std::unique_ptr<LogicalView> view;  // of a paged or seqused case (RunOne)
  KernelErrorFolder folder;
  size_t index = 0;
  for (const SuiteRow& row : rows) {
    ++index;
    if (StopSignal() != 0) {
      return Error{fmt::format("interrupted by {} before row {} of {}", StopSignalName(), index,
                               suite.rows.size())};
    }
    if (!options.only_check.empty() && row.check != options.only_check) continue;
    ++report.rows;
    const CheckInfo* check = FindCheck(row.check);
    if (check == nullptr) {
      return Error{fmt::format("suite {}: row {} names unknown check '{}'", suite.name, index,
                               row.check)};
    }
    InstantiatedCase inst = Instantiate(row, caps, options.seed);
    progress.what = fmt::format("{}: {}", row.check, inst.label);
    if (options.progress) options.progress(progress);
    ++progress.done;
    if (!inst.c) {
      report.skipped.push_back({row.check, inst.label, inst.skipped});
      continue;
    }
    if (options.time_budget_s && Since(start) >= *options.time_budget_s) {
      Verdict v = Failure(row.check, "", "runs within the suite's time budget",
                          fmt::format("[{}] not run: the suite's time budget of {} s ran out",
                                      inst.label, *options.time_budget_s));
      v.repro = CheckCommand(options.kernel_spec, suite.name, options.seed);
      result.report.verdicts.push_back(std::move(v));
      continue;
    }
    // Consecutive rows on the same case share inputs, oracle and kernel answers.
    const std::string text = CaseToText(*inst.c);
    const auto t0 = std::chrono::steady_clock::now();
    if (!ctx || text != ctx_text) {
      auto made = MakeContext(kernel, *inst.c, *profile, options);
      if (!made.ok()) return Error{inst.label + ": " + made.error().message};
      ctx = std::move(made).value();
      ctx_text = text;
      view.reset();
    }
    ctx->label = inst.label;
    ctx->repro = CheckCommand(options.kernel_spec, suite.name, options.seed);
    std::vector<Verdict> verdicts;
    try {
      verdicts = RunOne(*check, *ctx, view);
    } catch (const InfrastructureError& e) {  // the oracle rejected the case, a full disk
      return Error{fmt::format("{}: {}", inst.label, e.what())};
    }
    // A stop kills the kernel's processes: what this row saw is not the kernel's doing.
    if (StopSignal() != 0) {
      return Error{fmt::format("interrupted by {} during row {} of {}", StopSignalName(), index,
                               suite.rows.size())};
    }
    const double seconds = Since(t0);
    if (options.timings) {
      report.timings.push_back({fmt::format("{} [{}]", row.check, inst.label), seconds});
    }
    const bool folded = folder.Fold(verdicts, text, row.check, report.verdicts);
    if (verdicts.empty()) {
      // Folded: the case's kernel error is reported already. Otherwise the relation or rule
      // has nothing to say about this case (a GQA relation on an MHA case, an honest
      // refusal): listed, so that a row that never judges anything shows.
      if (!folded) report.skipped.push_back({row.check, inst.label, NotApplicable(*ctx)});
      continue;
    }
    Attribute(verdicts, inst.label, *inst.c, seconds);
    if (Status s = SaveFailures(verdicts, *inst.c, row.check, options, result); !s.ok()) {
      return s.error();
    }
    for (Verdict& v : verdicts) {
      progress.failures += v.pass ? 0 : 1;
      report.verdicts.push_back(std::move(v));
    }
  }
  folder.Annotate(report.verdicts);
  SortByDiagnosis(report.verdicts);
  progress.what = "done";
  if (options.progress) options.progress(progress);
  result.seconds = report.seconds = Since(start);
  return result;
}

Expected<RunResult> RunCase(Kernel& kernel, const Case& c,
                            std::span<const CheckInfo* const> checks, const RunOptions& options,
                            const std::string& label) {
  const auto start = std::chrono::steady_clock::now();
  const Capabilities caps = kernel.capabilities();
  auto profile = ProfileFor(caps);
  if (!profile.ok()) return Error{kernel.name() + ": " + profile.error().message};
  RunResult result;
  Report& report = result.report;
  report.kernel = options.kernel_spec;
  report.suite = "repro";
  report.seed = c.generator ? c.generator->seed : 0;
  report.capabilities = caps;
  report.oracle_device = options.cuda_oracle ? "cuda" : "cpu";
  report.wall_times = options.timings;
  auto made = MakeContext(kernel, c, *profile, options);
  if (!made.ok()) return made.error();
  CheckContext ctx = std::move(made).value();
  std::unique_ptr<LogicalView> view;
  ctx.label = label;
  const std::string text = CaseToText(c);
  KernelErrorFolder folder;
  for (const CheckInfo* check : checks) {
    ++report.rows;
    ctx.repro = PendingReproCommand(options.kernel_spec, label, check->name);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Verdict> verdicts;
    try {
      verdicts = RunOne(*check, ctx, view);
    } catch (const InfrastructureError& e) {
      return Error{fmt::format("{}: {}", label, e.what())};
    }
    if (StopSignal() != 0) {
      return Error{fmt::format("{}: interrupted by {}", label, StopSignalName())};
    }
    if (!folder.Fold(verdicts, text, check->name, report.verdicts) && verdicts.empty()) {
      report.skipped.push_back({std::string(check->name), label, NotApplicable(ctx)});
    }
    Attribute(verdicts, label, c, Since(t0));
    for (Verdict& v : verdicts) report.verdicts.push_back(std::move(v));
  }
  folder.Annotate(report.verdicts);
  SortByDiagnosis(report.verdicts);
  result.seconds = report.seconds = Since(start);
  return result;
}

void SortByDiagnosis(std::vector<Verdict>& verdicts) {
  // Stable: within a step, verdicts keep the suite's row order (case by case).
  std::stable_sort(verdicts.begin(), verdicts.end(), [](const Verdict& a, const Verdict& b) {
    return DiagnosisRank(a.check, a.tensor) < DiagnosisRank(b.check, b.tensor);
  });
}

}  // namespace attest
