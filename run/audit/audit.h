// `attest audit`'s data (docs/audit.md; docs/design.md "CLI contract"): the
// measurements a person reads before a low-precision training run, collected with the
// existing library only (oracle, metrics, accuracy / non-interference / consistency checks,
// case files): error against sequence length and head dim for o and each gradient (kernel and
// baseline), error by input value distribution, maps of how much protected outputs move when
// masked-out inputs are perturbed (a leak through shared block scales shows as a band along
// the diagonal), the non-interference verdicts with the smallest leaking case and its repro,
// the consistency identities, gradient bias with its standard error over seeds, and every
// verdict with its margin. Rendering lives in render.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/case/case_file.h"
#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/problem/problem.h"
#include "reference/status.h"
#include "verify/tolerance/verdict.h"

namespace attest {

// The settings of one audit, as data. DefaultAuditPlan / QuickAuditPlan are the two the CLI
// offers; tests build smaller ones.
struct AuditPlan {
  int64_t heads = 2;  // Hq = Hkv of every sweep case
  // Error against sequence length: causal, Sq = Sk = each value, D = seqlen_head_dim.
  std::vector<int64_t> seqlens;
  int64_t seqlen_head_dim = 128;
  // Error against head dim (kept where both kernel and baseline claim it): causal,
  // Sq = Sk = head_dim_seqlen.
  std::vector<int64_t> head_dims;
  int64_t head_dim_seqlen = 512;
  // Error by value distribution: rows of reference/data's generator table, by name, at
  // Sq = Sk = distribution_seqlen (non-causal, D = seqlen_head_dim). A name missing from the
  // table is an error that names it.
  std::vector<std::string> distributions;
  // Generator params per distribution name (absent: the row's defaults). near-max is drawn
  // near the e4m3 maximum (448), the saturation point of every FP8 recipe's operands, not
  // near the input dtype's maximum, where fp32 scores overflow in any kernel.
  nlohmann::json distribution_params = {{"near-max", {{"format", "e4m3fn"}}}};
  int64_t distribution_seqlen = 512;
  // Leak maps: causal, one head, Sq = Sk = leak_seqlen, cells of leak_block positions.
  int64_t leak_seqlen = 256;
  int64_t leak_block = 8;
  // Non-interference: causal Sq = Sk = each value (smallest first), then window, Sq < Sk and
  // packed-document cases of leak_seqlen size.
  std::vector<int64_t> ni_seqlens;
  // Consistency identities: cases of this size (non-causal, causal, GQA, packed documents).
  int64_t consistency_seqlen = 128;
  // Gradient bias: this many seeds of a causal Sq = Sk = bias_seqlen gaussian case.
  int bias_seeds = 8;
  int64_t bias_seqlen = 256;
};

// The distributions the audit requires, in display order (reference/data generator names).
std::vector<std::string> DefaultAuditDistributions();
AuditPlan DefaultAuditPlan();
AuditPlan QuickAuditPlan();

struct AuditProgress {
  int64_t done = 0;   // steps finished
  int64_t total = 0;  // steps planned
  std::string what;   // the step starting now ("seq-len sweep S=1024")
};

struct AuditOptions {
  std::string kernel_spec;                        // kernel under audit
  std::string baseline_spec = "cpu/flash2-bf16";  // plotted beside it
  uint64_t seed = 0;
  AuditPlan plan = DefaultAuditPlan();
  int threads = 0;  // oracle threads (0: all cores)
  // Where the float64 oracle runs: "auto", "cpu" or "cuda" (run/run.h ResolveOracleDevice).
  std::string oracle_device = "cpu";
  // Set by RunAudit from oracle_device: the oracle runs on the GPU (CheckContext::cuda_oracle).
  std::optional<CudaOracleOptions> cuda_oracle;
  // Where the smallest leaking case is written (its case file); empty: not written.
  std::filesystem::path out_dir;
  std::function<void(const AuditProgress&)> progress;
};

// The output tensors the audit plots (lse is judged but not plotted: its error is a scalar
// per row and tracks o's).
inline constexpr std::string_view kAuditTensors[] = {"o", "dq", "dk", "dv"};

// Error of one tensor of one kernel on one case, against the float64 oracle.
struct TensorError {
  bool present = false;  // the kernel produced this tensor
  double rel_l2 = std::numeric_limits<double>::quiet_NaN();   // ||obs - ref|| / ||ref||
  double max_rel = std::numeric_limits<double>::quiet_NaN();  // max|obs - ref| / max|ref|
  double bias = std::numeric_limits<double>::quiet_NaN();     // mean(err) / rms(err)
  // mean(err * sign(ref)) / rms(err): < 0 when the kernel shrinks magnitudes toward zero
  // (the effect that scales a training step), independent of the sign balance of ref.
  double magnitude_bias = std::numeric_limits<double>::quiet_NaN();
  int64_t nonfinite = 0;  // non-finite mismatches (metrics.h)
  int64_t elements = 0;
};

// One kernel's answer on one case: per tensor errors, or why there are none.
struct KernelErrors {
  std::map<std::string, TensorError, std::less<>> tensors;
  std::string note;  // "unsupported: ..." / "error: ..." when the kernel gave no outputs
};

struct AuditCase {
  std::string label;  // "S=1024", "heavy-tail", ...
  Case c;
  KernelErrors kernel, baseline;
  std::vector<Verdict> verdicts;  // the kernel's accuracy verdicts (sweeps only)
};

// Error against a swept quantity: one case per x.
struct Sweep {
  std::string name;     // "seqlen", "head_dim"
  std::string x_label;  // "sequence length (Sq = Sk)"
  std::vector<double> x;
  std::vector<AuditCase> cases;  // cases[i] at x[i]
};

// How far protected outputs move under perturbations of inputs they must not see. Cells are
// blocks of `block` positions: rows are blocks of the judged outputs (query blocks for o and
// dq, key blocks for dk / dv), columns the perturbed blocks (keys for o and dq, queries for
// dk / dv). A cell holds max |change| / max |unperturbed output| over its rows that can see
// none of the perturbed positions: 0 exactly when every such output is bitwise unchanged; NaN
// when every row of the block sees some perturbed position (not judged).
struct LeakMap {
  std::string tensor;      // "o", "dq", "dk,dv"
  std::string row_label;   // "query block"
  std::string col_label;   // "perturbed key block"
  std::string perturbation;
  int64_t block = 0;
  int64_t rows = 0, cols = 0;
  std::vector<double> cells;  // rows x cols, row-major
  int64_t judged_cells = 0;
  int64_t leaking_cells = 0;  // judged cells whose value is not 0
  double max_change = 0;      // largest judged cell
  std::string note;           // why the map is empty (no backward, unsupported, ...)

  double At(int64_t r, int64_t c) const { return cells[static_cast<size_t>(r * cols + c)]; }
};

struct LeakMaps {
  Problem problem;           // the causal case the maps were measured on
  std::vector<LeakMap> maps;  // o, dq, dk,dv (the last two only with a backward)
};

// One non-interference case and its verdicts.
struct NonInterferenceCase {
  std::string label;  // "causal S=32", "window (16, 0) S=256", "3 packed documents"
  Case c;
  int64_t size = 0;  // Sq * Sk summed over sequences: the order "smallest" refers to
  std::vector<Verdict> verdicts;
  bool leaks = false;  // a protected output moved (a kernel error is not a leak)
  // The first kernel-error verdict's message when a call of the check failed (a crash, a
  // timeout, an Unsupported answer to a claimed problem): the case was not judged for leaks.
  std::string kernel_error;
  std::string note;  // "not applicable: ..." when the check had nothing to judge
};

struct NonInterferenceSummary {
  std::vector<NonInterferenceCase> cases;  // smallest first
  int smallest_leak = -1;                  // index into cases, -1: none leaks
  int kernel_errors = 0;                   // cases not judged: a call of the kernel failed
  std::string case_file;                   // the smallest leaking case, written into out_dir
  std::string repro;                       // "attest repro --kernel K --case F"
};

struct ConsistencyCase {
  std::string label;
  Case c;
  std::vector<Verdict> verdicts;
  std::string note;
  // The bias check (verify/checks/bias.h) on the same case: its verdicts (their messages
  // carry each tensor's mean signed error in ulps, passing or not) or why it abstained.
  std::vector<Verdict> bias;
  std::string bias_note;
};

// Bias of one tensor over seeds: each seed gives one value (TensorError::bias or
// magnitude_bias); mean and its standard error (sample std / sqrt(n)). |mean| well above its
// standard error is systematic; around 1/sqrt(elements) per seed is what unbiased rounding
// gives.
struct BiasStat {
  std::string tensor;
  int n = 0;
  double kernel_mean = 0, kernel_se = 0;
  double baseline_mean = 0, baseline_se = 0;
  double kernel_magnitude_mean = 0, kernel_magnitude_se = 0;
  double baseline_magnitude_mean = 0, baseline_magnitude_se = 0;
  double elements = 0;  // per seed
};

// A verdict with where it came from, for the verdict table.
struct AuditVerdict {
  std::string area;  // "accuracy", "non-interference", "consistency"
  std::string case_label;
  Verdict verdict;
};

struct AuditResult {
  std::string kernel;
  std::string kernel_description;
  std::string baseline;
  std::string profile;  // tolerance profile the accuracy verdicts used
  std::string recipe;   // "" for element-precision kernels
  bool has_backward = false;
  bool sequence_block_scales = false;  // some operand shares a scale along the sequence
  uint64_t seed = 0;
  std::string oracle_device = "cpu";  // where the float64 oracle ran: "cpu" or "cuda"
  std::string oracle_note;  // why a GPU kernel's oracle ran on the CPU (empty: nothing to say)
  AuditPlan plan;
  Sweep seqlen, head_dim;
  Sweep distributions;  // x = index into plan.distributions, cases labelled by name
  LeakMaps leak;
  NonInterferenceSummary non_interference;
  std::vector<ConsistencyCase> consistency;
  std::vector<BiasStat> bias;
  std::vector<AuditVerdict> verdicts;  // every verdict of the audit, in order
  double seconds = 0;

  bool passed() const;
  int failures() const;
  bool leaks() const { return non_interference.smallest_leak >= 0; }
};

// Runs the audit. Errors (exit code 2): unknown kernel or baseline, a baseline that cannot run
// the kernel's cases (another dtype), a distribution missing from the generator table, the
// oracle rejecting a case, a case file that cannot be written. Everything the kernel does is
// data or a verdict.
Expected<AuditResult> RunAudit(const AuditOptions& options);

// Number of progress steps RunAudit reports for `plan` (for a progress bar's total).
int64_t AuditSteps(const AuditPlan& plan, bool has_backward);

}  // namespace attest
