// Running checks (docs/design.md "CLI contract" `attest check` and
// `attest repro`): a suite's rows are instantiated for the kernel, consecutive rows on the same
// case share one context (inputs, oracle, kernel answers), every verdict carries the case it
// came from, and every failing case is saved with its one-line repro.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "reference/case/case_file.h"
#include "reference/oracle/oracle.h"
#include "reference/status.h"
#include "verify/checks/check.h"
#include "run/suite.h"
#include "verify/tolerance/verdict.h"

namespace attest {

struct RunOptions {
  std::string kernel_spec;  // as given on the command line (report and repro lines)
  uint64_t seed = 0;        // run seed, mixed into every row's seed
  // Where failing cases are saved (SaveFailureCase); unset: not saved, and the repro line is
  // the `attest check` command itself.
  std::optional<std::filesystem::path> failure_dir;
  OracleOptions oracle;
  // Set: the float64 oracle runs on the GPU (CheckContext::cuda_oracle); the report says so.
  std::optional<CudaOracleOptions> cuda_oracle;
  // Cases whose forward costs more multiply-adds than this are sampled (verify/metrics/sample.h
  // ShouldSample); tests lower it to sample short cases.
  double sample_above = kSampleAboveMacs;
  std::string only_check;  // run only the rows of this check ("" all)
  // Wall times of every row in the report's `timings` (off by default: the same seed then
  // gives an identical JSON report). Verdict::seconds is measured either way.
  bool timings = false;
  // Called before each row runs and once at the end (done == total), for progress output.
  struct Progress {
    size_t done = 0;   // rows finished
    size_t total = 0;  // rows of the suite
    int failures = 0;  // failing verdicts so far
    std::string what;  // the row about to run: "accuracy: causal Sq<Sk: B1 H2:2 ..."
  };
  std::function<void(const Progress&)> progress;
  // Wall-clock budget of a suite, checked before each row: once spent, every remaining row
  // that applies to the kernel is a failing verdict "not run: the suite's time budget ... ran
  // out", so that a slow or hanging kernel ends the run in bounded time with every verdict
  // recorded. Unset: no budget.
  std::optional<double> time_budget_s;
};

// Where the float64 oracle runs, for --oracle-device `choice` (`field` names the option in
// errors). "cpu": here (nullopt). "cuda": on the GPU (reference/oracle/cuda/
// oracle_cuda_host.h); an error saying why when its library or a GPU is missing. "auto": on
// the GPU when the kernel's tensors live there (Capabilities::device "cuda") and the library
// finds a GPU, else here; `note` then says why not (cleared when there is nothing to say).
Expected<std::optional<CudaOracleOptions>> ResolveOracleDevice(std::string_view choice,
                                                               const Capabilities& caps,
                                                               std::string_view field,
                                                               std::string* note);

struct RunResult {
  Report report;  // verdicts, skipped rows, rows, seconds
  std::vector<std::filesystem::path> failure_cases;  // one per failing verdict (may repeat)
  double seconds = 0;
};

// Runs a suite. Errors (exit code 2) are infrastructure faults: a case whose inputs cannot be
// made, a kernel whose profile is unknown, a suite naming an unknown check, a full disk
// (reference/status.h InfrastructureError), a stop requested by a signal (kernels/exec/
// children.h StopSignal). Everything the kernel does (errors, crashes as exceptions,
// refusals of claimed features, hangs) is a verdict; a kernel error is one check.h
// kKernelErrorCheck verdict per case, however many of the case's checks met it (the first
// call's; its detail names the checks that met it).
Expected<RunResult> RunSuite(Kernel& kernel, const Suite& suite, const RunOptions& options);

// Orders verdicts by check.h DiagnosisRank (stable): RunSuite and RunCase return their
// reports in this order, so the first failing verdict of a report names the bug class.
void SortByDiagnosis(std::vector<Verdict>& verdicts);

// Runs `checks` on one case (attest repro); `label` names the case in messages. Kernel errors
// as in RunSuite: one verdict for the case.
Expected<RunResult> RunCase(Kernel& kernel, const Case& c,
                            std::span<const CheckInfo* const> checks, const RunOptions& options,
                            const std::string& label);

}  // namespace attest
