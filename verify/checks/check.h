// The check interface (docs/design.md "Checks"; docs/checks.md): a check takes a kernel
// and one case, runs whatever kernel calls it needs (the harness never dies with the kernel:
// kernel errors become failing verdicts), and returns verdicts with margins and worst
// locations. Checks are rows of a registry; suites are lists of (check, case, seed) rows.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/oracle/oracle.h"
#include "reference/case/case_file.h"
#include "reference/case/inputs.h"
#include "verify/metrics/sample.h"
#include "verify/tolerance/tolerance.h"
#include "verify/tolerance/verdict.h"

namespace attest {

// Everything a check may use for one case. The inputs are the case's dtype-rounded f64
// tensors; the oracle outputs are computed lazily once per case and shared between checks.
struct CheckContext {
  Kernel* kernel = nullptr;
  std::string kernel_spec;  // as given on the command line, for repro lines
  Case case_;               // the case (generator + seed or inputs file)
  CaseInputs inputs;
  const Profile* profile = nullptr;
  OracleOptions oracle_options;
  // Set: the float64 oracle runs on the GPU (reference/oracle/cuda/oracle_cuda_host.h; the
  // same semantics and certification bound, docs/checks.md "The oracle on the GPU"), on every
  // row even of a sampled case (checks still judge the sampled rows alone).
  std::optional<CudaOracleOptions> cuda_oracle;
  uint64_t seed = 0;  // for checks that draw their own perturbations
  // Sampled rows (verify/metrics/sample.h; docs/checks.md "Sampled rows"), set by the runner when the
  // case is sampled (ShouldSample): the oracle then computes only the tiles holding a flagged
  // row or key (NaN elsewhere: not computed), checks judge only the flagged rows, say so in
  // their verdicts ("sampled: N of M query rows, K of L keys") and check the rest of the
  // kernel's outputs only for non-finite values; only the forward is judged (the backward's
  // baseline and dk, dv need every row).
  std::optional<RowSample> sample;

  // Lazily computed float64 oracle forward / backward on `inputs`.
  const ForwardOut& OracleForward();
  const BackwardOut& OracleBackward();

  // (check.cc extension) The kernel's answer on `inputs`, computed once per context and
  // shared between checks (checks that need repeated or perturbed calls call the kernel
  // themselves). KernelBackward differentiates the kernel's own forward; call it only when
  // WantsBackward() and KernelForward() holds outputs.
  const KernelAnswer<ForwardResult>& KernelForward();
  const KernelAnswer<BackwardResult>& KernelBackward();
  // The kernel claims a backward, the case has a "do" and is not sampled.
  bool WantsBackward() const;
  // Put into every failing verdict: the command line that reproduces it.
  std::string repro;
  // A short name of the case for messages ("gqa-4-2 causal Sq=77 Sk=130").
  std::string label;
  // Set by a check that returns no verdicts because its rule does not apply to the case: which
  // rule, in a few words ("Hq = Hkv: no GQA group to relate to MHA"); the runner lists the row
  // as skipped with it. Cleared before each check.
  std::string not_applicable;

 private:
  OracleOptions SampledOptions() const;  // oracle_options with the sample's flags
  std::optional<ForwardOut> fwd_;
  std::optional<BackwardOut> bwd_;
  std::optional<KernelAnswer<ForwardResult>> kfwd_;
  std::optional<KernelAnswer<BackwardResult>> kbwd_;
};

// Thrown by CheckContext when the oracle rejects the case (a harness fault, exit code 2),
// so that runners can tell it from an exception thrown by the kernel (a finding); runners
// catch its base, reference/status.h InfrastructureError, which adapters throw too.
struct HarnessError : InfrastructureError {
  using InfrastructureError::InfrastructureError;
};

// ---- Helpers shared by the checks (check.cc) ----

// The verdict class of a kernel call that answered Error (an exception in the kernel or its
// adapter, a crash, a timeout, a protocol violation): not a numerical verdict but the reason
// there is none. It ranks first in the diagnosis order, and runners keep one per case
// (run.h), however many checks of the case called the kernel.
inline constexpr std::string_view kKernelErrorCheck = "kernel-error";
// The verdict class of the coverage guard (run/coverage.h): what a run did not judge. It
// ranks last: every finding about the kernel itself comes first.
inline constexpr std::string_view kCoverageCheck = "coverage";

// A kernel-error verdict (margin inf) for the call `what` ("forward", "non-interference,
// perturbed inputs (...)") that failed with `error`: the message is "<what>: <the error's one
// line>" (ErrorSummary), the whole text is `detail`.
Verdict KernelError(const Kernel& kernel, std::string_view what, std::string_view error);
// The line of an error text that says what went wrong: without the kernel's name, the
// adapter's stderr tail cut off ("; stderr: a | b | c", kernels/exec/process.h StderrTail),
// and, when the adapter did not relay the kernel's own message (a worker that died), the last
// stderr line appended, which for a Python worker is the traceback's exception line.
std::string ErrorSummary(std::string_view kernel_name, std::string_view error);

// A categorical failure (margin inf): an output of the wrong shape, a refusal where the
// kernel claims the feature.
Verdict Failure(std::string_view check, std::string_view tensor, std::string policy,
                std::string message);
// A passing verdict with margin observed / allowed.
Verdict Passing(std::string_view check, std::string_view tensor, std::string policy,
                std::string message = {});

// What a non-output answer means for a check: an Error is a kernel error; Unsupported for a
// problem inside the kernel's capabilities is a failure (it claims the feature); Unsupported
// outside them is an honest refusal, for which the check does not apply (empty list).
// `what` is "forward" or "backward". Returns nullopt when the answer holds outputs.
template <class T>
std::optional<std::vector<Verdict>> NonOutputVerdicts(std::string_view check, const Kernel& kernel,
                                                      const Problem& p,
                                                      const KernelAnswer<T>& answer,
                                                      std::string_view what);

// Whether checks judge the kernel's lse: it declares that its forward returns one
// (kernels/kernel.h Capabilities::lse). When not, every check skips exactly its lse
// judgments, still judges o and the gradients, and never reads ForwardResult::lse.
bool JudgesLse(const Kernel& kernel);

// Whether `t` is a defined float tensor of `shape`; the error names the tensor.
Status CheckOutputTensor(const Tensor& t, std::string_view name, const Shape& shape);

// The location of flat (row-major) element `flat` of problem p's tensor `tensor` of `shape`.
Location LocateElement(const Problem& p, std::string_view tensor, const Shape& shape,
                       int64_t flat);

// Bitwise difference of two tensors of equal shape (any float dtypes, widened exactly; +0
// and -0 differ, NaNs with different payloads differ): how many elements differ, the first.
struct BitwiseDiff {
  int64_t differing = 0;
  int64_t first = -1;  // flat index of the first differing element
  double a = 0, b = 0;  // their values there
};
BitwiseDiff DiffBitwise(const Tensor& a, const Tensor& b);

// "[2, 3, 4]".
std::string ShapeString(const Shape& s);

// Rebuilds failing verdicts' message with the case label and sets their repro line.
void Finish(std::vector<Verdict>& verdicts, const CheckContext& ctx);

struct CheckInfo {
  std::string_view name;         // "accuracy", "non-interference", "consistency", ...
  std::string_view description;  // what passing proves, one sentence
  // Runs the check; an empty result means "not applicable to this case/kernel" (e.g. a
  // backward check on a forward-only kernel), never "passed".
  std::function<std::vector<Verdict>(CheckContext&)> run;
  // Whether the check judges a problem with a learnable sink (Problem::sink) on the sink's
  // math: it reaches the kernel only through CheckContext (the sink entry points) and its
  // rule holds with the sink. The runner skips the others on a sink case, naming the sink.
  bool sink = false;
  // Whether fuzzing draws the check for a kernel with these capabilities (null: always). A
  // check that can only apply to kernels declaring some capability (splits-agree: two split
  // counts) is drawn only for them, so that the draws of every other kernel stay what they were.
  bool (*drawn_for)(const Capabilities&) = nullptr;
  // Whether the check judges a problem with a learnable relative bias (Problem::rel_bias) on
  // the bias's math, as `sink` says for the sink; the runner skips the others naming the field.
  bool rel_bias = false;
};

// The checks fuzzing draws from for a kernel with `caps` (run/fuzz.cc, run/suite.cc
// FuzzTailRows): AllChecks() in order, less those whose drawn_for says no.
std::vector<const CheckInfo*> DrawnChecks(const Capabilities& caps);

// Every registered check, in diagnosis order (below): the order `attest list checks` shows.
std::span<const CheckInfo> AllChecks();
const CheckInfo* FindCheck(std::string_view name);

// The order in which failures are diagnosed, and reports list verdicts (registry.cc says why
// each step sits where it does): from the most specific diagnosis, whose failure explains the
// symptoms every later check would see, to the most general. A step is a check and the
// tensors it covers (empty: all), so that a check may be split around another: accuracy of
// the forward's o and lse comes before consistency (a wrong forward value explains a backward
// that disagrees with it), accuracy of the gradients after (a backward that does not
// differentiate the forward explains inaccurate gradients). The first failing verdict in this
// order names the bug class; mutants declare theirs (kernels/mutants MutantSpec::bug_class).
struct DiagnosisStep {
  std::string_view check;  // a check of AllChecks(), or kKernelErrorCheck / kCoverageCheck
  std::vector<std::string_view> tensors;  // empty: every tensor of the check
};
std::span<const DiagnosisStep> DiagnosisOrder();
// The index of the first step covering (check, tensor); checks not in the table rank last.
size_t DiagnosisRank(std::string_view check, std::string_view tensor);

}  // namespace attest
