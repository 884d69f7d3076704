// Internals of the forward/backward consistency check (verify/checks/consistency.h), shared
// by its three files: consistency.cc (the rounding model and CheckConsistency),
// consistency_identities.cc (delta, dk-sum, dv-sum and the constant-V probe) and
// consistency_recipe_gradient.cc (the oracle backward at the recipe's quantised operands).
#pragma once

#include <array>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kernels/kernel.h"
#include "reference/formats/format.h"
#include "reference/case/inputs.h"
#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"
#include "verify/tolerance/tolerance.h"
#include "verify/tolerance/verdict.h"

namespace attest::consistency_detail {

inline constexpr std::string_view kCheck = "consistency";

// Index arithmetic over token-major layouts ([B,S,H,X] and packed [T,H,X] alike).
struct Geometry {
  const Problem& p;
  int64_t Q(int64_t t, int64_t h, int64_t d) const { return (t * p.heads_q + h) * p.head_dim + d; }
  int64_t K(int64_t t, int64_t h, int64_t d) const { return (t * p.heads_kv + h) * p.head_dim + d; }
  int64_t V(int64_t t, int64_t h, int64_t d) const {
    return (t * p.heads_kv + h) * p.head_dim_v + d;
  }
  int64_t O(int64_t t, int64_t h, int64_t d) const {
    return (t * p.heads_q + h) * p.head_dim_v + d;
  }
  int64_t Lse(const Sequence& s, int64_t h, int64_t i) const {
    if (p.varlen()) return h * p.TotalQ() + s.q_begin + i;
    return ((s.q_begin / p.seqlen_q) * p.heads_q + h) * p.seqlen_q + i;
  }
};

struct KernelRun {
  Tensor o_raw, lse_raw;  // as returned (for Backward)
  Tensor o, lse;          // f64
  Tensor dq, dk, dv;      // f64
  Tensor sink;            // the sink it ran with (Problem::sink; undefined without one)
};

// Forward + backward; an Error string, "" with unsupported = true, or the run. A problem with
// a learnable sink goes through the sink entry points with `sink` (CaseInputs::sink).
std::variant<KernelRun, Unsupported, Error> RunKernel(Kernel& kernel, const Problem& p,
                                                      const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& dout,
                                                      const Tensor& sink);

struct RoundingModel {
  double u_o = 0, u_g = 0;      // output o / gradients
  double u_pv = 0, u_pdo = 0;   // P before P·V, before Pᵀ·dO
  double u_ds = 0;              // dS before dS·K / dSᵀ·Q (the larger of the two)
  double tiny_ds = 0, tiny_pdo = 0;  // their absolute (subnormal) error, OperandTiny
  // Block-scaled dS (dsk along keys for dQ, dsq along queries for dK): absolute error per
  // unit of the block's amax (BlockTinyPerAmax).
  double blk_ds_dq = 0, blk_ds_dk = 0;
  // dP = dO·Vᵀ rounded before dP − D (recipe `dp` or the kernel's BackwardDpFormat; 0: fp32),
  // and half the format's smallest positive value (a subnormal dP errs absolutely).
  double u_dp = 0, tiny_dp = 0;
  double tiny_o = 0, tiny_g = 0;
  // Where dq, dk, dv saturate (recipe.h gradient_scales: MaxFinite(gradients) / scale; +inf
  // for unscaled roundings): the probe compares a saturated gradient with its prediction
  // clamped there, and a sum identity skips a column holding one (the sum of saturated values
  // is not the saturated sum).
  std::array<double, 3> sat_g{std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::infinity()};
  bool delta_rounded = true;
};

// Every GEMM operand as the recipe represents it (QuantizeForRecipe on the whole tensor, what
// the engine feeds its GEMMs): the identities and the probe are statements about the products
// the kernel forms, so they are evaluated on these, not on the unquantised inputs (a kernel
// whose Q·Kᵀ reads MXFP8 Q and K has weights exp(s_q - lse), not exp(s - lse)).
struct Operands {
  Tensor qs, ks;  // Q·Kᵀ
  Tensor vo;      // P·V's V (the forward's O = Σ P vo)
  Tensor dop, vp; // dO·Vᵀ
  Tensor dov;     // Pᵀ·dO's dO
  Tensor kq, qk;  // dS·K's K, dSᵀ·Q's Q
  Tensor dout;    // the dO D = rowsum(dO∘O) reads: as stored, or dop (DeltaDo::kDovOperand)
};

Expected<Operands> OperandsOf(const Recipe& r, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& dout);

// delta, dk-sum, dv-sum on the kernel's run (consistency_identities.cc).
void Identities(const Problem& p, const Operands& x, const KernelRun& run, const RoundingModel& rd,
                const std::string& repro, const std::string& label, std::vector<Verdict>& out);

// The constant-V probe: the kernel rerun with v constant per sequence
// (consistency_identities.cc).
void Probe(Kernel& kernel, const Problem& p, const CaseInputs& in, const Recipe& recipe,
           const RoundingModel& rd, const std::string& repro, std::vector<Verdict>& out);

// The kernel's gradients against the float64 oracle's backward at the recipe's quantised
// operands, judged by `profile` (consistency_recipe_gradient.cc).
void RecipeGradient(const Problem& p, const CaseInputs& in, const KernelRun& run,
                    const Recipe& recipe, const Profile& profile, std::optional<Format> dp,
                    const std::string& repro, std::vector<Verdict>& out);

}  // namespace attest::consistency_detail
