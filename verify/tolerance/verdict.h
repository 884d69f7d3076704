// Verdicts and reports (docs/design.md "Checks"): every check reports a margin (observed /
// allowed) and the worst location, not just pass/fail; every verdict names the case it
// judged, and every failure carries the one line that reproduces it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "reference/case/case_file.h"
#include "verify/metrics/metrics.h"

namespace attest {

struct Verdict {
  std::string check;   // "accuracy", "non-interference", ...
  std::string tensor;  // "o", "lse", "dq", ... ("" when the check is not about one tensor)
  std::string policy;  // the rule applied, e.g. "err <= 2x baseline + 2 bf16 ulp(row)"
  bool pass = false;
  double observed = 0;  // the quantity measured at the worst location
  double allowed = 0;   // its bound there
  double margin = 0;    // observed / allowed: ≤ 1 passes; inf when allowed is 0 or the
                        // failure is categorical (NaN where the oracle is finite)
  Location worst;
  std::string message;  // one line for a person
  std::string repro;    // one command line reproducing the check ("" when it passed)
  // What stands behind the message when it abbreviates (a kernel error: the adapter's whole
  // text, e.g. a worker's stderr tail); "" when the message says everything.
  std::string detail;
  // The case judged: the suite row's label ("tile+1: B1 H2:2 Sq65 ..."), its case, and the
  // file it was saved to (failures under RunOptions::failure_dir). Unset outside suites.
  std::string case_label;
  std::optional<Case> case_;
  std::string case_file;
  // Wall time attributed to this verdict: its row's measured time shared between the row's
  // verdicts (the case's oracle and kernel calls are timed in the row that first needs them).
  double seconds = 0;
};

// observed / allowed, with 0/0 = 0 and x/0 = inf.
double Margin(double observed, double allowed);

struct Timing {
  std::string name;  // "oracle", "kernel forward", ...
  double seconds = 0;
};

// A suite row that produced no verdict: outside the kernel's capabilities, or a rule with
// nothing to say about its case.
struct SkippedRow {
  std::string check;
  std::string label;
  std::string reason;
};

// The verdicts of one check family (a check and one of its tensors) in a run, and whether
// the run had to produce some (run/coverage.h).
struct FamilyCount {
  std::string check;
  std::string tensor;
  int64_t verdicts = 0;
  int64_t failed = 0;
  bool required = false;
};

struct Report {
  std::string kernel;
  std::string suite;
  uint64_t seed = 0;
  // What the kernel declared (unset where no kernel ran, e.g. `attest compare`).
  std::optional<Capabilities> capabilities;
  std::vector<Verdict> verdicts;
  std::vector<SkippedRow> skipped;
  std::vector<Timing> timings;
  // Families and their counts as the coverage guard saw them (empty where it did not run).
  std::vector<FamilyCount> coverage;
  int64_t rows = 0;    // suite rows considered (judged + skipped)
  double seconds = 0;  // wall time of the run
  // Whether the JSON report carries wall times (Verdict::seconds, `timings`, `seconds`): off,
  // the same seed gives the same bytes. Console and JUnit always show them.
  bool wall_times = false;
  // An infrastructure error that ended the run (exit code 2): the report then says why and
  // holds what ran before it.
  std::string error;
  // The attest that wrote it (the CLI's build info); empty: the library's version, no commit.
  std::string attest_version;
  std::string attest_commit;
  // Where the float64 oracle ran: "cpu" or "cuda" (empty: no oracle ran, attest compare).
  std::string oracle_device;
  // The GPU a job launcher's local rank chose (run/launcher.h; `attest check --gpu auto`):
  // the rank, the variable it came from, the visible GPUs (comma-separated), the variable
  // that listed them, and the one taken. Unset where no launcher chose one.
  struct LauncherGpu {
    int64_t local_rank = 0;
    std::string local_rank_from;
    std::string visible;
    std::string visible_from;
    std::string chosen;
  };
  std::optional<LauncherGpu> gpu;

  bool passed() const;
  int failures() const;  // failing verdicts
};

}  // namespace attest
