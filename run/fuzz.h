// The fuzz engine behind `attest fuzz` (docs/fuzz.md; docs/design.md "CLI contract"): draws
// (check, case) pairs inside a kernel's capabilities from a seed, runs them with the verify/
// machinery (RunCase, the same code path as `attest repro`), shrinks a failing case
// deterministically (case_gen.h Shrink), and saves it as DIR/<check>-<hash>.case.json with
// its one-line repro.
//
// Case n of a run with seed S is drawn from PhiloxPicker(MixSeed(S, n)) (run/suite.h), so
// it is the same on any machine; `--shard I/N` runs the indices n with n mod N = I, so N
// shards of `--cases C` together run exactly the C cases of one unsharded run, disjointly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "run/case_gen.h"
#include "reference/case/case_file.h"
#include "reference/status.h"
#include "verify/checks/check.h"

namespace attest {

struct FuzzOptions {
  std::string kernel_spec;  // as given on the command line (case files, repro lines)
  uint64_t seed = 0;
  std::optional<int64_t> cases;   // total cases over all shards (exactly one of cases,
  std::optional<double> seconds;  // seconds: wall-time budget of this shard)
  int64_t shard_index = 0;
  int64_t shard_count = 1;
  std::optional<std::filesystem::path> out_dir;  // case files and fuzz-report.json
  std::vector<std::string> checks;               // check families to draw from (empty: every check)
  DrawLimits limits;
  bool shrink = true;
  int max_shrink_attempts = 200;
  // A shrink candidate must fail with a margin (observed / allowed) of at least this much:
  // > 1 keeps shrunk cases clear of the tolerance edge, so that a regression corpus
  // (golden/bugs) survives small tolerance changes. 0: any failure. Capped at the drawn
  // case's own margin.
  double shrink_min_margin = 0;
  int max_failures = 1;  // stop after this many failing cases (each one shrunk and saved)
  int oracle_threads = 1;
  // Also write DIR/fuzz-cases.jsonl (needs out_dir): one line per case run, in index order,
  // naming its check, the drawn case (the hash of its canonical text) and a digest of every
  // verdict the check returned, so that shards merged can be compared with one unsharded run
  // bit for bit (`attest fuzz --merge`, tools/campaign/shards.sh).
  bool case_log = false;
  // The GPU a job launcher's local rank chose (run/launcher.h GpuChoice::ToJson), recorded in
  // the report as "gpu"; null where none was chosen.
  nlohmann::json gpu;
  // Differential mode (mutation testing): a failure counts only when this kernel passes the
  // same (check, case); shrinking keeps that true. Cases that fail on both are counted in
  // FuzzCheckStats::baseline_failures and otherwise ignored.
  Kernel* baseline = nullptr;
  std::string baseline_spec;
  // Called after every case (and during shrinking, with shrinking = true).
  struct Progress {
    int64_t done = 0;      // cases run by this shard
    int64_t planned = -1;  // cases this shard will run (-1: time-bounded)
    int failures = 0;
    double seconds = 0;
    bool shrinking = false;
  };
  std::function<void(const Progress&)> progress;
};

struct FuzzFailure {
  int64_t case_index = -1;  // global index n
  std::string check;
  std::string tensor;
  std::string message;  // the failing verdict of the shrunk case
  double margin = 0;
  Case original;
  Case shrunk;
  int shrink_steps = 0;
  int shrink_attempts = 0;
  // Why shrinking stopped early: "deadline" (the --time budget ran out), "signal", or ""
  // (it ran to a fixpoint or to max_shrink_attempts).
  std::string shrink_cut;
  std::optional<std::filesystem::path> case_file;
  std::string repro;  // one line
};

struct FuzzCheckStats {
  int64_t cases = 0;   // cases drawn for the check
  int64_t judged = 0;  // cases on which it returned verdicts (not "not applicable")
  int64_t failures = 0;
  int64_t baseline_failures = 0;  // differential mode: failed on the baseline too (ignored)
  double seconds = 0;             // including shrinking of its failures
};

struct FuzzReport {
  std::string kernel;
  std::string baseline;  // differential mode only
  uint64_t seed = 0;
  int64_t shard_index = 0;
  int64_t shard_count = 1;
  std::optional<int64_t> cases_planned;  // --cases (over all shards)
  int64_t cases_run = 0;
  int64_t next_index = 0;  // first global index this shard did not run
  std::vector<std::pair<std::string, FuzzCheckStats>> per_check;  // in registry order
  std::vector<FuzzFailure> failures;
  double seconds = 0;
  // "SIGINT" when a signal stopped the run (kernels/exec/children.h StopSignal): the report
  // then covers the cases run until then, and --merge still accepts it; "" otherwise.
  std::string interrupted;
  nlohmann::json gpu;  // FuzzOptions::gpu
  // Deterministic part (no timings) as JSON; the file adds "seconds" fields.
  nlohmann::json ToJson(bool with_timings = true) const;
};

// The (check, case) pair of global index n. `checks` are the families drawn from.
struct FuzzCase {
  const CheckInfo* check = nullptr;
  Case c;
};
FuzzCase DrawFuzzCase(const Capabilities& caps, uint64_t seed, int64_t n,
                      const std::vector<const CheckInfo*>& checks, const DrawLimits& limits);

// Resolves option check names (errors name the unknown one); empty: every check drawn for a
// kernel with `caps` (verify/checks/check.h DrawnChecks).
Expected<std::vector<const CheckInfo*>> ResolveChecks(const std::vector<std::string>& names,
                                                      const Capabilities& caps);

// What `check` says about `c`: whether it applies (returned verdicts at all) and its failing
// verdicts. Errors are harness faults.
struct CheckOutcome {
  bool applicable = false;
  std::vector<Verdict> failing;
  int64_t verdicts = 0;        // every verdict the check returned
  std::string verdict_digest;  // VerdictDigest of them
  bool failed() const { return !failing.empty(); }
};
Expected<CheckOutcome> RunCheckOnCase(Kernel& kernel, const std::string& kernel_spec, const Case& c,
                                      const CheckInfo& check, int oracle_threads = 1);

// Runs a fuzz campaign. Errors are usage/infrastructure faults (exit code 2); findings are in
// the report (exit code 1 when report.failures is not empty).
Expected<FuzzReport> RunFuzz(Kernel& kernel, const FuzzOptions& options);

// "DIR/<check>-<hash>.case.json": hash = first 12 hex digits of SHA-256 of the case's
// canonical text (CaseToText), so equal cases give equal names on every machine.
std::filesystem::path FuzzCasePath(const std::filesystem::path& dir, const std::string& check,
                                   const Case& c);

inline constexpr const char* kFuzzReportFile = "fuzz-report.json";
inline constexpr const char* kFuzzCaseLogFile = "fuzz-cases.jsonl";

// The first 16 hex digits of the SHA-256 of the verdicts' canonical text (check, tensor,
// policy, pass, observed, allowed, margin in shortest round-trip form, message): equal
// verdicts give equal digests on every machine.
std::string VerdictDigest(const std::vector<Verdict>& verdicts);

// Combines the fuzz-report.json files of shard runs (same kernel, seed, shard count and
// --cases; distinct shard indices). The result lists missing shards under "missing_shards".
Expected<nlohmann::json> MergeFuzzReports(const std::vector<std::filesystem::path>& dirs);

// The shards' fuzz-cases.jsonl lines in index order: the text of one unsharded run's case log
// when the shards cover its cases. nullopt when no shard wrote one; an error when some did and
// some did not, or when a line is malformed or an index repeats.
Expected<std::optional<std::string>> MergeFuzzCaseLogs(
    const std::vector<std::filesystem::path>& dirs);

}  // namespace attest
