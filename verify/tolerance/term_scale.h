// The magnitude of the terms that make up each gradient row (against false alarms on real
// kernels; docs/design.md "Checks"): a floor of "n ULPs" must scale with what a kernel actually
// adds up, not with the possibly cancelled result. dq_i = scale * sum_j dS_ij k_j with
// dS_ij = P_ij (dP_ij - D_i) [* (1 - tanh^2) under softcap]: when the exact dS vanishes (a
// single visible key: P = 1, dP = D) the reference row is exactly 0, yet a correct kernel that
// forms D = rowsum(dO o) in another order than dP = dO v^T returns rounding noise of the size
// of the dot products' own terms. That size is what this file computes, with
// W_ij = sum_d |dO_id| |v_jd| (the terms of dP_ij) and Dabs_i = sum_j P_ij W_ij (which bounds
// sum_d |dO_id| |o_id|, the terms of D_i), times Dv (Higham's gamma_n for the two fp32 dot
// products of length Dv that cancel):
//   dq_terms[b, h, i]   = Dv |scale| max_d sum_j P_ij (W_ij + Dabs_i) |k_jd|
//   dk_terms[b, hkv, j] = Dv |scale| max_d sum_{h in group} sum_i P_ij (W_ij + Dabs_i) |q_id|
// On the H200 (docs/gpu-results.md), with |dP| and |D| in place of W and Dabs (cancelled
// values), PyTorch's flash/efficient/cudnn backward noise reached 21-42 fp32 ULPs of that
// smaller magnitude.
// (|1 - tanh^2| <= 1, so softcap keeps these upper bounds of |dS| |k| and |dS| |q|).
//
// The rounding floors (no false positives on tiny cases): a FlashAttention-2 style
// kernel rounds P and dS to its input format before their GEMMs, and D = rowsum(dO o) reads
// the rounded O; the "pt" baseline of the bf16 / f16 profiles (SDPA math: fp32 inside, each
// output rounded once) rounds none of them. With few terms the pt error is one unlucky sample
// and k x pt falls far below what those declared rounding points legitimately cost (the
// baseline-ratio bound collapsing, docs/references.md "Their pass rules"). Each rounding point
// adds, to first order, sum_j delta_j t_j to an output element, |delta_j| <= e(x_j) = u |x_j| +
// eta / 2 (u the unit roundoff, eta the smallest subnormal spacing, in the scaled domain of a
// pre-scaled operand), t_j the term's other factor. ComputeRoundingFloors bounds it per
// element by min(sum_j b_j, kRoundingSigmas sqrt(sum_j b_j^2)), b_j = e(x_j) |t_j|: the
// worst case while a row has at most kRoundingSigmas^2 terms, and for longer rows a bound that
// holds with overwhelming probability for independent rounding errors (their standard
// deviation is at most sqrt(sum b_j^2)), so it does not grow like n the way the worst case
// does. Per element:
//   o_id   = sum_j rnd(P_ij) v_jd / l_i           b_j = e_pv(P_ij) |v_jd|
//   dv_jd  = sum_i rnd(P_ij) dO_id                b_i = e_pdo(P_ij) |dO_id|
//   dq_id  = scale sum_j rnd(dS_ij) k_jd          b_j = |scale| (e_dsk(dS_ij) + P_ij t'_ij e_dp(dP_ij)) |k_jd|
//            + |scale| dD_i sum_j P_ij t'_ij |k_jd|  (D's rounding is shared by the row: worst case)
//   dk_jd  = scale sum_{h, i} rnd(dS_ij) q_id     b_i = |scale| (e_dsq(dS_ij) + P_ij t'_ij (e_dp(dP_ij) + dD_i)) |q_id|
// with dS = P (dP - D) t' (t' = 1 - tanh^2 under softcap, else 1) from the oracle's P, dP and
// D, and dD_i = min(sum_d a_d, kRoundingSigmas sqrt(sum_d a_d^2)), a_d = e_out(o_id) |dO_id|,
// the error of D when it reads O rounded to the output format.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "reference/formats/format.h"
#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"
#include "reference/status.h"
#include "reference/tensor.h"
#include "verify/metrics/metrics.h"

namespace attest {

// Per-row term magnitudes, f64, contiguous, in the row order of the gradients' metrics rows
// (verify/metrics/metrics.h: one row per (token, head) vector along d): dq [TotalQ, Hq], dk
// [TotalK, Hkv]. Rows nothing sees (an empty query row; a key no query sees) are exactly 0.
struct GradientTermScales {
  Tensor dq;
  Tensor dk;
  // Filled only with a QuantisedScoreModel (the family rows' format bounds, tolerance.cc):
  // score_error [TotalQ, Hq]: the bound Delta_i of |s'_ij - s_ij| over the row's visible keys
  // (QuantisedScoreModel below); o [TotalQ, Hq]: max_d sum_j P_ij |v_jd|; dv [TotalK, Hkv]:
  // max_d sum_{h in group} sum_i P_ij |dO_id| (undefined without dout).
  Tensor score_error;
  Tensor o;
  Tensor dv;
};

// The score error of a kernel whose Q and K elements are quantised with relative error at
// most `rel` and absolute error at most `abs` times the largest |element| of their row (the
// row along d that a block scale along d covers: underflow below the block's scale):
//   |s'_ij - s_ij| <= |scale| sum_d (|dq_d| |k_d| + |q_d| |dk_d| + |dq_d| |dk_d|)
//                  <= |scale| ((2 rel + rel^2) sum_d |q_id| |k_jd|
//                              + abs (1 + rel) (m_i |k_j|_1 + m_j |q_i|_1) + abs^2 D m_i m_j)
// with m the row maxima. verify/tolerance/tolerance.cc derives rel and abs from the element formats.
struct QuantisedScoreModel {
  double rel = 0;
  double abs = 0;
};

// q, k, v, dout: f64 inputs of the problem's shapes; lse: the oracle's forward lse
// (reference/oracle/oracle.h BackwardOut), lse's shape (-inf lse marks an empty row).
// P = exp(s - lse) with s the oracle's score (mask.h TransformScore, MaskView). Tiled over
// the tiles of reference/problem/tile_walk.h with the oracle's products (oracle_gemm.h: the
// same bits on every machine): memory beyond the inputs is one tile plus one [k_len, D]
// accumulator per kv head. Errors name the tensor whose shape or
// dtype is wrong. threads (0: all cores) runs a query tile's key tiles in parallel; the result
// is bitwise the same for every count.
Expected<GradientTermScales> ComputeGradientTermScales(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& dout, const Tensor& lse,
                                                       int threads = 1);
// The same walk with the family rows' quantities: `model` set fills score_error, o and (with
// dout) dv; dout undefined computes the forward quantities alone (dq, dk undefined).
Expected<GradientTermScales> ComputeGradientTermScales(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& dout, const Tensor& lse,
                                                       const QuantisedScoreModel* model,
                                                       int threads = 1);

// ---- Rounding floors ----

// Sigmas of the high-probability part of the rounding floor (see the top of this file):
// exact worst case for rows of up to 16 terms.
inline constexpr double kRoundingSigmas = 4;

// Values rounded elementwise to `format` after multiplying by `pre_scale` (a power of two).
struct RoundingPoint {
  Format format = Format::kF32;
  double pre_scale = 1;
};

// The elementwise rounding points of a kernel (recipe.h's names); nullopt where the value
// stays in fp32 (or wider) or is block-scaled (a block scheme's error is not relative to the
// element; the profiles of such recipes judge against the recipe reference, which carries
// those roundings itself).
struct RoundingPoints {
  std::optional<RoundingPoint> p_pv;   // P before P.V
  std::optional<RoundingPoint> p_pdo;  // P before P^T.dO
  std::optional<RoundingPoint> ds_dq;  // dS before dS.K
  std::optional<RoundingPoint> ds_dk;  // dS before dS^T.Q
  std::optional<RoundingPoint> dp;     // dP before dP - D
  std::optional<Format> delta_o;       // O's format when D = rowsum(dO o) reads the rounded O
  bool any() const { return p_pv || p_pdo || ds_dq || ds_dk || dp || delta_o; }
};

// The rounding points `recipe` declares for problems of `dtype`; `dp` overrides recipe.dp (a
// kernel's BackwardDpFormat).
RoundingPoints RoundingPointsOf(const Recipe& recipe, DType dtype,
                                std::optional<Format> dp = std::nullopt);

// Per-element floors, f64, contiguous, the shapes of o, dq, dk, dv (the gradients undefined
// when dout is undefined). Exactly 0 where no rounding point acts (masked rows, keys no query
// sees, a recipe that rounds nothing).
struct RoundingFloors {
  Tensor o, dq, dk, dv;
};

// q, k, v, dout (undefined: forward only): f64 inputs of the problem's shapes (the operands
// the kernel multiplies: quantised ones for a recipe gradient); lse, o, delta: the oracle's
// outputs on those inputs (delta and o only read with dout). Tiled like
// ComputeGradientTermScales, the oracle's products for every sum over keys or queries.
// query_rows ([total_q] flags, verify/metrics/sample.h; forward only): floors of o for the flagged rows
// only, gathered into tiles, at a cost that follows their number (0 on the other rows; lse
// may be NaN there, as a sampled oracle leaves it). Errors name the tensor whose shape or
// dtype is wrong, or query_rows of the wrong length. threads (0: all cores) runs a query
// tile's key tiles in parallel; the floors are bitwise the same for every count.
Expected<RoundingFloors> ComputeRoundingFloors(const Problem& p, const RoundingPoints& points,
                                               const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& dout, const Tensor& lse,
                                               const Tensor& o, const Tensor& delta,
                                               const std::vector<uint8_t>* query_rows = nullptr,
                                               int threads = 1);

// ---- Format bounds (the family rows fp8 / mxfp8 / nvfp4; verify/tolerance/tolerance.cc) ----

// The element errors of a family row (fp8, mxfp8, nvfp4; tolerance.cc derives each number
// from the element format and its scale): every operand element x the kernel quantises
// becomes x' with |x' - x| <= rel |x| (+ abs times the largest |element| of its row along d
// for Q and K: underflow below the block scale). The accuracy check turns them into per-element
// bounds with ComputeFormatBounds below.
struct FormatErrors {
  double qk_rel = 0, qk_abs = 0;  // Q and K (the score GEMM's operands)
  double v_rel = 0;               // V (P.V and dO.V^T)
  double do_rel = 0;              // dO (P^T.dO and dO.V^T)
  double p_rel = 0;               // P before P.V and P^T.dO
  double ds_rel = 0;              // dS before dS.K and dS^T.Q
};

// Per-element format bounds of the family rows (FormatErrors above; the derivation is in
// verify/tolerance/tolerance.cc and docs/tolerances.md "The family rows"), from the term magnitudes of
// ComputeGradientTermScales (with a QuantisedScoreModel) on the oracle's P. Delta_i bounds
// the score error over row i's visible keys; softmax is 1-Lipschitz in the max norm, so
// |lse' - lse| <= Delta_i, and each P_ij moves by a factor within e^(+-2 Delta_i). With
// rounding and renormalisation of P the weights' relative error is theta_i = e^(2 Delta_i)
// (1 + p) / (1 - p) - 1, and
//   o:  |o' - o|_id  <= (theta_i (1 + v) + v) max_d sum_j P_ij |v_jd|
//   dS = P (dP - D) t': |dP - D| <= G_ij = (|dO||V|^T)_ij + Dabs_i (above), dP moves
//       by (1 + do)(1 + v) - 1 of G, D by (1 + do)(1 + rho_o)(1 + 2^-8) - 1 (it reads o' as
//       delivered in bf16), t' by a factor e^(2 Delta_i / softcap); dS is then rounded (ds):
//       rho_ds_i = (1 + theta_i)(1 + rho_G) e^(2 Delta_i / softcap) (1 + ds) - 1
//   dq: |dq' - dq|_id <= ((1 + rho_ds_i)(1 + qk) - 1) |scale| max_d sum_j P G |k_jd|
//   dk: the same over the group with the largest rho_ds of the tensor, |q| for |k|
//   dv: |dv' - dv|_jd <= (theta_max (1 + do) + do) max_d sum_i P_ij |dO_id|
// Products of (1 + e) factors, so the bounds hold beyond first order; the underflow (abs)
// part is carried for the scores only.
struct FormatBounds {
  Tensor o, lse, dq, dk, dv;
};

// q, k, v, dout (undefined: forward only; o and lse bounds alone), lse: as for
// ComputeGradientTermScales. Per-element bounds in the shapes of o, lse, dq, dk, dv.
Expected<FormatBounds> ComputeFormatBounds(const Problem& p, const FormatErrors& errors,
                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& dout, const Tensor& lse,
                                           int threads = 1);

// What the profile's policies scale by, into m, the metrics of slot k of (o, lse, dq, dk,
// dv): the term magnitudes of dq and dk (SetRowTermScales), then the format bound and the
// rounding floor of the slot where given and defined (SetRoundingFloor). Any of the three
// may be null. On an error, *what names the input that failed ("gradient term magnitudes",
// "format bounds", "rounding floors").
Status ApplyTermsAndFloors(TensorMetrics& m, size_t k, const GradientTermScales* terms,
                           const FormatBounds* bounds, const RoundingFloors* floors,
                           const char** what);

}  // namespace attest
