// The accuracy check (docs/design.md "Checks", first bullet; docs/checks.md): o, lse and,
// for kernels with a backward, dq, dk, dv against the float64 oracle, judged by the kernel's
// tolerance profile (baseline ratio with a ULP floor for bf16/f16/f32, verify/tolerance/tolerance.h),
// localised per element; any NaN/Inf where the oracle is finite fails.
#pragma once

#include <string_view>
#include <vector>

#include "verify/checks/check.h"

namespace attest {

// Judges a kernel's outputs on ctx's case against ctx's oracle with ctx.profile (computing
// the same-precision baseline when the profile needs one). `bwd` may be null (forward only).
// Verdicts are named `check`, so that honesty and special-values can reuse the rule.
std::vector<Verdict> JudgeAgainstOracle(CheckContext& ctx, std::string_view check,
                                        const ForwardResult& fwd, const BackwardResult* bwd);

// A learnable sink's gradient (Problem::sink; accuracy_sink.cc): the kernel's dsink [Hq]
// against the oracle's `ref`, by the profile's baseline-ratio policies of dv applied per
// element (fp32 ULPs) with `base` the baseline's dsink, the ratio term raised to the
// first-order error of D = rowsum(dO o) from the rounded o (DsinkRoundingFloor). A profile
// without a baseline-ratio dv policy fails naming itself (no rule to derive dsink's from).
std::vector<Verdict> JudgeDsink(CheckContext& ctx, std::string_view check,
                                const ForwardResult& fwd, const BackwardResult& bwd,
                                const Tensor& ref, const Tensor& base);
// The profile's baseline-ratio policies of dv as dsink's: per element, in fp32 ULPs, with the
// rounding floor (empty when the profile has none).
std::vector<Policy> DsinkPolicies(const Profile& profile);
// Per head h, with w_i = exp(sink_h - lse_i) (the oracle's lse), a_i = sum_e |dO_ie o_ie| and
// u = 2^-24: S(b) = min(sum b, 4 sqrt(sum b^2)) (verify/tolerance/term_scale.h's bound of a
// sum of independent roundings) of b_i = w_i S(|dO_ie| Quantum(o_ie, o_format) / 2 over e)
// (D from the rounded o), plus sum_i w_i 4 Quantum(lse_i, fp32) a_i (the weight moved by a
// kernel's lse within 4 fp32 ULPs), plus (Dv + rows) u sum_i w_i a_i (Higham's gamma_n of the
// fp32 sums D_i and dsink_h); 0 for a sink of -inf. Forward rows of
// the oracle `o` (f64), `lse`, `dout`, `sink` as the case holds them.
Tensor DsinkRoundingFloor(const Problem& p, const Tensor& o, const Tensor& lse,
                          const Tensor& dout, const Tensor& sink, Format o_format);

// A learnable relative bias's gradient (Problem::rel_bias; accuracy_relbias.cc): the kernel's
// drel_bias [Hq, W] against the oracle's `ref` by dsink's rule (DsinkPolicies: dv's
// baseline-ratio policies per element in fp32 ULPs, `base` the baseline's drel_bias), the
// ratio term raised to DrelBiasRoundingFloor.
std::vector<Verdict> JudgeDrelBias(CheckContext& ctx, std::string_view check,
                                   const ForwardResult& fwd, const BackwardResult& bwd,
                                   const Tensor& ref, const Tensor& base);
// Per element (h, d), over the visible pairs (i, j) of diagonal d (every sequence), with P_ij
// from the oracle's lse and the case's inputs, dP_ij = dO_i . v_j, D_i = dO_i . o_i (the oracle's
// o) and u = 2^-24: S(P_ij c_i) (S as in DsinkRoundingFloor, c_i = S(|dO_ie| Quantum(o_ie,
// o_format) / 2 over e): D from the rounded o) + sum P_ij 4 Quantum(lse_i, fp32) |dP_ij - D_i|
// (a kernel's lse within 4 fp32 ULPs) + (2 Dv + pairs) u sum P_ij (sum_e |dO_ie v_je| +
// sum_e |dO_ie o_ie|) (gamma_n of the fp32 sums dP, D and the diagonal's). docs/tolerances.md.
Tensor DrelBiasRoundingFloor(const Problem& p, const CaseInputs& in, const Tensor& o,
                             const Tensor& lse, Format o_format);

// The "accuracy" check: the kernel's forward (and backward when it claims one and the case
// has a "do") on the case, judged by JudgeAgainstOracle. Not applicable when the kernel
// honestly refuses a case outside its capabilities.
std::vector<Verdict> RunAccuracy(CheckContext& ctx);

}  // namespace attest
