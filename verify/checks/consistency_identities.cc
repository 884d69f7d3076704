// The identities (delta, dk-sum, dv-sum) and the constant-V probe of the forward/backward
// consistency check, which consistency.cc runs.
//
// Forward/backward consistency (see consistency.h; docs/design.md "Checks"; FlashAttention-2,
// arXiv 2307.08691, Algorithm 2: D_i = rowsum(dO_i ∘ O_i), dS = P ∘ (dP - D)).
//
// Derivations. For a non-empty row i with weights P_ij = exp(s_ij - lse_i), Σ_j P_ij = 1:
//   Σ_j dS_ij = Σ_j P_ij dP_ij - D_i Σ_j P_ij = dO_i·(Σ_j P_ij v_j) - D_i = dO_i·O_i - D_i = 0,
// so Σ_j dK_j = scale Σ_i q_i Σ_j dS_ij = 0 exactly for the exact gradient. With softcap,
// dK_j = scale Σ_i c_ij dS_ij q_i with c_ij = 1 - tanh²(raw_ij / cap) varying over j, and
// Σ_j c_ij dS_ij is not 0; the identity is then used in its weighted form: the prediction is
// scale Σ_i q_i Σ_j c_ij dS_ij with dS from the kernel's own P and D (a backward that drops
// c misses by Σ_j (1 - c_ij) dS_ij per row, far above the rounding bound). ALiBi leaves the
// identity intact (the bias does not depend on q or k). FlashAttention reads D from the ROUNDED O
// (DeltaSource::kRoundedO), so
// Σ_j dS_ij = dO_i·(O_i^fp32 - O_i^rounded) ≠ 0; the prediction therefore uses
// r_i = Σ_j P_ij dP_ij - rowsum(dO_i ∘ O_i^kernel), which is that term, computed here in f64.
// Σ_j dV_j = Σ_i (Σ_j P_ij) dO_i = Σ_{non-empty i} dO_i.
// A learnable sink (docs/semantics.md "Learnable sink"; docs/checks.md derives each term): the
// kernel's lse includes it, so Σ_j P_ij = 1 - p_sink,i with p_sink,i = exp(sink_h - lse_i).
// delta is unchanged (the sink has no value: O_i = Σ_j P_ij v_j); Σ_j dS_ij = p_sink,i D_i, and
// Σ_j dV_j = Σ_i (1 - p_sink,i) dO_i; both predictions below are formed from the kernel's P,
// which carries the term. The probe's O_i = (1 - p_sink,i) c, so its dS_ij = P_ij p_sink,i
// dO_i·c is not 0, and the probe predicts it from P and D as it does without a sink.
// Constant-V probe: with v_j = c for every key of a sequence the exact O_i is c whatever P
// is, so dq and dk vanish; a kernel computes dS_ij = P_ij (dO_i·c - D_i) with D_i from its
// returned O, i.e. dS_ij = -P_ij e_i with e_i = dO_i·(O_i - c), known here exactly.
//
// Bounds are first-order worst-case (Higham, "Accuracy and Stability of Numerical
// Algorithms", 2nd ed., §3.1: a length-n fp32 sum errs by at most γ_n Σ|terms|,
// γ_n = n u/(1 - n u), u = 2^-24), one term per rounding point of the recipe (and dP's rounding
// where the recipe's `dp` or the kernel's BackwardDpFormat(p) names one), times 2 for the
// second-order terms (the oracle's ErrorBound convention), plus the smallest positive value
// of the output format (a result that should be 0 may round to a subnormal).
#include "verify/checks/consistency_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"
#include "verify/checks/check.h"
#include "verify/metrics/metrics.h"

namespace attest::consistency_detail {
namespace {

constexpr double kU32 = 0x1p-24;

double Gamma(double n) { return n * kU32 / (1 - n * kU32); }

// One query row's softmax as the kernel's lse defines it.
struct RowWeights {
  std::vector<int64_t> j;       // visible keys (local)
  std::vector<double> p;        // exp(s - lse)
  std::vector<double> c;        // ds/draw (softcap derivative; 1 without softcap)
  double eps = 0;               // relative error bound of the kernel's fp32 weights
};

bool RowWeightsOf(const Problem& p, const Geometry& g, const MaskView& m, const double* q,
                  const double* k, const double* lse, int64_t h, int64_t i, RowWeights& w) {
  const Sequence& s = m.sequence();
  const double l = lse[g.Lse(s, h, i)];
  w.j.clear();
  w.p.clear();
  w.c.clear();
  if (!std::isfinite(l)) return false;  // empty row (-inf, or +inf as FlashAttention writes)
  const double scale = p.EffectiveScale();
  const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
  const int64_t kvh = p.KvHead(h);
  double score_err = 0, s_max = 0;
  ForEachVisibleKey(m, i, [&](int64_t j) {
    double dot = 0, abs_dot = 0;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      const double x = q[g.Q(s.q_begin + i, h, d)] * k[g.K(s.k_begin + j, kvh, d)];
      dot += x;
      abs_dot += std::fabs(x);
    }
    const double raw = scale * dot;
    const double sc = TransformScore(raw, p.softcap, slope, m.AlibiDistance(i, j));
    double c = 1;
    if (p.softcap > 0) {
      const double t = std::tanh(raw / p.softcap);
      c = 1 - t * t;
    }
    w.j.push_back(j);
    w.p.push_back(std::exp(sc - l));
    w.c.push_back(c);
    score_err = std::max(score_err, Gamma(static_cast<double>(p.head_dim) + 3) * scale * abs_dot);
    s_max = std::max(s_max, std::fabs(sc));
  });
  // The kernel's weights differ from exp(s - lse) by its fp32 score error and its lse (twice:
  // once in the weight, once in the normaliser it implies), the fp32 exp and the row-sum.
  w.eps = 2 * (score_err + kU32 * (std::fabs(l) + s_max) * 2) +
          Gamma(static_cast<double>(s.k_len) + 4);
  return true;
}

struct Worst {
  double margin = 0, observed = 0, allowed = 0;
  Location where;
  int64_t judged = 0;
  void Update(double obs, double allow, const Location& loc) {
    ++judged;
    const double m = Margin(obs, allow);
    if (m > margin || judged == 1) {
      margin = m;
      observed = obs;
      allowed = allow;
      where = loc;
    }
  }
};

Verdict MakeVerdict(std::string_view tensor, std::string policy, const Worst& w,
                    const std::string& what, const std::string& repro) {
  Verdict v;
  v.check = std::string(kCheck);
  v.tensor = std::string(tensor);
  v.policy = std::move(policy);
  v.observed = w.observed;
  v.allowed = w.allowed;
  v.margin = w.margin;
  v.pass = w.margin <= 1;
  v.worst = w.where;
  std::ostringstream os;
  os << what << (v.pass ? " holds" : " violated") << ": worst " << w.where.ToString()
     << ", |residual| " << w.observed << " vs bound " << w.allowed << " (margin " << w.margin
     << ", " << w.judged << " checked)";
  v.message = os.str();
  if (!v.pass) v.repro = repro;
  return v;
}

Location Loc(const Problem& p, std::string_view tensor, std::vector<int64_t> index, double obs,
             double ref) {
  Location l = Locate(LayoutOf(p, tensor), index);
  l.observed = obs;
  l.reference = ref;
  return l;
}

// Full index of token-major element (t, h, d) for a tensor of p's padded or packed layout.
std::vector<int64_t> TokenIndex(const Problem& p, int64_t t, int64_t h, int64_t d) {
  if (p.varlen()) return {t, h, d};
  return {t / p.seqlen_q, t % p.seqlen_q, h, d};
}
std::vector<int64_t> KeyIndex(const Problem& p, int64_t t, int64_t h, int64_t d) {
  if (p.varlen()) return {t, h, d};
  return {t / p.seqlen_k, t % p.seqlen_k, h, d};
}

// The lse that weights P in the identities and the probe: the kernel's own, or, for a kernel
// that returns none (Capabilities::lse = false), the float64 oracle's at the recipe's Q·Kᵀ
// operands: the exact normaliser of the scores the kernel forms, from which the kernel's
// weights differ by its score error and its fp32 row sum, both inside RowWeightsOf's eps.
Tensor WeightsLse(const Problem& p, const Operands& x, const KernelRun& run) {
  if (run.lse.defined()) return run.lse;
  OracleOptions o;
  if (p.sink) o.sink = &run.sink;  // the oracle's lse includes the sink, as a kernel's does
  return Forward<double>(p, x.qs, x.ks, x.vo, o).lse;
}

// The f64 arrays the identities read: the recipe's operands (Operands), the kernel's run and
// the lse that weights P (WeightsLse).
struct IdentityArrays {
  const double* q;
  const double* k;
  const double* v;
  const double* dout;  // D's dO (Recipe::delta_do)
  const double* dop;
  const double* vp;
  const double* dov;
  const double* qk;
  const double* o;
  const double* lse;
  const double* dk;
  const double* dv;
};

// The dk-sum and dv-sum predictions of one (batch, kv head) and their bounds, summed over the
// group's query heads and rows.
struct KeySums {
  std::vector<double> pred_dk, bound_dk, pred_dv, bound_dv;
};

// One row's products with dO, over its visible keys.
struct RowProducts {
  double d_o = 0, a_o = 0;  // rowsum(dO∘O) and Σ|dO∘O|
  double d_p = 0, b_p = 0, b_pb = 0, mass = 0;  // Σ P dP, Σ P |dO|·|v|, same for dp
  std::vector<double> dp, adp;
};

// Row i of query head h (token t) with weights w: d_p = Σ P (dO·v_o) with the forward's V (what
// D must equal: O = Σ P v_o); dp[n] = dO_b·v_b with the dO·Vᵀ operands (what the backward's dP
// is; it differs from dO·v_o where the recipe quantises dO·Vᵀ's operands differently, e.g.
// mxfp8-pvbf16's MX V against the forward's bf16 V).
RowProducts ProductsOf(const Problem& p, const IdentityArrays& a, const RowWeights& w,
                       const Sequence& s, int64_t kvh, int64_t h, int64_t t) {
  const Geometry g{p};
  const double* dout = a.dout;
  const double* o = a.o;
  const double* v = a.v;
  const double* dop = a.dop;
  const double* vp = a.vp;
  const int64_t Dv = p.head_dim_v;
  RowProducts x;
  for (int64_t d = 0; d < Dv; ++d) {
    x.d_o += dout[g.O(t, h, d)] * o[g.O(t, h, d)];
    x.a_o += std::fabs(dout[g.O(t, h, d)] * o[g.O(t, h, d)]);
  }
  x.dp.resize(w.j.size());
  x.adp.resize(w.j.size());
  for (size_t n = 0; n < w.j.size(); ++n) {
    const int64_t tk = s.k_begin + w.j[n];
    double xf = 0, axf = 0, xb = 0, axb = 0;
    for (int64_t d = 0; d < Dv; ++d) {
      xf += dout[g.O(t, h, d)] * v[g.V(tk, kvh, d)];
      axf += std::fabs(dout[g.O(t, h, d)] * v[g.V(tk, kvh, d)]);
      xb += dop[g.O(t, h, d)] * vp[g.V(tk, kvh, d)];
      axb += std::fabs(dop[g.O(t, h, d)] * vp[g.V(tk, kvh, d)]);
    }
    x.dp[n] = xb;
    x.adp[n] = axb;
    x.d_p += w.p[n] * xf;
    x.b_p += w.p[n] * axf;
    x.b_pb += w.p[n] * axb;
    x.mass += w.p[n];
  }
  return x;
}

// Row i of query head h (sequence s of batch entry b) with weights w: the delta identity judged
// into w_delta, and the row's terms of the dk-sum and dv-sum predictions added to `sums`.
void IdentityRow(const Problem& p, const IdentityArrays& a, const RoundingModel& rd,
                 const RowWeights& w, const Sequence& s, int64_t b, int64_t kvh, int64_t h,
                 int64_t i, KeySums& sums, Worst& w_delta) {
  const Geometry g{p};
  const double* dov = a.dov;
  const double* qk = a.qk;
  const double scale = p.EffectiveScale();
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.gqa_ratio();
  const int64_t t = s.q_begin + i;
  const RowProducts x = ProductsOf(p, a, w, s, kvh, h, t);
  const double d_o = x.d_o, a_o = x.a_o;
  const double d_p = x.d_p, b_p = x.b_p, b_pb = x.b_pb, mass = x.mass;
  const std::vector<double>& dp = x.dp;
  const std::vector<double>& adp = x.adp;
  // delta: O was rounded once (u_o), computed from P rounded before P·V (u_pv) with
  // fp32 weights (eps) and an fp32 sum over keys and the final division.
  const double eps_pv = rd.u_pv + w.eps + Gamma(static_cast<double>(w.j.size()) + 2);
  const double allow_delta = 2 * (rd.u_o * a_o + eps_pv * b_p) + rd.tiny_o;
  w_delta.Update(std::fabs(d_o - d_p), allow_delta,
                 Loc(p, "lse", p.varlen() ? std::vector<int64_t>{h, t}
                                          : std::vector<int64_t>{b, h, i},
                     d_o, d_p));
  // dk-sum prediction: r_i = Σ_j c_ij P_ij (dP_ij - D_used) with D_used from the
  // returned O (or Σ P dP itself when the recipe reads the fp32 O); c ≡ 1 without
  // softcap, where r_i is FlashAttention's D-from-rounded-O term.
  const double d_used = rd.delta_rounded ? d_o : d_p;
  double r = 0, abs_ds = 0, dp_round = 0;  // dp_round: Σ_j c P |δdP| (dP's rounding)
  double abs_pd = 0;                       // Σ_j P |dP - D| (without c)
  for (size_t n = 0; n < w.j.size(); ++n) {
    r += w.c[n] * w.p[n] * (dp[n] - d_used);
    abs_ds += w.c[n] * w.p[n] * std::fabs(dp[n] - d_used);
    abs_pd += w.p[n] * std::fabs(dp[n] - d_used);
    dp_round += w.c[n] * w.p[n] *
                (rd.u_dp * (std::fabs(dp[n]) + Gamma(static_cast<double>(Dv)) * adp[n]) +
                 rd.tiny_dp);
  }
  // The kernel's fp32 tanh' carries its score error through t: |δc| ≤ 2|t| c δs/cap.
  const double eps_c = p.softcap > 0 ? w.eps / p.softcap + 4 * kU32 : 0.0;
  // ... and 1 - t² in fp32 errs absolutely by up to ~6 u32 (t = tanhf to ~2 ulp,
  // squared, subtracted): where tanh saturates, c ~ 1e-9 while the kernel's c is 0.
  // Σ_j |dS_ij| error sources: weights (eps), softcap factor, dS rounding, fp32 dP and
  // D (γ_Dv on Σ|dO∘v| and Σ|dO∘O|), dP's own rounding, D's own error when read from
  // the fp32 O (which differs from Σ P v_o by the P·V product's error alone: the
  // output rounding u_o never reaches it, and Σ|dO∘O|'s fp32 sum is in γ_Dv above).
  const double eta = abs_ds * (rd.u_ds + w.eps + eps_c + rd.u_g) +
                     Gamma(static_cast<double>(Dv) + 2) * (b_pb + mass * a_o) + dp_round +
                     static_cast<double>(w.j.size()) * rd.tiny_ds +
                     (p.softcap > 0 ? 6 * kU32 * abs_pd : 0.0) +
                     (rd.delta_rounded ? 0.0 : 2 * eps_pv * b_p);
  const double n_acc = Gamma(static_cast<double>(s.q_len * G) + 2);
  for (int64_t d = 0; d < D; ++d) {
    const double qd = qk[g.Q(t, h, d)];
    sums.pred_dk[static_cast<size_t>(d)] += scale * r * qd;
    sums.bound_dk[static_cast<size_t>(d)] +=
        scale * std::fabs(qd) * (eta + abs_ds * n_acc + std::fabs(r) * rd.u_g);
  }
  for (int64_t d = 0; d < Dv; ++d) {
    const double gd = dov[g.O(t, h, d)];
    sums.pred_dv[static_cast<size_t>(d)] += mass * gd;
    sums.bound_dv[static_cast<size_t>(d)] +=
        mass * std::fabs(gd) * (rd.u_pdo + w.eps + rd.u_g + n_acc) +
        static_cast<double>(w.j.size()) * rd.tiny_pdo * std::fabs(gd);
  }
}

// Σ_j dK_j and Σ_j dV_j of one (sequence, kv head) against their predictions in `sums`; a
// column holding a saturated gradient is skipped (RoundingModel::sat_g).
void JudgeKeySums(const Problem& p, const IdentityArrays& a, const RoundingModel& rd,
                  const Sequence& s, int64_t kvh, const KeySums& sums, Worst& w_dk, Worst& w_dv) {
  const Geometry g{p};
  const double* dk = a.dk;
  const double* dv = a.dv;
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  const std::vector<double>& pred_dk = sums.pred_dk;
  const std::vector<double>& bound_dk = sums.bound_dk;
  const std::vector<double>& pred_dv = sums.pred_dv;
  const std::vector<double>& bound_dv = sums.bound_dv;
  // A sequence without keys has no dK, dV to sum (Sk = 0: every row is empty).
  for (int64_t d = 0; d < D && s.k_len > 0; ++d) {
    double sum = 0, abs_sum = 0;
    bool saturated = false;
    for (int64_t j = 0; j < s.k_len; ++j) {
      sum += dk[g.K(s.k_begin + j, kvh, d)];
      abs_sum += std::fabs(dk[g.K(s.k_begin + j, kvh, d)]);
      saturated = saturated || std::fabs(dk[g.K(s.k_begin + j, kvh, d)]) >= rd.sat_g[1];
    }
    if (saturated) continue;
    const double allow =
        2 * (rd.u_g * abs_sum + bound_dk[static_cast<size_t>(d)]) + s.k_len * rd.tiny_g;
    w_dk.Update(std::fabs(sum - pred_dk[static_cast<size_t>(d)]), allow,
                Loc(p, "dk", KeyIndex(p, s.k_begin, kvh, d), sum,
                    pred_dk[static_cast<size_t>(d)]));
  }
  for (int64_t d = 0; d < Dv && s.k_len > 0; ++d) {
    double sum = 0, abs_sum = 0;
    bool saturated = false;
    for (int64_t j = 0; j < s.k_len; ++j) {
      sum += dv[g.V(s.k_begin + j, kvh, d)];
      abs_sum += std::fabs(dv[g.V(s.k_begin + j, kvh, d)]);
      saturated = saturated || std::fabs(dv[g.V(s.k_begin + j, kvh, d)]) >= rd.sat_g[2];
    }
    if (saturated) continue;
    const double allow =
        2 * (rd.u_g * abs_sum + bound_dv[static_cast<size_t>(d)]) + s.k_len * rd.tiny_g;
    w_dv.Update(std::fabs(sum - pred_dv[static_cast<size_t>(d)]), allow,
                Loc(p, "dv", KeyIndex(p, s.k_begin, kvh, d), sum,
                    pred_dv[static_cast<size_t>(d)]));
  }
}

// v_j := v at the sequence's first key, per kv head (values of the dtype already).
Tensor ConstantV(const Problem& p, const Tensor& v) {
  const Geometry g{p};
  Tensor vc = v.Clone();
  double* vcp = vc.span<double>().data();
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = SequenceOf(p, b);
    for (int64_t j = 1; j < s.k_len; ++j) {
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          vcp[g.V(s.k_begin + j, h, d)] = vcp[g.V(s.k_begin, h, d)];
        }
      }
    }
  }
  return vc;
}

// The f64 arrays the probe reads: the recipe's operands of the probe, the kernel's run on it
// and the lse that weights P (WeightsLse).
struct ProbeArrays {
  const double* q;
  const double* k;
  const double* kq;
  const double* qk;
  const double* dop;
  const double* vp;
  const double* dout;  // D's dO
  const double* o;
  const double* lse;
  const double* dq;
  const double* dk;
};

// Per (head in group, key): the largest |dS| over the key's queries; per (head, query): over
// the row's keys. Twice the probe's value covers the kernel's own rounding.
struct DsAmax {
  std::vector<double> col, row;
};

// |dS_ij| of the probe (the kernel's dS up to its rounding), for the amax of the blocks of a
// block-scaled dS: a row's keys (dQ) and, per head, a key's queries (dK) bound them. Over the
// group of kv head kvh of the sequence of `m`, into `amax`; `w` is the rows' scratch.
void BlockDsAmax(const Problem& p, const ProbeArrays& a, const MaskView& m, int64_t kvh,
                 RowWeights& w, DsAmax& amax) {
  const Geometry g{p};
  const Sequence& s = m.sequence();
  const int64_t Dv = p.head_dim_v, G = p.gqa_ratio();
  const auto probe_ds = [&](int64_t h, int64_t i, size_t n) {
    const int64_t t = s.q_begin + i;
    const int64_t tk = s.k_begin + w.j[n];
    double dp = 0, d_o = 0;
    for (int64_t d = 0; d < Dv; ++d) {
      dp += a.dop[g.O(t, h, d)] * a.vp[g.V(tk, p.KvHead(h), d)];
      d_o += a.dout[g.O(t, h, d)] * a.o[g.O(t, h, d)];
    }
    return std::fabs(w.p[n] * w.c[n] * (dp - d_o));
  };
  for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      if (!RowWeightsOf(p, g, m, a.q, a.k, a.lse, h, i, w)) continue;
      for (size_t n = 0; n < w.j.size(); ++n) {
        const double x = 2 * probe_ds(h, i, n);
        double& c = amax.col[static_cast<size_t>((h - kvh * G) * s.k_len + w.j[n])];
        double& r = amax.row[static_cast<size_t>((h - kvh * G) * s.q_len + i)];
        c = std::max(c, x);
        r = std::max(r, x);
      }
    }
  }
}

// Row i of query head h of the probe: its dq against the prediction (judged into w_dq), and
// the row's terms of the dk prediction and bound (per key j and d: j * D + d) added.
void ProbeRow(const Problem& p, const ProbeArrays& a, const RoundingModel& rd, const MaskView& m,
              int64_t kvh, int64_t h, int64_t i, const DsAmax& amax, RowWeights& w,
              std::vector<double>& pred_dk, std::vector<double>& bound_dk, Worst& w_dq) {
  const Geometry g{p};
  const Sequence& s = m.sequence();
  const double* dout = a.dout;
  const double* o = a.o;
  const double* dop = a.dop;
  const double* vp = a.vp;
  const double* kq = a.kq;
  const double* qk = a.qk;
  const double* dq = a.dq;
  const std::vector<double>& row_amax = amax.row;
  const std::vector<double>& col_amax = amax.col;
  const double scale = p.EffectiveScale();
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.gqa_ratio();
  const int64_t t = s.q_begin + i;
  std::vector<double> pred_dq(static_cast<size_t>(D), 0),
      bound_dq(static_cast<size_t>(D), 0);
  if (RowWeightsOf(p, g, m, a.q, a.k, a.lse, h, i, w)) {
    double d_o = 0, a_o = 0;  // D_i = dO·O and Σ|dO∘O|
    for (int64_t d = 0; d < Dv; ++d) {
      d_o += dout[g.O(t, h, d)] * o[g.O(t, h, d)];
      a_o += std::fabs(dout[g.O(t, h, d)] * o[g.O(t, h, d)]);
    }
    for (size_t n = 0; n < w.j.size(); ++n) {
      const int64_t tk = s.k_begin + w.j[n];
      double dp = 0, a_c = 0;  // dP_ij and Σ|dO_b∘v_b|
      for (int64_t d = 0; d < Dv; ++d) {
        dp += dop[g.O(t, h, d)] * vp[g.V(tk, kvh, d)];
        a_c += std::fabs(dop[g.O(t, h, d)] * vp[g.V(tk, kvh, d)]);
      }
      const double e = dp - d_o;
      // Kernel: dS_ij = round(P̃_ij (dP_ij - D_i)) with fp32 dP and D (γ_Dv each),
      // dP rounded to its own format where the kernel does (u_dp; a subnormal dP errs
      // by tiny_dp), weights within eps, dS rounding u_ds; then fp32 sums.
      const double eta = Gamma(static_cast<double>(Dv) + 2) * (a_c + a_o) +
                         rd.u_dp * (std::fabs(dp) + Gamma(static_cast<double>(Dv)) * a_c) +
                         rd.tiny_dp;
      const double rel = rd.u_ds + w.eps;
      const double ds = w.p[n] * w.c[n] * e;
      // c = 1 - t² from the kernel's fp32 t errs absolutely by ~6 u32 (Identities).
      const double c_abs = p.softcap > 0 ? 6 * kU32 : 0.0;
      const double ds_err = w.p[n] * w.c[n] * (std::fabs(e) * rel + eta * (1 + rel)) +
                            w.p[n] * c_abs * (std::fabs(e) + eta) + rd.tiny_ds;
      for (int64_t d = 0; d < D; ++d) {
        const double kd = kq[g.K(tk, kvh, d)];
        const double qd = qk[g.Q(t, h, d)];
        pred_dq[static_cast<size_t>(d)] += scale * ds * kd;
        const double blk_dq =
            rd.blk_ds_dq * row_amax[static_cast<size_t>((h - kvh * G) * s.q_len + i)];
        const double blk_dk =
            rd.blk_ds_dk *
            col_amax[static_cast<size_t>((h - kvh * G) * s.k_len + w.j[n])];
        bound_dq[static_cast<size_t>(d)] +=
            scale * std::fabs(kd) *
            (ds_err + blk_dq + std::fabs(ds) * Gamma(static_cast<double>(s.k_len) + 2));
        const size_t kk = static_cast<size_t>(w.j[n] * D + d);
        pred_dk[kk] += scale * ds * qd;
        bound_dk[kk] +=
            scale * std::fabs(qd) *
            (ds_err + blk_dk +
             std::fabs(ds) * (Gamma(static_cast<double>(s.q_len * G) + 2) + rd.u_g));
      }
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    const double obs = dq[g.Q(t, h, d)];
    const double pred =
        std::clamp(pred_dq[static_cast<size_t>(d)], -rd.sat_g[0], rd.sat_g[0]);
    const double allow =
        2 * (bound_dq[static_cast<size_t>(d)] + rd.u_g * std::fabs(pred)) + rd.tiny_g;
    w_dq.Update(std::fabs(obs - pred), allow,
                Loc(p, "dq", TokenIndex(p, t, h, d), obs, pred));
  }
}

// The probe's dk of one (sequence, kv head) against the prediction summed by ProbeRow.
void JudgeProbeDk(const Problem& p, const ProbeArrays& a, const RoundingModel& rd,
                  const Sequence& s, int64_t kvh, const std::vector<double>& pred_dk,
                  const std::vector<double>& bound_dk, Worst& w_dk) {
  const Geometry g{p};
  const double* dk = a.dk;
  const int64_t D = p.head_dim;
  for (int64_t j = 0; j < s.k_len; ++j) {
    for (int64_t d = 0; d < D; ++d) {
      const size_t kk = static_cast<size_t>(j * D + d);
      const double obs = dk[g.K(s.k_begin + j, kvh, d)];
      const double pred = std::clamp(pred_dk[kk], -rd.sat_g[1], rd.sat_g[1]);
      const double allow = 2 * (bound_dk[kk] + rd.u_g * std::fabs(pred_dk[kk])) + rd.tiny_g;
      w_dk.Update(std::fabs(obs - pred), allow,
                  Loc(p, "dk", KeyIndex(p, s.k_begin + j, kvh, d), obs, pred));
    }
  }
}

}  // namespace

// ---- delta, dk-sum, dv-sum ----
void Identities(const Problem& p, const Operands& x, const KernelRun& run, const RoundingModel& rd,
                const std::string& repro, const std::string& label, std::vector<Verdict>& out) {
  const Geometry g{p};
  // delta relates the kernel's O to its lse: not judged for a kernel that returns no lse.
  const bool judge_delta = run.lse.defined();
  const Tensor weights_lse = WeightsLse(p, x, run);
  const IdentityArrays a{.q = x.qs.span<const double>().data(),
                         .k = x.ks.span<const double>().data(),
                         .v = x.vo.span<const double>().data(),
                         .dout = x.dout.span<const double>().data(),
                         .dop = x.dop.span<const double>().data(),
                         .vp = x.vp.span<const double>().data(),
                         .dov = x.dov.span<const double>().data(),
                         .qk = x.qk.span<const double>().data(),
                         .o = run.o.span<const double>().data(),
                         .lse = weights_lse.span<const double>().data(),
                         .dk = run.dk.span<const double>().data(),
                         .dv = run.dv.span<const double>().data()};
  const int64_t D = p.head_dim, Dv = p.head_dim_v, G = p.gqa_ratio();
  Worst w_delta, w_dk, w_dv;
  RowWeights w;
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView m(p, b);
    const Sequence& s = m.sequence();
    for (int64_t kvh = 0; kvh < p.heads_kv; ++kvh) {
      // Per (b, kv head) sums over the group's query heads and rows.
      KeySums sums{std::vector<double>(static_cast<size_t>(D), 0),
                   std::vector<double>(static_cast<size_t>(D), 0),
                   std::vector<double>(static_cast<size_t>(Dv), 0),
                   std::vector<double>(static_cast<size_t>(Dv), 0)};
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        for (int64_t i = 0; i < s.q_len; ++i) {
          if (!RowWeightsOf(p, g, m, a.q, a.k, a.lse, h, i, w)) continue;
          IdentityRow(p, a, rd, w, s, b, kvh, h, i, sums, w_delta);
        }
      }
      JudgeKeySums(p, a, rd, s, kvh, sums, w_dk, w_dv);
    }
  }
  if (judge_delta && w_delta.judged > 0) {
    out.push_back(MakeVerdict("delta", "|rowsum(dO∘O) - rowsum(P∘dP)| ≤ rounding bound",
                              w_delta, label + "delta: D from the kernel's O vs P from its lse",
                              repro));
  }
  if (w_dk.judged > 0) {
    out.push_back(MakeVerdict("dk", "|Σ_j dK_j - predicted| ≤ rounding bound", w_dk,
                              label + "dk-sum: Σ_j dK_j = scale Σ_i q_i Σ_j c_ij dS_ij", repro));
  }
  if (w_dv.judged > 0) {
    out.push_back(MakeVerdict("dv", "|Σ_j dV_j - Σ_i (Σ_j P_ij) dO_i| ≤ rounding bound", w_dv,
                              label + "dv-sum: Σ_j dV_j = Σ_i dO_i over non-empty rows", repro));
  }
}

// ---- The constant-V probe ----
void Probe(Kernel& kernel, const Problem& p, const CaseInputs& in, const Recipe& recipe,
           const RoundingModel& rd, const std::string& repro, std::vector<Verdict>& out) {
  const Tensor vc = ConstantV(p, in.v);
  auto fail = [&](const std::string& msg) {
    Verdict v;
    v.check = std::string(kCheck);
    v.policy = "kernel must run";
    v.margin = std::numeric_limits<double>::infinity();
    v.message = "constant-V probe: " + msg;
    v.repro = repro;
    out.push_back(v);
  };
  auto answer = RunKernel(kernel, p, in.q, in.k, vc, in.dout, in.sink);
  if (std::holds_alternative<Unsupported>(answer)) return;
  if (auto* e = std::get_if<Error>(&answer)) {
    Verdict v = KernelError(kernel, std::string(kCheck) + ", constant-V probe", e->message);
    v.repro = repro;
    out.push_back(v);
    return;
  }
  Expected<Operands> ops = OperandsOf(recipe, in.q, in.k, vc, in.dout);
  if (!ops.ok()) return fail(ops.error().message);
  const KernelRun& run = std::get<KernelRun>(answer);
  // The recipe's operands of the probe: a block scheme along the sequence keeps a constant
  // column constant except where a block spans two sequences of a packed batch, so dP is
  // taken per key (dP_ij = dO_b,i · v_b,j) rather than assumed constant.
  const Tensor weights_lse = WeightsLse(p, *ops, run);
  const ProbeArrays a{.q = ops->qs.span<const double>().data(),
                      .k = ops->ks.span<const double>().data(),
                      .kq = ops->kq.span<const double>().data(),
                      .qk = ops->qk.span<const double>().data(),
                      .dop = ops->dop.span<const double>().data(),
                      .vp = ops->vp.span<const double>().data(),
                      .dout = ops->dout.span<const double>().data(),
                      .o = run.o.span<const double>().data(),
                      .lse = weights_lse.span<const double>().data(),
                      .dq = run.dq.span<const double>().data(),
                      .dk = run.dk.span<const double>().data()};
  const int64_t D = p.head_dim, G = p.gqa_ratio();
  Worst w_dq, w_dk;
  RowWeights w;
  // A block-scaled dS: its blocks' amax enters the bounds (BlockDsAmax).
  const bool blocked = rd.blk_ds_dq > 0 || rd.blk_ds_dk > 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView m(p, b);
    const Sequence& s = m.sequence();
    if (s.k_len == 0) continue;
    for (int64_t kvh = 0; kvh < p.heads_kv; ++kvh) {
      const size_t nk = static_cast<size_t>(s.k_len * D);
      std::vector<double> pred_dk(nk, 0), bound_dk(nk, 0);
      DsAmax amax{std::vector<double>(static_cast<size_t>(G * s.k_len), 0.0),
                  std::vector<double>(static_cast<size_t>(G * s.q_len), 0.0)};
      if (blocked) BlockDsAmax(p, a, m, kvh, w, amax);
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        for (int64_t i = 0; i < s.q_len; ++i) {
          ProbeRow(p, a, rd, m, kvh, h, i, amax, w, pred_dk, bound_dk, w_dq);
        }
      }
      JudgeProbeDk(p, a, rd, s, kvh, pred_dk, bound_dk, w_dk);
    }
  }
  const std::string what =
      "constant-V probe (v_j = v_first, exact gradient 0; predicted P·(dP - dO·O))";
  if (w_dq.judged > 0) {
    out.push_back(MakeVerdict("dq", "probe: |dq - predicted| ≤ rounding bound", w_dq, what, repro));
  }
  if (w_dk.judged > 0) {
    out.push_back(MakeVerdict("dk", "probe: |dk - predicted| ≤ rounding bound", w_dk, what, repro));
  }
}

}  // namespace attest::consistency_detail
