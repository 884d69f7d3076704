// attest's public C++ API (installed as <attest/check.h>): run a suite of checks against a
// kernel and read the verdicts, from a kernel repository's own tests. The kernel is named by
// the same spec as on the command line: a built-in ("cpu/flash2-bf16"), a C ABI plugin
// ("plugin:/path/libk.so[:name]", built with attest_add_plugin and <attest/attest_kernel.h>)
// or an external worker ("exec:python3 worker.py"). This header depends on the C++ standard
// library only; attest's internal headers are not installed. <attest/gtest.h> wraps it for
// GoogleTest. `attest check --help` documents the same options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attest {

struct CheckOptions {
  std::string suite = "quick";  // quick, gate or full (`attest list suites`)
  uint64_t seed = 0;            // the same seed gives the same verdicts
  std::string only_check;       // run only this check's rows ("" every check)
  std::string failure_dir;      // failing cases saved here as *.case.json ("" not saved)
  int threads = 0;              // oracle threads (0: all cores)
  std::string oracle_device = "auto";  // where the float64 oracle runs: auto, cpu, cuda
  double time_budget_s = 0;     // wall-time budget of the suite (0: none)
  // The coverage guard, as `attest check` applies it: a run that leaves accuracy of o or lse
  // unjudged or skips more than this share of its rows fails, unless allow_skips.
  double max_skipped = 0.8;
  bool allow_skips = false;
};

// One verdict: a check's judgment of one tensor on one case.
struct CheckVerdict {
  std::string check;    // "accuracy", "non-interference", ...
  std::string tensor;   // "o", "lse", "dq", ... ("" when not about one tensor)
  std::string policy;   // the rule applied
  bool pass = false;
  double margin = 0;    // observed / allowed: <= 1 passes (inf: a categorical failure)
  std::string message;  // names the case, the worst element and the allowed error
  std::string repro;    // the one command line reproducing a failure
};

struct CheckResult {
  int exit_code = 2;                   // 0 every check holds, 1 a finding, 2 usage/infrastructure
  std::string error;                   // why, when exit_code is 2
  std::vector<CheckVerdict> verdicts;  // in diagnosis order: the first failure names the bug
  int skipped_rows = 0;                // rows outside the kernel's capabilities or not applicable
  double seconds = 0;
  // The JSON report (docs/report.schema.json), byte for byte what `attest check --json` writes
  // for the same kernel, suite, seed and options ("" when exit_code is 2).
  std::string json;

  bool passed() const { return exit_code == 0; }
  std::vector<CheckVerdict> failures() const;
  // The failures (check, tensor, margin, message, repro), then the verdict line; the error
  // alone when exit_code is 2.
  std::string Summary() const;
};

// Runs `options.suite` against the kernel `kernel_spec`: the run of `attest check`, coverage
// guard included (run/check_run.h). Never throws for what the kernel does (a crash, a
// refusal, a wrong value: verdicts); an unknown kernel, suite or check is exit_code 2 with
// `error` naming it.
CheckResult RunChecks(const std::string& kernel_spec, const CheckOptions& options = {});

}  // namespace attest
