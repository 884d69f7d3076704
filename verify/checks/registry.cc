// The table of checks (check.h AllChecks/FindCheck), in reporting order: accuracy first,
// then the behavioural checks, the metamorphic relations, and the leak / consistency
// families. Adding a check is adding a row.
#include "verify/checks/accuracy.h"
#include "verify/checks/basic.h"
#include "verify/checks/check.h"
#include "verify/checks/metamorphic.h"
#include "verify/checks/consistency.h"
#include "verify/checks/noninterference.h"

namespace attest {
namespace {

std::vector<CheckInfo> BuildChecks() {
  std::vector<CheckInfo> t = {
      {"accuracy",
       "o, lse (and dq, dk, dv) within the kernel's tolerance profile of the float64 oracle, "
       "element by element; no NaN/Inf where the oracle is finite",
       RunAccuracy},
      {"unwritten-outputs",
       "every output has the problem's shape and a float dtype and holds no NaN where the "
       "oracle is finite",
       RunUnwrittenOutputs},
      {"special-values",
       "no overflow/NaN on huge logits and format-edge inputs; empty rows give o = 0, lse = "
       "-inf, dq = 0; unseen keys give dk = dv = 0",
       RunSpecialValues},
      {"determinism",
       "repeat runs are bitwise equal where the kernel claims determinism", RunDeterminism},
      {"honesty",
       "a case inside the capabilities is answered and right; one outside is refused or right",
       RunHonesty},
      {"gqa-mha", "GQA equals MHA with k/v repeated per group (dk, dv: group sums)",
       RunGqaEquivalence},
      {"permutation",
       "permuting batch entries and heads permutes the outputs (bitwise when deterministic)",
       RunPermutation},
      {"window-causal", "window (Sk, 0) without causal equals causal", RunWindowCausal},
      {"non-interference",
       "outputs of rows that must not see a set of inputs (future keys, keys outside the "
       "window, other documents or sequences; queries for dk/dv) are bitwise unchanged when "
       "those inputs are perturbed, also by values that move shared block scales",
       RunNonInterference},
      {"consistency",
       "the backward differentiates the forward that ran: delta, sum-of-gradient identities, "
       "the constant-V probe, and the gradient at the recipe's quantised operands",
       RunConsistency},
  };
  return t;
}

}  // namespace

std::span<const CheckInfo> AllChecks() {
  static const std::vector<CheckInfo> kTable = BuildChecks();
  return kTable;
}

const CheckInfo* FindCheck(std::string_view name) {
  for (const CheckInfo& c : AllChecks()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace attest
