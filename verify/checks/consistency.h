// The forward/backward consistency check (docs/design.md "Checks"; docs/checks.md):
// identities that hold only when the backward differentiates the forward that ran. Each is
// measured against a worst-case rounding bound built from the recipe's rounding points, so a
// correct kernel sits far below margin 1 and a kernel whose backward differentiates something
// else (a D from another O, a mask ignored, a missing softcap derivative, operands requantised
// differently) far above.
//
// Identities (derivations in consistency_identities.cc):
//   delta        rowsum(dO∘O) of the kernel's own O equals rowsum(P∘dP) with P recomputed
//                from the kernel's own lse (forward O and lse describe one softmax).
//   dk-sum       Σ_j dK_j = scale Σ_i q_i Σ_j c_ij dS_ij per (b, kv head): 0 for the exact
//                gradient without softcap (c ≡ 1); the prediction keeps FlashAttention's
//                D-from-rounded-O term, and with softcap the weighted form (c = tanh').
//   dv-sum       Σ_j dV_j = Σ_i (Σ_j P_ij) dO_i per (b, kv head) (GQA sums the group).
//   probe dq/dk  constant-V probe: with v_j = c for every key of a sequence, o ≡ c, so the
//                exact dq and dk vanish; the kernel's residue is predicted from its own O and
//                lse (dS_ij = -P_ij dO_i·(O_i - c)) and every element is bounded. A D that is
//                not rowsum(dO∘O) of the returned O shows here hundreds of times its bound.
//   recipe-gradient dq/dk/dv  the kernel's gradients against the float64 oracle's backward
//                at the operands as the recipe quantised them (QuantizeForRecipe on q, k, v),
//                judged with the kernel's tolerance profile, whose baseline (the bf16 "pt",
//                or the recipe reference of verify/tolerance/baseline.h) is measured against the same
//                quantised oracle.
// A kernel that returns no lse (Capabilities::lse = false) gets no delta verdict; dk-sum,
// dv-sum and the probe then weight P with the float64 oracle's lse at the recipe's Q·Kᵀ
// operands instead of the kernel's.
// Every identity and the probe are evaluated on the recipe's quantised GEMM operands (scores
// from Q·Kᵀ's operands, dP from dO·Vᵀ's, dK from dSᵀ·Q's Q, ...), since those are the
// products the kernel forms. Softcap probe: with softcap on, the identities and the recipe
// gradient run a second time with q scaled by the power of two that puts the RMS score at the
// cap, where tanh' is far from 1 (at cap 30 with unit data it is 1 - O(1e-3), below bf16's
// rounding of dS, and a backward without it hides in the bound).
#pragma once

#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "reference/case/inputs.h"
#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"
#include "verify/tolerance/tolerance.h"
#include "verify/tolerance/verdict.h"

namespace attest {

struct CheckContext;

struct ConsistencyOptions {
  bool identities = true;       // delta, dk-sum, dv-sum on the case's inputs
  bool probe = true;            // the constant-V probe
  bool recipe_gradient = true;  // oracle backward at the quantised operands, kernel profile
  std::string repro;            // copied into failing verdicts
};

// Runs the check. `recipe` (nullptr: FindRecipe(capabilities().recipe), else the element
// recipe of the problem's dtype) gives the rounding points of the bounds; `profile`
// (nullptr: ProfileFor(capabilities())) judges the recipe-gradient comparison. Empty when
// the kernel has no backward or does not cover `p`.
std::vector<Verdict> CheckConsistency(Kernel& kernel, const Problem& p, const CaseInputs& in,
                                      const ConsistencyOptions& options = {},
                                      const Recipe* recipe = nullptr,
                                      const Profile* profile = nullptr);

// The registry entry: CheckConsistency on the context's case with its profile.
std::vector<Verdict> RunConsistency(CheckContext& ctx);

}  // namespace attest
