// The table of checks (check.h AllChecks/FindCheck) and the diagnosis order (check.h
// DiagnosisOrder: the first failing check names the bug class). Adding a
// check is adding a row here and a step in the diagnosis order.
#include <algorithm>

#include "verify/checks/accuracy.h"
#include "verify/checks/basic.h"
#include "verify/checks/bias.h"
#include "verify/checks/check.h"
#include "verify/checks/consistency.h"
#include "verify/checks/layouts.h"
#include "verify/checks/metamorphic.h"
#include "verify/checks/noninterference.h"
#include "verify/checks/splits.h"

namespace attest {
namespace {

// Rows in the order of their first diagnosis step. The diagnosis order (BuildDiagnosisOrder)
// and why each step sits where it does: a check placed earlier must not fire on a bug that a
// later one names, and its failure must explain what the later ones would see.
//  0. kernel-error (check.h kKernelErrorCheck, issued by every check whose kernel call
//     answered Error, kept once per case by run/run.h): no output came back, so nothing
//     after it could be judged on that call. A TypeError in an adapter is this, not an
//     unwritten output.
//  1. unwritten-outputs: an element still holding the harness's poison was never written;
//     every other check sees NaN there.
//  2. gqa-mha, window-causal, splits-agree: two spellings of the same problem (head mapping;
//     causal alignment and window bounds; the split-KV count) disagree, with the same tiles on
//     both sides (splits-agree: the same key tiles, cut into other splits). The relation
//     names the parameter the kernel misreads; every later rule presupposes it is read
//     right (a causal mask aligned top-left makes rows that must be empty non-empty, which
//     special-values would report, and lets rows see hidden keys, which non-interference
//     would). Identical NaNs on both sides agree: a NaN is not a relation failure.
//  3. special-values of o and lse: the exact rules of empty rows (o = 0, lse = -inf or the
//     declared +inf) and finiteness on huge-logit, format-edge and zero-block inputs; a NaN
//     born in an empty row or a zero scale spreads into everything after it.
//  4. determinism: later checks compare runs bitwise and would misread run-to-run variation
//     as a leak or a broken relation.
//  5. non-interference: a hidden input moves a protected output (forward or backward): it
//     says who leaks into whom. A backward that computes masked entries is a leak here
//     before its overflowing gradients are a special-values failure (step 7).
//  6. accuracy of o and lse: the forward's values are wrong. Every backward step comes after
//     it: the backward consumes o and lse, so a wrong forward value (an lse scaled twice)
//     shows in the gradients too, as overflow or as an identity that fails.
//  7. special-values of dq, dk, dv: non-finite gradients and the exact empty-row / unseen-key
//     rules of the backward.
//  8. consistency: the forward is right but the backward does not differentiate it.
//  9. accuracy of dq, dk, dv: gradients wrong in a way the identities do not isolate.
//  9b. bias: every error within its bound, but their mean is not the recipe's (a directed
//     rounding). After accuracy, because any value wrong beyond its bound is biased too (a
//     scale ignored, a column swapped) and accuracy names that more precisely; before the
//     re-layouts, which a directed rounding leaves bitwise intact.
// 10. permutation, padding: re-layouts of the batch (permuted or padded packed sequences,
//     padded sequences). They compare the kernel with itself, bitwise where it claims
//     determinism, so they are the most sensitive checks and the least specific: any defect
//     that depends on token offsets (a split point, a scale block along the packed token
//     axis, a wrong value that changes with the tiling) shows there too. They name the bug
//     only when everything above passed: a layout defect below every tolerance (a head
//     mixed into its neighbour at 1e-4).
// 10b. layouts: the same call through strided views of the inputs (verify/checks/layouts.h),
//     bitwise against the contiguous call like the re-layouts above and as unspecific: a
//     kernel that ignores strides reads wrong values, which no check before it sees, since
//     they all hand the kernel fresh contiguous tensors.
// 11. honesty: refusing a claimed feature, or answering an unclaimed one wrongly (inside the
//     capabilities, a wrong answer is already an accuracy failure).
// 12. coverage (check.h kCoverageCheck, run/coverage.h): the run left a required family
//     unjudged or skipped too many rows. It says nothing about the kernel's numbers, so
//     every finding above names the bug first.
std::vector<CheckInfo> BuildChecks() {
  std::vector<CheckInfo> t = {
      {"unwritten-outputs",
       "every output has the problem's shape and a float dtype, and no element still holds "
       "the harness's poison (all-ones bytes: a NaN that arithmetic does not produce)",
       RunUnwrittenOutputs, /*sink=*/true, /*drawn_for=*/nullptr, /*rel_bias=*/true},
      {"gqa-mha", "GQA equals MHA with k/v repeated per group (dk, dv: group sums)",
       RunGqaEquivalence},
      {"window-causal",
       "window (Sk, 0) without causal equals bottom-right causal ((Sq, 0): top-left), and a "
       "window reaching past every key on both sides equals no window",
       RunWindowCausal},
      {"splits-agree",
       "the forward at every split count the kernel declares (num_splits) agrees with the "
       "first count's within the fp32 combine's rounding and P's rounding at each split's own "
       "max (forward only: the backward does not split)",
       RunSplitsAgree, /*sink=*/true,
       [](const Capabilities& c) { return c.num_splits.size() >= 2; }},
      {"special-values",
       "empty rows give o = 0, lse = -inf (or the declared +inf), dq = 0; keys no query sees "
       "give dk = dv = 0; outputs are finite wherever the oracle's are (huge logits, "
       "format-edge values, blocks of zeros); paged and seqused problems: queries past "
       "seqused_q are empty rows and pool slots no sequence reads get dk = dv = 0",
       RunSpecialValues, /*sink=*/true, /*drawn_for=*/nullptr, /*rel_bias=*/true},
      {"determinism",
       "repeat runs are bitwise equal where the kernel claims determinism", RunDeterminism},
      {"non-interference",
       "outputs of rows that must not see a set of inputs (future keys, keys outside the "
       "window, other documents or sequences; queries for dk/dv) are bitwise unchanged when "
       "those inputs are perturbed, also by values that move shared block scales; "
       "nondeterministic kernels within their own run-to-run spread",
       RunNonInterference, /*sink=*/true, /*drawn_for=*/nullptr, /*rel_bias=*/true},
      {"accuracy",
       "o, lse (and dq, dk, dv) within the kernel's tolerance profile of the float64 oracle, "
       "element by element; no NaN/Inf where the oracle is finite",
       RunAccuracy, /*sink=*/true, /*drawn_for=*/nullptr, /*rel_bias=*/true},
      {"consistency",
       "the backward differentiates the forward that ran: delta, sum-of-gradient identities, "
       "the constant-V probe, and the gradient at the recipe's quantised operands",
       RunConsistency, /*sink=*/true},
      {"bias",
       "the mean signed error of o, lse, dq, dk and dv (in ulps of the output format, signed and "
       "toward zero) is the mean the kernel's recipe implies within 0.2 ulp (fp32 outputs: 1 "
       "ulp; a t-test on row means, false alarm <= 1e-6 per verdict); below the minimum "
       "sample it abstains",
       RunBias},
      {"permutation",
       "permuting batch entries (padded or packed) and heads permutes the outputs (within 2 "
       "ulps of the row: group sums and split points may change order)",
       RunPermutation},
      {"padding",
       "padding tokens (a padding sequence before and after a packed batch; padding keys and "
       "queries of a padded batch, masked by document ids) leave the real tokens' outputs "
       "unchanged",
       RunPadding},
      {"layouts",
       "q, k, v and dO passed as the views models make (slices of a fused qkv projection, a "
       "transpose of heads-major storage, a head slice with a gap, a non-unit last stride "
       "where the interface takes it) give the contiguous call's outputs bitwise "
       "(nondeterministic kernels: within their run-to-run spread); a paged or seqused "
       "problem's outputs equal bitwise those of its logical problem with contiguous k and v "
       "(kernels that claim determinism; run/logical_view.h)",
       RunLayouts},
      {"honesty",
       "a claimed feature is never refused; a case outside the capabilities is refused or "
       "answered right",
       RunHonesty, /*sink=*/true, /*drawn_for=*/nullptr, /*rel_bias=*/true},
  };
  return t;
}

std::vector<DiagnosisStep> BuildDiagnosisOrder() {
  return {
      {kKernelErrorCheck, {}},
      {"unwritten-outputs", {}},
      {"gqa-mha", {}},
      {"window-causal", {}},
      {"splits-agree", {}},
      {"special-values", {"o", "lse"}},
      {"determinism", {}},
      {"non-interference", {}},
      {"accuracy", {"o", "lse"}},
      {"special-values", {}},
      {"consistency", {}},
      {"accuracy", {}},
      {"bias", {}},
      {"permutation", {}},
      {"padding", {}},
      {"layouts", {}},
      {"honesty", {}},
      {kCoverageCheck, {}},
  };
}

}  // namespace

std::span<const CheckInfo> AllChecks() {
  static const std::vector<CheckInfo> kTable = BuildChecks();
  return kTable;
}

std::vector<const CheckInfo*> DrawnChecks(const Capabilities& caps) {
  std::vector<const CheckInfo*> out;
  for (const CheckInfo& c : AllChecks()) {
    if (c.drawn_for == nullptr || c.drawn_for(caps)) out.push_back(&c);
  }
  return out;
}

const CheckInfo* FindCheck(std::string_view name) {
  for (const CheckInfo& c : AllChecks()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::span<const DiagnosisStep> DiagnosisOrder() {
  static const std::vector<DiagnosisStep> kOrder = BuildDiagnosisOrder();
  return kOrder;
}

size_t DiagnosisRank(std::string_view check, std::string_view tensor) {
  const auto order = DiagnosisOrder();
  for (size_t i = 0; i < order.size(); ++i) {
    const DiagnosisStep& s = order[i];
    if (s.check != check) continue;
    if (s.tensors.empty() ||
        std::find(s.tensors.begin(), s.tensors.end(), tensor) != s.tensors.end()) {
      return i;
    }
  }
  return order.size();
}

}  // namespace attest
