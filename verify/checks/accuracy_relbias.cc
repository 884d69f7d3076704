// The accuracy check's judgment of a learnable relative bias's gradient (see accuracy.h
// JudgeDrelBias; docs/semantics.md "Learnable relative bias"; docs/tolerances.md "The learnable
// relative bias").
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "reference/problem/mask.h"
#include "verify/checks/accuracy.h"
#include "verify/metrics/metrics.h"

namespace attest {
namespace {

// Per element of drel_bias: the sums its rounding floor is made of.
struct FloorSums {
  double b_sum = 0, b_sq = 0;  // P_ij times the error of D_i from the rounded o
  double lse_moved = 0;        // P_ij 4 Quantum(lse_i) |dP_ij - D_i|
  double terms = 0;            // P_ij (sum_e |dO_ie v_je| + sum_e |dO_ie o_ie|)
  int64_t pairs = 0;
};

// Row t of head h (token-major [tokens, heads, dim]).
const double* Row(const double* x, int64_t t, int64_t heads, int64_t h, int64_t dim) {
  return x + (t * heads + h) * dim;
}

}  // namespace

Tensor DrelBiasRoundingFloor(const Problem& p, const CaseInputs& in, const Tensor& o,
                             const Tensor& lse, Format o_format) {
  const int64_t H = p.heads_q, Hk = p.heads_kv, D = p.head_dim, Dv = p.head_dim_v;
  const int64_t T = p.TotalQ(), W = p.RelBiasWidth();
  const Tensor qw = ToF64(in.q), kw = ToF64(in.k), vw = ToF64(in.v), gw = ToF64(in.dout);
  const Tensor rw = ToF64(in.rel_bias), ow = ToF64(o), lw = ToF64(lse);
  const double *qd = qw.data<double>(), *kd = kw.data<double>(), *vd = vw.data<double>();
  const double *gd = gw.data<double>(), *rd = rw.data<double>(), *od = ow.data<double>();
  const double* ld = lw.data<double>();
  const double u = std::ldexp(1.0, -24);
  const double scale = p.EffectiveScale();
  std::vector<FloorSums> sums(static_cast<size_t>(H * W));
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence& s = mask.sequence();
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t t = s.q_begin + i;
        const int64_t li = p.varlen() ? h * T + t : (b * H + h) * p.seqlen_q + i;
        const double lse_i = ld[li];
        if (!std::isfinite(lse_i)) continue;  // an empty row adds nothing
        const double *gr = Row(gd, t, H, h, Dv), *orow = Row(od, t, H, h, Dv);
        // D_i, its terms and the first-order error of D_i from the kernel's rounded o, as
        // term_scale.h bounds a sum of independent roundings: min(sum a, 4 sqrt(sum a^2)).
        double delta = 0, a_abs = 0, e_sum = 0, e_sq = 0;
        for (int64_t e = 0; e < Dv; ++e) {
          delta += gr[e] * orow[e];
          a_abs += std::fabs(gr[e] * orow[e]);
          const double a_e = std::fabs(gr[e]) * Quantum(orow[e], o_format) / 2;
          e_sum += a_e;
          e_sq += a_e * a_e;
        }
        const double d_err = std::min(e_sum, 4 * std::sqrt(e_sq));
        const double dw = 4 * Quantum(lse_i, Format::kF32);
        const double* qr = Row(qd, t, H, h, D);
        for (int64_t j = 0; j < s.k_len; ++j) {
          if (!mask.Visible(i, j)) continue;
          const int64_t tk = s.k_begin + j;
          const double *kr = Row(kd, tk, Hk, hk, D), *vr = Row(vd, tk, Hk, hk, Dv);
          double dot = 0, dp = 0, dp_abs = 0;
          for (int64_t x = 0; x < D; ++x) dot += qr[x] * kr[x];
          for (int64_t e = 0; e < Dv; ++e) {
            dp += gr[e] * vr[e];
            dp_abs += std::fabs(gr[e] * vr[e]);
          }
          const int64_t d = p.seqlen_k - 1 + i - j;
          const double score = TransformScore(scale * dot, p.softcap, slope,
                                              mask.AlibiDistance(i, j)) +
                               rd[h * W + d];
          const double pij = std::exp(score - lse_i);
          FloorSums& f = sums[static_cast<size_t>(h * W + d)];
          f.b_sum += pij * d_err;
          f.b_sq += (pij * d_err) * (pij * d_err);
          f.lse_moved += pij * dw * std::fabs(dp - delta);
          f.terms += pij * (dp_abs + a_abs);
          ++f.pairs;
        }
      }
    }
  }
  std::vector<double> floor(sums.size(), 0.0);
  for (size_t x = 0; x < sums.size(); ++x) {
    const FloorSums& f = sums[x];
    // + Higham's gamma_n of the fp32 sums: dP_ij and D_i (Dv terms each) and the diagonal's.
    floor[x] = std::min(f.b_sum, 4 * std::sqrt(f.b_sq)) + f.lse_moved +
               static_cast<double>(2 * Dv + f.pairs) * u * f.terms;
  }
  return Tensor::FromF64(p.RelBiasShape(), std::move(floor));
}

std::vector<Verdict> JudgeDrelBias(CheckContext& ctx, std::string_view check,
                                   const ForwardResult& fwd, const BackwardResult& bwd,
                                   const Tensor& ref, const Tensor& base) {
  const Problem& p = ctx.case_.problem;
  std::vector<Verdict> out;
  if (Status st = CheckOutputTensor(bwd.drel_bias, "drel_bias", p.RelBiasShape()); !st.ok()) {
    out.push_back(Failure(check, "drel_bias", "output of the problem's shape",
                          "cannot compare: " + st.error().message));
    return out;
  }
  const std::vector<Policy> policies = DsinkPolicies(*ctx.profile);
  if (policies.empty() || !base.defined()) {
    out.push_back(Failure(check, "drel_bias", "a baseline-ratio rule for drel_bias",
                          fmt::format("profile {}: no baseline-ratio policy for dv (and baseline "
                                      "drel_bias) to derive drel_bias's tolerance from",
                                      ctx.profile->name)));
    return out;
  }
  const Layout layout = Layout::Flat(2);
  const CompareOptions copts{.threads = ctx.oracle_options.threads};
  auto m = Compare("drel_bias", bwd.drel_bias, ref, Format::kF32, layout, copts);
  auto bm = Compare("drel_bias", base, ref, Format::kF32, layout, copts);
  if (!m.ok() || !bm.ok()) {
    out.push_back(Failure(check, "drel_bias", "comparable outputs",
                          (!m.ok() ? m.error() : bm.error()).message));
    return out;
  }
  const BackwardOut& oracle = ctx.OracleBackward();
  const Format o_format = FormatOf(fwd.o.dtype()).value_or(Format::kF32);
  const Tensor floor = DrelBiasRoundingFloor(p, ctx.inputs, oracle.o, oracle.lse, o_format);
  if (Status st = SetRoundingFloor(*m, floor); !st.ok()) {
    out.push_back(Failure(check, "drel_bias", "rounding floors", st.error().message));
    return out;
  }
  for (const Policy& policy : policies) out.push_back(Evaluate(policy, *m, &*bm, check));
  return out;
}

}  // namespace attest
