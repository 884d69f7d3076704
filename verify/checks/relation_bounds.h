// Allowances for the metamorphic relations (verify/checks/metamorphic.h): what two runs of
// one kernel on related problems may legitimately differ by beyond a few ulps of the row,
// per element, from the roundings the kernel declares and the runs' own outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "reference/formats/format.h"
#include "reference/problem/problem.h"
#include "reference/tensor.h"
#include "verify/checks/check.h"

namespace attest {

// The format a relation's ULPs are counted in (see relation_bounds.cc).
Format UlpFormat(const Profile* profile, std::string_view tensor, const Tensor& got);
// The power-of-two pre-scale of that format (Policy::format_scale; 1 when none is declared):
// a declared recipe's E4M3 gradients written at scale 128 have ULPs 128 times finer, and
// saturate at MaxFinite(format) / scale.
double UlpFormatScale(const Profile* profile, std::string_view tensor);

// Per-element allowance (f64; dq's and dk's shapes) for comparing the backward of two runs
// that round dP = dO·Vᵀ at different points (Kernel::BackwardDpFormat differs between the GQA
// problem and its MHA counterpart: a hybrid kernel routes them to different backward kernels,
// e.g. cpu/feather-fp16's fused fp16-dP path serves dense MHA only). Rounding dP_ij to
// `dp_format` moves dS_ij = P_ij (dP_ij - D_i) t'_ij (t' = 1 - tanh^2 under softcap, else 1)
// by at most P_ij t'_ij Quantum(dP_ij)/2 (round to nearest); the two runs then round their
// dS_ij in the kernel's dS format (taken as the problem's dtype, where FlashAttention-2 class
// kernels round P and dS), half a quantum each, the rounded run's at its own, possibly larger
// value (where P (dP - D) cancels, dS is almost all rounding of dP). Summed as a worst case
// over the terms (it also covers both runs' fp32 accumulation, 2^-24 n << 2^-11):
//   dq_id: |scale| sum_j w_ij |k_jd|,   dk_jd: |scale| sum_{h in group} sum_i w_ij |q_id|,
//   w_ij = P_ij t'_ij Quantum(dP_ij, dp_format) / 2 (1 + Quantum(1, dtype))
//          + Quantum(dS_ij, dtype).
// The worst case is reached where one key dominates a row (peaked logits, P ~ 1, D ~ dP):
// cpu/feather-fp16 on an outlier-channels case came to 0.98 of it; the bound is rigorous, not
// a calibrated factor.
// P, dP and D come from the GQA run's own lse and o (a magnitude, not a reference), so no
// oracle is involved.
struct DpRoundingAllowance {
  Tensor dq, dk;
};

DpRoundingAllowance DpRoundingBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                                    const Tensor& lse, Format dp_format);

// See relation_bounds.cc: two runs of the same tokens in another blocking (observed lse and O
// moves, dS roundings to `ds_format`).
DpRoundingAllowance PairRoundingBound(const Problem& p, const CaseInputs& in, const Tensor& o_a,
                                      const Tensor& lse_a, const Tensor& o_b, const Tensor& lse_b,
                                      Format ds_format, Format o_format);

// The allowance when the kernel declares another dP rounding point for `other` than for the
// case's problem (nullopt when both agree, or without a backward); `base` is the case's own
// forward. `note` gets the verdict message's addendum.
std::optional<DpRoundingAllowance> DpAllowance(CheckContext& ctx, const Problem& other,
                                               const ForwardResult& base, bool backward,
                                               std::string* note);

// What a relation allows dq and dk beyond its ulps, per element (f64, on `p` and `in`, the
// relation's layout): PairRoundingBound for runs a and b plus 2 fp32 ulps of the rows' terms,
// plus `dpa` (DpAllowance, already in that layout) where the dP rounding point differs. A
// kernel that returns no lse (JudgesLse) shows no lse move; P's magnitude then comes from
// `oracle_lse()` (lse's layout). Undefined tensors: nothing beyond the ulps (no backward, or
// term magnitudes that cannot be computed).
struct RecomputeAllowance {
  Tensor dq, dk;
  const Tensor* dq_or_null() const { return dq.defined() ? &dq : nullptr; }
  const Tensor* dk_or_null() const { return dk.defined() ? &dk : nullptr; }
};

// a + b elementwise (f64), either possibly undefined.
Tensor SumAllowance(const Tensor& a, const Tensor& b);

RecomputeAllowance RecomputeBound(CheckContext& ctx, const Problem& p, const CaseInputs& in,
                                  const Tensor& o_a, const Tensor& lse_a, const Tensor& o_b,
                                  const Tensor& lse_b, const std::function<Tensor()>& oracle_lse,
                                  const DpRoundingAllowance* dpa);

// Per-element allowance (f64; o's and dv's shapes, on `p` and `in`, the relation's layout) for
// two runs that add the terms of o and dv up in `accumulate` (the recipe's accumulation
// format, fp32) in different orders: another tile count or split point, or another BLAS
// microkernel chosen by the shapes (padding changes Sq and Sk; a GQA call and its MHA
// counterpart reach the library with other strides). Such a reordering moves a sum by a few
// units of its terms' magnitude, not of its result's, so "2 ulps of the row" holds only
// while the output format is much coarser than `accumulate` (bf16, f16); for an fp32 output
// it does not (PyTorch's CPU flash attention in f32: padding dv moved by 20 fp32 ulps of its
// row). With u the unit roundoff of `accumulate`, R(n) = min(n, kRoundingSigmas sqrt(n)) + 1
// (term_scale.h: the worst case for up to 16 terms, beyond it a bound that holds with
// overwhelming probability for independent rounding errors), and e_ij = u (R(D) |scale|
// sum_d |q_id k_jd| + |s_ij| + |s_ij - lse_i| + 2) the relative error of P_ij (the score's
// dot product, its transform, the exponent and exp):
//   o_id:  2 [R(n_i) u (sum_j P_ij |v_jd| + |o_id|) + sum_j P_ij e_ij (|v_jd| + |o_id|)]
//   dv_jd: 2 [R(n_j) u sum_(h,i) P_ij |dO_id| + sum_(h,i) P_ij (e_ij + R(n_i) u) |dO_id|]
// (n_i the keys row i sees, n_j the (head, query) pairs that see key j; the denominator l_i
// is a sum of the same terms; the factor 2: two runs). P from `lse` (the run's own where the
// kernel returns one, else the oracle's) and `o` the run's output. Undefined dv without dout.
struct OrderAllowance {
  Tensor o, dv;
  const Tensor* o_or_null() const { return o.defined() ? &o : nullptr; }
  const Tensor* dv_or_null() const { return dv.defined() ? &dv : nullptr; }
};

OrderAllowance SumOrderBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                             const Tensor& lse, Format accumulate);

}  // namespace attest
