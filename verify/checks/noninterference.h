// The non-interference check (docs/design.md "Checks"; docs/references.md "Low-precision attention
// recipes and their failure modes"): outputs of rows that must not see a set of inputs are
// BITWISE unchanged when those inputs are perturbed, including perturbations large enough to
// move shared block scales (format max, 448, sign flips, tiny values). Forward (o, lse) and
// backward in both directions: dq of a query vs keys it cannot see, and dk/dv of a key vs
// queries that cannot see it (their q and dO perturbed). Nondeterministic kernels are judged
// against their own run-to-run spread, element by element.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "reference/case/inputs.h"
#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"
#include "verify/tolerance/verdict.h"

namespace attest {

struct CheckContext;

struct NonInterferenceOptions {
  // Query rows (local to each sequence) to pivot on; empty: chosen per sequence (the middle
  // row and one drawn from `seed`).
  std::vector<int64_t> pivot_rows;
  // Key columns (local) for the backward direction; empty: chosen like pivot_rows.
  std::vector<int64_t> pivot_keys;
  // > 0: perturb only the hidden keys that share the pivot's block of this many positions
  // (the published shared-scale repro perturbs V inside one 32-block).
  int64_t same_block = 0;
  // Which operands the forward-direction perturbation touches (k and v by default).
  bool perturb_k = true;
  bool perturb_v = true;
  bool backward = true;  // also run the backward directions (when the kernel has backward)
  uint64_t seed = 0;
  std::string repro;  // the repro line copied into failing verdicts
  // A sampled case (verify/metrics/sample.h; CheckContext::sample): [total_q] and [total_k] flags.
  // Then, so that the cost stays O(S x D) per perturbation besides the kernel's own runs:
  // only the longest sequence pivots (when pivot_rows is empty: the first row of the 64-row
  // tile holding its middle row, a tile boundary row, and one drawn from its flagged rows),
  // and the protected outputs are those of the flagged rows and keys only.
  const std::vector<uint8_t>* query_rows = nullptr;
  const std::vector<uint8_t>* key_rows = nullptr;
};

// True when some operand of `recipe` uses a block scheme along the sequence axis: one scale is
// then shared across a mask boundary, and a leak is "through shared scales".
bool HasSequenceBlockOperands(const Recipe& recipe);

// Runs the check on `p` with inputs `in` (f64, problem shapes, dtype values). `recipe` names
// the kernel's numerics for the message (nullptr: FindRecipe(capabilities().recipe)). One
// verdict per judged tensor (o, lse, and dq, dk, dv when the kernel has backward), each with
// the worst perturbation; empty when the kernel does not cover `p`, or nothing is hidden
// from anyone (no mask, one sequence).
std::vector<Verdict> CheckNonInterference(Kernel& kernel, const Problem& p, const CaseInputs& in,
                                          const NonInterferenceOptions& options = {},
                                          const Recipe* recipe = nullptr);

// The registry entry: CheckNonInterference on the context's case.
std::vector<Verdict> RunNonInterference(CheckContext& ctx);

}  // namespace attest
