// Allowances for the metamorphic relations (verify/checks/metamorphic.h): what two runs of
// one kernel on related problems may legitimately differ by beyond a few ulps of the row,
// per element, from the roundings the kernel declares and the runs' own outputs. No oracle
// is involved except for P's magnitude where a kernel returns no lse.
#include "verify/checks/relation_bounds.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"
#include "verify/tolerance/term_scale.h"

namespace attest {
namespace {

// What one term (query i, key j) of a row contributes, given P_ij, t'_ij, dP_ij, D_i and
// dS_ij (f64, from the run's own lse and o) and the row's flat index in lse's layout.
using TermWeight = double (*)(const void* ctx, size_t row, double prob, double tprime, double dp,
                              double delta, double ds);

// The walk DpRoundingBound and PairRoundingBound share: dq_id += w_ij |k_jd| and dk_jd +=
// w_ij |q_id| over every visible (i, j), w_ij = |scale| weight(...).
DpRoundingAllowance TermBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                              const Tensor& lse, TermWeight weight, const void* wctx) {
  const Tensor q = ToF64(in.q).Clone(), k = ToF64(in.k).Clone(), v = ToF64(in.v).Clone();
  const Tensor dout = ToF64(in.dout).Clone(), of = ToF64(o).Clone(), lf = ToF64(lse).Clone();
  const auto Q = q.span<const double>(), K = k.span<const double>(), V = v.span<const double>();
  const auto DO = dout.span<const double>(), O = of.span<const double>();
  const auto L = lf.span<const double>();
  DpRoundingAllowance out{Tensor::Zeros(DType::kF64, p.QShape()),
                          Tensor::Zeros(DType::kF64, p.KShape())};
  const auto AQ = out.dq.span<double>(), AK = out.dk.span<double>();
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const double scale = p.EffectiveScale(), abs_scale = std::fabs(scale);
  auto at = [](int64_t row, int64_t heads, int64_t h, int64_t width) {
    return static_cast<size_t>((row * heads + h) * width);
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence& seq = mask.sequence();
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t qi = seq.q_begin + i;
        const size_t row = static_cast<size_t>(
            p.varlen() ? h * p.TotalQ() + qi : (b * hq + h) * p.seqlen_q + i);
        const double lse_i = L[row];
        if (!std::isfinite(lse_i)) continue;  // empty row (or a non-finite answer: no bound)
        double delta = 0;  // D_i = rowsum(dO_i ∘ o_i)
        for (int64_t c = 0; c < dv; ++c) {
          delta += DO[at(qi, hq, h, dv) + c] * O[at(qi, hq, h, dv) + c];
        }
        ForEachVisibleKey(mask, i, [&](int64_t j) {
          const int64_t kj = seq.k_begin + j;
          double dot = 0, dp = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += Q[at(qi, hq, h, d) + c] * K[at(kj, hkv, g, d) + c];
          }
          for (int64_t c = 0; c < dv; ++c) {
            dp += DO[at(qi, hq, h, dv) + c] * V[at(kj, hkv, g, dv) + c];
          }
          const double sc =
              TransformScore(scale * dot, p.softcap, slope, mask.AlibiDistance(i, j));
          const double prob = std::exp(sc - lse_i);
          double tprime = 1;
          if (p.softcap > 0) {
            const double t = std::tanh(scale * dot / p.softcap);
            tprime = 1 - t * t;
          }
          const double ds = prob * (dp - delta) * tprime;
          const double w = abs_scale * weight(wctx, row, prob, tprime, dp, delta, ds);
          if (!std::isfinite(w)) return;
          for (int64_t c = 0; c < d; ++c) {
            AQ[at(qi, hq, h, d) + c] += w * std::fabs(K[at(kj, hkv, g, d) + c]);
            AK[at(kj, hkv, g, d) + c] += w * std::fabs(Q[at(qi, hq, h, d) + c]);
          }
        });
      }
    }
  }
  return out;
}

struct PairInputs {
  Tensor dl;  // per (query, head), lse's layout: |lse_a - lse_b|
  Tensor dd;  // per (query, head), lse's layout: dD_i
  Format ds;
};

}  // namespace

// The format a relation's ULPs are counted in: the precision the kernel declares for
// `tensor` (the first policy of its profile that names a format: bf16 o and gradients for a
// bf16 kernel, fp32 lse), not the container the values came in: fp32 results widened to
// f64 would otherwise be held to f64 ULPs, 2^29 times finer than the kernel computes. Only
// a profile that declares none (the low-precision families) falls back to the container.
Format UlpFormat(const Profile* profile, std::string_view tensor, const Tensor& got) {
  if (profile != nullptr) {
    if (const std::vector<Policy>* policies = profile->For(tensor)) {
      for (const Policy& policy : *policies) {
        if (policy.format) return *policy.format;
      }
    }
  }
  return FormatOf(got.dtype()).value_or(Format::kF64);
}

double UlpFormatScale(const Profile* profile, std::string_view tensor) {
  if (profile != nullptr) {
    if (const std::vector<Policy>* policies = profile->For(tensor)) {
      for (const Policy& policy : *policies) {
        if (policy.format) return policy.format_scale;
      }
    }
  }
  return 1.0;
}


DpRoundingAllowance DpRoundingBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                                    const Tensor& lse, Format dp_format) {
  struct Ctx {
    Format dp, ds;
  } c{dp_format, FormatOf(p.dtype).value_or(Format::kF32)};
  return TermBound(
      p, in, o, lse,
      [](const void* x, size_t, double prob, double tprime, double dp, double, double ds) {
        const Ctx& f = *static_cast<const Ctx*>(x);
        // (1 + Quantum(1)): the rounded run's dS may exceed the exact one by the first
        // term (where P (dP - D) cancels), and its own dS rounding scales with it.
        return prob * tprime * Quantum(dp, f.dp) / 2 * (1 + Quantum(1.0, f.ds)) +
               Quantum(ds, f.ds);
      },
      &c);
}

// Per-element allowance (f64; dq's and dk's shapes, on `p` and `in`) for two runs a and b of
// the same tokens that a kernel computes in another blocking (padding moves its tiles; a
// permutation moves a sequence to another offset). Both runs are the kernel's own: what
// differs is where each rounds.
//   - The forward's sums end elsewhere: lse_i moves by dl_i = |lse_a - lse_b| (observed),
//     P_ij = exp(s_ij - lse_i) by P_ij dl_i, so dS_ij = P_ij (dP_ij - D_i) t'_ij by
//     P_ij dl_i |dP_ij - D_i| t'_ij.
//   - O moves within its own relation's budget, and D_i = rowsum(dO_i o_i) with it, by
//     dD_i = sum_c |dO_ic| |o_a - o_b|_ic (observed; for values wider than the declared
//     output format, at most 2 fp32 ulps each): dS_ij by P_ij dD_i t'_ij.
//   - dS_ij is rounded to the kernel's dS format (the dtype where the profile declares
//     FlashAttention-2's rounding points, term_scale.h; else fp32) in each run: values that
//     moved can round to neighbours, one quantum apart.
//   - The sums over keys (dq) and queries (dk) run in another order, and a kernel may form
//     dP and D in other blocks: 2 fp32 ulps of the row's terms (term_scale.h, which carries
//     Higham's factor for the cancelling dot products), what accuracy admits for one run. Not
//     twice that: the dot products' cancellation is the same code on the same O in both runs,
//     and what O's and lse's moves add is counted above from the observed moves. (Doubled,
//     it admitted a position-dependent bias of 1e-4 in O: check_test.cc SequenceBias.)
//   dq_id: |scale| sum_j w_ij |k_jd| + 2 Quantum_f32(terms_i),  dk_jd: likewise over i, with
//   w_ij = t'_ij P_ij (dl_i |dP_ij - D_i| + dD_i) + Quantum(dS_ij, ds format).
// H200, flex-triton bf16 (Triton blocks moved by padding): dk moved by 1.6e-6 where 2 bf16
// ulps of its row allowed 2.4e-7, and a dq that is exactly 0 unpadded (constant rows: dP = D)
// by 1.6e-7.
DpRoundingAllowance PairRoundingBound(const Problem& p, const CaseInputs& in, const Tensor& o_a,
                                      const Tensor& lse_a, const Tensor& o_b, const Tensor& lse_b,
                                      Format ds_format, Format o_format) {
  // D reads the O the kernel returned. Where both runs returned values of the declared output
  // format (a bf16 O), their whole difference counts; where a kernel returned wider values,
  // only an fp32 rounding's worth (2 fp32 ulps) does: a move of O below the declared format's
  // resolution is no rounding of a correct kernel but a difference the o relation is too
  // coarse to see (check_test.cc SequenceBias), and the gradients must still see it.
  const Tensor la = ToF64(lse_a), lb = ToF64(lse_b), oa = ToF64(o_a), ob = ToF64(o_b);
  const Tensor dout = ToF64(in.dout);
  PairInputs c{Tensor::Zeros(DType::kF64, p.LseShape()), Tensor::Zeros(DType::kF64, p.LseShape()),
               ds_format};
  const auto A = la.span<const double>(), B = lb.span<const double>();
  const auto DL = c.dl.span<double>(), DD = c.dd.span<double>();
  for (size_t e = 0; e < DL.size(); ++e) {
    DL[e] = std::isfinite(A[e]) && std::isfinite(B[e]) ? std::fabs(A[e] - B[e]) : 0.0;
  }
  const auto OA = oa.span<const double>(), OB = ob.span<const double>();
  const auto DO = dout.span<const double>();
  const int64_t dv = p.head_dim_v;
  for (int64_t t = 0; t < p.TotalQ(); ++t) {  // token rows of o ([B*Sq] or packed)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      double acc = 0;
      for (int64_t x = 0; x < dv; ++x) {
        const size_t e = static_cast<size_t>((t * p.heads_q + h) * dv + x);
        double diff = std::fabs(OA[e] - OB[e]);
        if (!std::isfinite(diff)) continue;
        if (RoundTo(OA[e], o_format) != OA[e] || RoundTo(OB[e], o_format) != OB[e]) {
          diff = std::min(diff, 2 * Quantum(std::max(std::fabs(OA[e]), std::fabs(OB[e])),
                                            Format::kF32));
        }
        acc += std::fabs(DO[e]) * diff;
      }
      const int64_t l = p.varlen() ? h * p.TotalQ() + t
                                   : ((t / p.seqlen_q) * p.heads_q + h) * p.seqlen_q +
                                         t % p.seqlen_q;
      DD[static_cast<size_t>(l)] = acc;
    }
  }
  return TermBound(
      p, in, o_a, lse_a,
      [](const void* x, size_t row, double prob, double tprime, double dp, double delta,
         double ds) {
        const PairInputs& f = *static_cast<const PairInputs*>(x);
        return tprime * prob *
                   (f.dl.data<double>()[row] * std::fabs(dp - delta) +
                    f.dd.data<double>()[row]) +
               Quantum(ds, f.ds);
      },
      &c);
}

// The allowance when the kernel declares another dP rounding point for `other` than for the
// case's problem `p` (nullopt when both agree): what rounding dP to the coarser of the two
// moves dq and dk, on p's shapes (a missing format is fp32 dP, finer than any declared one).
// `note` gets the verdict message's addendum.
std::optional<DpRoundingAllowance> DpAllowance(CheckContext& ctx, const Problem& other,
                                               const ForwardResult& base, bool backward,
                                               std::string* note) {
  const Problem& p = ctx.case_.problem;
  if (!backward) return std::nullopt;
  const std::optional<Format> a = ctx.kernel->BackwardDpFormat(p);
  const std::optional<Format> b = ctx.kernel->BackwardDpFormat(other);
  if (a == b) return std::nullopt;
  const Format dp = !a ? *b : !b ? *a : Quantum(1.0, *a) >= Quantum(1.0, *b) ? *a : *b;
  *note = fmt::format("; dP rounded to {} in one run only", Name(dp));
  // P's magnitude from the run's own lse, or the oracle's where the kernel returns none.
  const Tensor& lse = JudgesLse(*ctx.kernel) ? base.lse : ctx.OracleForward().lse;
  return DpRoundingBound(p, ctx.inputs, base.o, lse, dp);
}


Tensor SumAllowance(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  Tensor out = ToF64(a).Clone();
  const Tensor w = ToF64(b);
  const auto o = out.span<double>();
  const auto x = w.span<const double>();
  for (size_t e = 0; e < o.size(); ++e) o[e] += x[e];
  return out;
}

RecomputeAllowance RecomputeBound(CheckContext& ctx, const Problem& p, const CaseInputs& in,
                                  const Tensor& o_a, const Tensor& lse_a, const Tensor& o_b,
                                  const Tensor& lse_b, const std::function<Tensor()>& oracle_lse,
                                  const DpRoundingAllowance* dpa) {
  RecomputeAllowance out;
  if (dpa != nullptr) out = {dpa->dq, dpa->dk};
  if (!in.dout.defined() || !o_a.defined() || !o_b.defined()) return out;
  const bool seen = JudgesLse(*ctx.kernel) && lse_a.defined() && lse_b.defined();
  const Tensor lse_mag = seen ? lse_a : oracle_lse();
  auto terms =
      ComputeGradientTermScales(p, in.q, in.k, in.v, in.dout, lse_mag, ctx.oracle_options.threads);
  if (!terms.ok()) return out;
  const bool rounds = ctx.profile != nullptr && ctx.profile->needs_rounding_floor();
  const Format ds = rounds ? FormatOf(p.dtype).value_or(Format::kF32) : Format::kF32;
  DpRoundingAllowance pair = PairRoundingBound(p, in, o_a, lse_mag, o_b, seen ? lse_b : lse_mag,
                                               ds, UlpFormat(ctx.profile, "o", o_a));
  auto add_terms = [](Tensor& t, const Tensor& row_terms, int64_t width) {
    const auto o = t.span<double>();
    const Tensor r = ToF64(row_terms);
    const auto ts = r.span<const double>();
    for (size_t e = 0; e < o.size(); ++e) {
      o[e] += 2 * Quantum(ts[e / static_cast<size_t>(width)], Format::kF32);
    }
  };
  add_terms(pair.dq, terms->dq, p.head_dim);
  add_terms(pair.dk, terms->dk, p.head_dim);
  return {SumAllowance(out.dq, pair.dq), SumAllowance(out.dk, pair.dk)};
}

OrderAllowance SumOrderBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                             const Tensor& lse, Format accumulate) {
  OrderAllowance out;
  if (!o.defined() || !lse.defined()) return out;
  const double u = Quantum(1.0, accumulate) / 2;
  auto reorder = [](double n) { return std::min(n, kRoundingSigmas * std::sqrt(n)) + 1; };
  const Tensor q = ToF64(in.q).Clone(), k = ToF64(in.k).Clone(), v = ToF64(in.v).Clone();
  const Tensor of = ToF64(o).Clone(), lf = ToF64(lse).Clone();
  const bool bwd = in.dout.defined();
  const Tensor dout = bwd ? ToF64(in.dout).Clone() : Tensor();
  const auto Q = q.span<const double>(), K = k.span<const double>(), V = v.span<const double>();
  const auto O = of.span<const double>(), L = lf.span<const double>();
  const std::span<const double> DO = bwd ? dout.span<const double>() : std::span<const double>();
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  out.o = Tensor::Zeros(DType::kF64, o.shape());
  // dv's two sums per element (terms and P's errors) and its term count per (key, kv head).
  Tensor dv_terms, dv_err;
  std::vector<double> dv_count;
  if (bwd) {
    dv_terms = Tensor::Zeros(DType::kF64, p.VShape());
    dv_err = Tensor::Zeros(DType::kF64, p.VShape());
    dv_count.assign(static_cast<size_t>(p.TotalK() * hkv), 0.0);
  }
  const auto AO = out.o.span<double>();
  const std::span<double> TV = bwd ? dv_terms.span<double>() : std::span<double>();
  const std::span<double> EV = bwd ? dv_err.span<double>() : std::span<double>();
  const double scale = p.EffectiveScale(), abs_scale = std::fabs(scale);
  const double dot_factor = reorder(static_cast<double>(d));
  auto at = [](int64_t row, int64_t heads, int64_t h, int64_t width) {
    return static_cast<size_t>((row * heads + h) * width);
  };
  std::vector<double> terms(static_cast<size_t>(dv)), errs(static_cast<size_t>(dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence& seq = mask.sequence();
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t qi = seq.q_begin + i;
        const size_t row = static_cast<size_t>(
            p.varlen() ? h * p.TotalQ() + qi : (b * hq + h) * p.seqlen_q + i);
        const double lse_i = L[row];
        if (!std::isfinite(lse_i)) continue;  // an empty row: nothing is summed
        double n_i = 0;
        ForEachVisibleKey(mask, i, [&](int64_t) { n_i += 1; });
        const double row_reorder = reorder(n_i);
        std::fill(terms.begin(), terms.end(), 0.0);
        std::fill(errs.begin(), errs.end(), 0.0);
        double p_err = 0;  // sum_j P_ij e_ij: the relative move of l_i
        ForEachVisibleKey(mask, i, [&](int64_t j) {
          const int64_t kj = seq.k_begin + j;
          double dot = 0, dot_abs = 0;
          for (int64_t c = 0; c < d; ++c) {
            const double x = Q[at(qi, hq, h, d) + c] * K[at(kj, hkv, g, d) + c];
            dot += x;
            dot_abs += std::fabs(x);
          }
          const double s =
              TransformScore(scale * dot, p.softcap, slope, mask.AlibiDistance(i, j));
          const double prob = std::exp(s - lse_i);
          if (!std::isfinite(prob)) return;
          const double e = u * (dot_factor * abs_scale * dot_abs + std::fabs(s) +
                                std::fabs(s - lse_i) + 2);
          p_err += prob * e;
          for (int64_t c = 0; c < dv; ++c) {
            const double a = std::fabs(V[at(kj, hkv, g, dv) + c]);
            terms[static_cast<size_t>(c)] += prob * a;
            errs[static_cast<size_t>(c)] += prob * e * a;
          }
          if (bwd) {
            const double eb = e + row_reorder * u;  // P recomputed from an lse that moved
            for (int64_t c = 0; c < dv; ++c) {
              const double a = std::fabs(DO[at(qi, hq, h, dv) + c]);
              TV[at(kj, hkv, g, dv) + c] += prob * a;
              EV[at(kj, hkv, g, dv) + c] += prob * eb * a;
            }
            dv_count[static_cast<size_t>(kj * hkv + g)] += 1;
          }
        });
        for (int64_t c = 0; c < dv; ++c) {
          const size_t e = at(qi, hq, h, dv) + static_cast<size_t>(c);
          const double oa = std::isfinite(O[e]) ? std::fabs(O[e]) : 0.0;
          AO[e] = 2 * (row_reorder * u * (terms[static_cast<size_t>(c)] + oa) +
                       errs[static_cast<size_t>(c)] + p_err * oa);
        }
      }
    }
  }
  if (bwd) {
    out.dv = Tensor::Zeros(DType::kF64, p.VShape());
    const auto AV = out.dv.span<double>();
    for (size_t e = 0; e < AV.size(); ++e) {
      const double n = dv_count[e / static_cast<size_t>(dv)];
      AV[e] = n == 0 ? 0.0 : 2 * (reorder(n) * u * TV[e] + EV[e]);
    }
  }
  return out;
}

}  // namespace attest
