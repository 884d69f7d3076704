// The accuracy check's judgment of a learnable sink's gradient (see accuracy.h JudgeDsink;
// docs/semantics.md "Learnable sink"; docs/tolerances.md "The learnable sink").
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "verify/checks/accuracy.h"
#include "verify/metrics/metrics.h"

namespace attest {

Tensor DsinkRoundingFloor(const Problem& p, const Tensor& o, const Tensor& lse,
                          const Tensor& dout, const Tensor& sink, Format o_format) {
  const int64_t H = p.heads_q, Dv = p.head_dim_v, T = p.TotalQ();
  const Tensor ow = ToF64(o), lw = ToF64(lse), gw = ToF64(dout), sw = ToF64(sink);
  const double* od = ow.data<double>();
  const double* ld = lw.data<double>();
  const double* gd = gw.data<double>();
  const double* sd = sw.data<double>();
  const double u = std::ldexp(1.0, -24);
  std::vector<double> floor(static_cast<size_t>(H), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    const double s = sd[h];
    if (s == -std::numeric_limits<double>::infinity()) continue;
    // The rounding of o, as term_scale.h bounds a sum of independent roundings:
    // min(sum b, 4 sqrt(sum b^2)), once over a row's D and once over dsink's rows.
    double rows_sum = 0, rows_sq = 0, weights = 0, terms = 0;
    for (int64_t t = 0; t < T; ++t) {
      // lse [B, H, Sq] padded (token t = b Sq + i), [H, total_q] packed.
      const int64_t li = p.varlen() ? h * T + t
                                    : ((t / p.seqlen_q) * H + h) * p.seqlen_q + t % p.seqlen_q;
      const double w = std::exp(s - ld[li]);
      // A kernel's lse within 4 fp32 ULPs moves w by that relative amount.
      const double dw = 4 * Quantum(ld[li], Format::kF32);
      double a_sum = 0, a_sq = 0, row_terms = 0;
      for (int64_t e = 0; e < Dv; ++e) {
        const double oe = od[(t * H + h) * Dv + e], ge = std::fabs(gd[(t * H + h) * Dv + e]);
        const double a_e = ge * Quantum(oe, o_format) / 2;
        a_sum += a_e;
        a_sq += a_e * a_e;
        row_terms += ge * std::fabs(oe);
      }
      const double b = w * std::min(a_sum, 4 * std::sqrt(a_sq));
      rows_sum += b;
      rows_sq += b * b;
      weights += w * dw * row_terms;
      terms += w * row_terms;
    }
    floor[static_cast<size_t>(h)] = std::min(rows_sum, 4 * std::sqrt(rows_sq)) + weights +
                                    static_cast<double>(Dv + T) * u * terms;
  }
  return Tensor::FromF64(Shape{H}, std::move(floor));
}

std::vector<Policy> DsinkPolicies(const Profile& profile) {
  std::vector<Policy> out;
  const std::vector<Policy>* dv = profile.For("dv");
  if (dv == nullptr) return out;
  for (Policy policy : *dv) {
    if (policy.kind != PolicyKind::kBaselineRatio) continue;
    policy.floor_scale = FloorScale::kElement;
    policy.format = Format::kF32;
    policy.format_scale = 1.0;
    policy.term_ulps = 0;
    policy.rounding_floor = true;
    out.push_back(policy);
  }
  return out;
}

std::vector<Verdict> JudgeDsink(CheckContext& ctx, std::string_view check,
                                const ForwardResult& fwd, const BackwardResult& bwd,
                                const Tensor& ref, const Tensor& base) {
  const Problem& p = ctx.case_.problem;
  std::vector<Verdict> out;
  if (Status st = CheckOutputTensor(bwd.dsink, "dsink", Shape{p.heads_q}); !st.ok()) {
    out.push_back(Failure(check, "dsink", "output of the problem's shape",
                          "cannot compare: " + st.error().message));
    return out;
  }
  const std::vector<Policy> policies = DsinkPolicies(*ctx.profile);
  if (policies.empty() || !base.defined()) {
    out.push_back(Failure(check, "dsink", "a baseline-ratio rule for dsink",
                          fmt::format("profile {}: no baseline-ratio policy for dv (and baseline "
                                      "dsink) to derive dsink's tolerance from",
                                      ctx.profile->name)));
    return out;
  }
  const Layout layout = Layout::Flat(1);
  const CompareOptions copts{.threads = ctx.oracle_options.threads};
  auto m = Compare("dsink", bwd.dsink, ref, Format::kF32, layout, copts);
  auto bm = Compare("dsink", base, ref, Format::kF32, layout, copts);
  if (!m.ok() || !bm.ok()) {
    out.push_back(Failure(check, "dsink", "comparable outputs",
                          (!m.ok() ? m.error() : bm.error()).message));
    return out;
  }
  const BackwardOut& oracle = ctx.OracleBackward();
  const Format o_format = FormatOf(fwd.o.dtype()).value_or(Format::kF32);
  const Tensor floor =
      DsinkRoundingFloor(p, oracle.o, oracle.lse, ctx.inputs.dout, ctx.inputs.sink, o_format);
  if (Status st = SetRoundingFloor(*m, floor); !st.ok()) {
    out.push_back(Failure(check, "dsink", "rounding floors", st.error().message));
    return out;
  }
  for (const Policy& policy : policies) out.push_back(Evaluate(policy, *m, &*bm, check));
  return out;
}

}  // namespace attest
