// Tests of verify/tolerance/term_scale.h against the definitions: the tiled dgemm computation
// of the term magnitudes against a naive loop over every mask / score feature, the Sk = 1 case
// whose exact dq, dk vanish while the terms do not, the rounding floors' tiled computation
// against their definition on the same features, and the bits of both whatever the thread
// count. The floors in use are tested in terms_floor_test.cc and rounding_floor_test.cc.
#include "verify/tolerance/term_scale.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "reference/case/inputs.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/problem/mask.h"
#include "reference/recipes/recipe.h"
#include "verify/tolerance/term_scale_test_util.h"

namespace attest {
namespace {

using term_scale_test::Base;
using term_scale_test::Computed;
using term_scale_test::RunCase;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The definition, one element at a time: dq_terms = |scale| max_d sum_j A_ij |k_jd|,
// dk_terms = |scale| max_d sum_{h, i} A_ij |q_id|, A = P (|dP| + |D|).
GradientTermScales Naive(const Problem& p, const CaseInputs& in, const BackwardOut& ref) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const double* Q = in.q.data<double>();
  const double* K = in.k.data<double>();
  const double* V = in.v.data<double>();
  const double* DO = in.dout.data<double>();
  std::vector<double> dq_sum(static_cast<size_t>(p.TotalQ() * hq * d), 0.0);
  std::vector<double> dk_sum(static_cast<size_t>(p.TotalK() * hkv * d), 0.0);
  const double scale = p.EffectiveScale();
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence seq = SequenceOf(p, b);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t lse_at = p.varlen() ? h * p.TotalQ() + seq.q_begin + i
                                          : (b * hq + h) * p.seqlen_q + i;
        const double lse = ref.lse.data<double>()[lse_at];
        if (lse == kNegInf) continue;
        const int64_t qi = (seq.q_begin + i) * hq + h;
        // W_ij = sum |dO||v| and P_ij, then Dabs_i = sum_j P_ij W_ij (term_scale.h).
        std::vector<double> w(static_cast<size_t>(seq.k_len), 0.0), prob(w.size(), 0.0);
        double dabs = 0;
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (!mask.Visible(i, j)) continue;
          const int64_t kj = (seq.k_begin + j) * hkv + g;
          double dot = 0, wv = 0;
          for (int64_t c = 0; c < d; ++c) dot += Q[qi * d + c] * K[kj * d + c];
          for (int64_t c = 0; c < dv; ++c) wv += std::fabs(DO[qi * dv + c] * V[kj * dv + c]);
          const double s = TransformScore(scale * dot, p.softcap, slope, mask.AlibiDistance(i, j));
          prob[static_cast<size_t>(j)] = std::exp(s - lse);
          w[static_cast<size_t>(j)] = wv;
          dabs += prob[static_cast<size_t>(j)] * wv;
        }
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (!mask.Visible(i, j)) continue;
          const int64_t kj = (seq.k_begin + j) * hkv + g;
          const double a = prob[static_cast<size_t>(j)] * (w[static_cast<size_t>(j)] + dabs);
          for (int64_t c = 0; c < d; ++c) {
            dq_sum[static_cast<size_t>(qi * d + c)] += a * std::fabs(K[kj * d + c]);
            dk_sum[static_cast<size_t>(kj * d + c)] += a * std::fabs(Q[qi * d + c]);
          }
        }
      }
    }
  }
  GradientTermScales out;
  out.dq = Tensor::Zeros(DType::kF64, {p.TotalQ(), hq});
  out.dk = Tensor::Zeros(DType::kF64, {p.TotalK(), hkv});
  for (int64_t r = 0; r < p.TotalQ() * hq; ++r) {
    const auto* row = dq_sum.data() + r * d;
    out.dq.data<double>()[r] = dv * std::fabs(scale) * *std::max_element(row, row + d);
  }
  for (int64_t r = 0; r < p.TotalK() * hkv; ++r) {
    const auto* row = dk_sum.data() + r * d;
    out.dk.data<double>()[r] = dv * std::fabs(scale) * *std::max_element(row, row + d);
  }
  return out;
}

// The rounding floors by their definition (term_scale.h), one element at a time, for the
// bf16 recipe's points plus an f16 dP (every kind of rounding point acts).
RoundingPoints TestPoints() {
  RoundingPoints pts = RoundingPointsOf(*FindRecipe("bf16"), DType::kBF16, Format::kF16);
  EXPECT_TRUE(pts.p_pv && pts.p_pdo && pts.ds_dq && pts.ds_dk && pts.dp && pts.delta_o);
  return pts;
}

double ErrBound(const std::optional<RoundingPoint>& r, double x) {
  if (!r) return 0;
  const FormatSpec& spec = Spec(r->format);
  return std::ldexp(1.0, -(spec.mantissa_bits + 1)) * std::fabs(x) +
         0.5 * std::ldexp(1.0, spec.min_normal_exponent() - spec.mantissa_bits) / r->pre_scale;
}

RoundingFloors NaiveFloors(const Problem& p, const RoundingPoints& pts, const CaseInputs& in,
                           const BackwardOut& ref) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const double* Q = in.q.data<double>();
  const double* K = in.k.data<double>();
  const double* V = in.v.data<double>();
  const double* DO = in.dout.data<double>();
  const double* O = ref.o.data<double>();
  const double scale = p.EffectiveScale();
  const double sig = kRoundingSigmas;
  std::vector<double> o1(static_cast<size_t>(p.TotalQ() * hq * dv), 0), o2(o1.size(), 0);
  std::vector<double> q1(static_cast<size_t>(p.TotalQ() * hq * d), 0), q2(q1.size(), 0),
      qc(q1.size(), 0), qdd(q1.size(), 0);
  std::vector<double> k1(static_cast<size_t>(p.TotalK() * hkv * d), 0), k2(k1.size(), 0);
  std::vector<double> v1(static_cast<size_t>(p.TotalK() * hkv * dv), 0), v2(v1.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence seq = SequenceOf(p, b);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t lse_at = p.varlen() ? h * p.TotalQ() + seq.q_begin + i
                                          : (b * hq + h) * p.seqlen_q + i;
        const double lse = ref.lse.data<double>()[lse_at];
        if (lse == kNegInf) continue;
        const double delta = ref.delta.data<double>()[lse_at];
        const int64_t qi = (seq.q_begin + i) * hq + h;
        double a1 = 0, a2 = 0;
        for (int64_t c = 0; c < dv; ++c) {
          const double a = ErrBound(RoundingPoint{*pts.delta_o, 1.0}, O[qi * dv + c]) *
                           std::fabs(DO[qi * dv + c]);
          a1 += a;
          a2 += a * a;
        }
        const double dd = std::min(a1, sig * std::sqrt(a2));
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (!mask.Visible(i, j)) continue;
          const int64_t kj = (seq.k_begin + j) * hkv + g;
          double dot = 0, dp = 0;
          for (int64_t c = 0; c < d; ++c) dot += Q[qi * d + c] * K[kj * d + c];
          for (int64_t c = 0; c < dv; ++c) dp += DO[qi * dv + c] * V[kj * dv + c];
          const double raw = scale * dot;
          const double sc = TransformScore(raw, p.softcap, slope, mask.AlibiDistance(i, j));
          const double tp = p.softcap > 0 ? 1 - std::pow(std::tanh(raw / p.softcap), 2) : 1.0;
          const double prob = std::exp(sc - lse);
          const double ds = prob * (dp - delta) * tp;
          for (int64_t c = 0; c < dv; ++c) {
            const double bo = ErrBound(pts.p_pv, prob) * std::fabs(V[kj * dv + c]);
            o1[static_cast<size_t>(qi * dv + c)] += bo;
            o2[static_cast<size_t>(qi * dv + c)] += bo * bo;
            const double bv = ErrBound(pts.p_pdo, prob) * std::fabs(DO[qi * dv + c]);
            v1[static_cast<size_t>(kj * dv + c)] += bv;
            v2[static_cast<size_t>(kj * dv + c)] += bv * bv;
          }
          for (int64_t c = 0; c < d; ++c) {
            const double bq = std::fabs(scale) *
                              (ErrBound(pts.ds_dq, ds) + prob * tp * ErrBound(pts.dp, dp)) *
                              std::fabs(K[kj * d + c]);
            q1[static_cast<size_t>(qi * d + c)] += bq;
            q2[static_cast<size_t>(qi * d + c)] += bq * bq;
            qc[static_cast<size_t>(qi * d + c)] +=
                std::fabs(scale) * prob * tp * std::fabs(K[kj * d + c]) * dd;
            const double bk = std::fabs(scale) *
                              (ErrBound(pts.ds_dk, ds) + prob * tp * (ErrBound(pts.dp, dp) + dd)) *
                              std::fabs(Q[qi * d + c]);
            k1[static_cast<size_t>(kj * d + c)] += bk;
            k2[static_cast<size_t>(kj * d + c)] += bk * bk;
          }
        }
      }
    }
  }
  const auto combine = [&](const std::vector<double>& a, const std::vector<double>& a2,
                           const std::vector<double>* extra, const Shape& shape) {
    Tensor t = Tensor::Zeros(DType::kF64, shape);
    for (size_t e = 0; e < a.size(); ++e) {
      t.data<double>()[e] = std::min(a[e], sig * std::sqrt(a2[e])) + (extra ? (*extra)[e] : 0);
    }
    return t;
  };
  return {combine(o1, o2, nullptr, p.OShape()), combine(q1, q2, &qc, p.QShape()),
          combine(k1, k2, nullptr, p.KShape()), combine(v1, v2, nullptr, p.VShape())};
}

void ExpectFloorsMatchNaive(const Problem& p, const Computed& c) {
  const RoundingPoints pts = TestPoints();
  auto got = ComputeRoundingFloors(p, pts, c.in.q, c.in.k, c.in.v, c.in.dout, c.ref.lse,
                                   c.ref.o, c.ref.delta);
  ASSERT_TRUE(got.ok()) << got.error().message;
  const RoundingFloors want = NaiveFloors(p, pts, c.in, c.ref);
  for (const auto& [g_t, w_t, name] :
       {std::tuple{&got->o, &want.o, "o"}, std::tuple{&got->dq, &want.dq, "dq"},
        std::tuple{&got->dk, &want.dk, "dk"}, std::tuple{&got->dv, &want.dv, "dv"}}) {
    ASSERT_EQ(g_t->shape(), w_t->shape()) << name;
    const auto g = g_t->span<const double>();
    const auto w = w_t->span<const double>();
    int64_t nonzero = 0;
    for (size_t e = 0; e < g.size(); ++e) {
      EXPECT_NEAR(g[e], w[e], 1e-10 * std::fabs(w[e]) + 1e-300) << "floor " << name << " " << e;
      if (w[e] == 0) EXPECT_EQ(g[e], 0.0) << "floor " << name << " " << e << " sees nothing";
      nonzero += w[e] != 0;
    }
    EXPECT_GT(nonzero, 0) << "floor " << name;
  }
  // Forward only: the same o floor.
  auto fwd = ComputeRoundingFloors(p, pts, c.in.q, c.in.k, c.in.v, Tensor(), c.ref.lse,
                                   Tensor(), Tensor());
  ASSERT_TRUE(fwd.ok()) << fwd.error().message;
  EXPECT_FALSE(fwd->dq.defined());
  const auto fo = fwd->o.span<const double>();
  const auto go = got->o.span<const double>();
  for (size_t e = 0; e < fo.size(); ++e) ASSERT_EQ(fo[e], go[e]) << "forward-only o " << e;
  // Sampled forward (query_rows): the flagged rows' o floors, gathered, bitwise the whole
  // run's, whatever rows share their tiles; 0 elsewhere, where the lse may be NaN (as a
  // sampled oracle leaves it).
  std::vector<uint8_t> flags(static_cast<size_t>(p.TotalQ()));
  for (size_t t = 0; t < flags.size(); ++t) flags[t] = t % 3 == 0 || t % 7 == 5;
  Tensor lse_nan = ToF64(c.ref.lse).Clone();
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = SequenceOf(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < seq.q_len; ++i) {
        if (flags[static_cast<size_t>(seq.q_begin + i)]) continue;
        const int64_t at = p.varlen() ? h * p.TotalQ() + seq.q_begin + i
                                      : (b * p.heads_q + h) * p.seqlen_q + i;
        lse_nan.data<double>()[at] = std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  auto sampled = ComputeRoundingFloors(p, pts, c.in.q, c.in.k, c.in.v, Tensor(), lse_nan,
                                       Tensor(), Tensor(), &flags);
  ASSERT_TRUE(sampled.ok()) << sampled.error().message;
  const auto so = sampled->o.span<const double>();
  const int64_t per_row = p.heads_q * p.head_dim_v;
  for (size_t e = 0; e < so.size(); ++e) {
    const bool flagged = flags[e / static_cast<size_t>(per_row)] != 0;
    ASSERT_EQ(so[e], flagged ? fo[e] : 0.0) << "sampled o " << e << (flagged ? " (flagged)" : "");
  }
  std::vector<uint8_t> short_flags(flags.size() - 1, 1);
  auto refused = ComputeRoundingFloors(p, pts, c.in.q, c.in.k, c.in.v, Tensor(), c.ref.lse,
                                       Tensor(), Tensor(), &short_flags);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("query_rows"), std::string::npos);
}

void ExpectMatchesNaive(const Problem& p, const char* what) {
  SCOPED_TRACE(what);
  const Computed c = RunCase(p);
  ExpectFloorsMatchNaive(p, c);
  const GradientTermScales naive = Naive(p, c.in, c.ref);
  for (const auto& [got, want, name] :
       {std::tuple{&c.terms.dq, &naive.dq, "dq"}, std::tuple{&c.terms.dk, &naive.dk, "dk"}}) {
    ASSERT_EQ(got->shape(), want->shape()) << name;
    const auto g = got->span<const double>();
    const auto w = want->span<const double>();
    int64_t nonzero = 0;
    for (size_t r = 0; r < g.size(); ++r) {
      EXPECT_NEAR(g[r], w[r], 1e-12 * std::max(1.0, std::fabs(w[r]))) << name << " row " << r;
      if (w[r] == 0) {
        EXPECT_EQ(g[r], 0.0) << name << " row " << r << " sees nothing: terms must be exactly 0";
      }
      nonzero += w[r] != 0;
    }
    EXPECT_GT(nonzero, 0) << name << ": a test of all-zero terms proves nothing";
  }
  // Terms bound the result: |dq_id| <= sum_j |dS_ij| |k_jd| <= terms (up to the oracle's
  // rounding), row by row.
  const double* dq = c.ref.dq.data<double>();
  for (int64_t r = 0; r < p.TotalQ() * p.heads_q; ++r) {
    for (int64_t x = 0; x < p.head_dim; ++x) {
      EXPECT_LE(std::fabs(dq[r * p.head_dim + x]), c.terms.dq.data<double>()[r] * (1 + 1e-12));
    }
  }
  const double* dk = c.ref.dk.data<double>();
  for (int64_t r = 0; r < p.TotalK() * p.heads_kv; ++r) {
    for (int64_t x = 0; x < p.head_dim; ++x) {
      EXPECT_LE(std::fabs(dk[r * p.head_dim + x]), c.terms.dk.data<double>()[r] * (1 + 1e-12));
    }
  }
}


void ExpectSameBits(std::initializer_list<std::pair<const Tensor*, const Tensor*>> pairs,
                    const std::string& what) {
  int n = 0;
  for (const auto& [x, y] : pairs) {
    ASSERT_EQ(x->defined(), y->defined()) << what << " tensor " << n;
    if (x->defined()) {
      const auto u = x->span<const double>(), v = y->span<const double>();
      ASSERT_EQ(u.size(), v.size()) << what << " tensor " << n;
      ASSERT_EQ(std::memcmp(u.data(), v.data(), u.size() * sizeof(double)), 0)
          << what << " tensor " << n;
    }
    ++n;
  }
}

TEST(TermsAndFloors, ThreadCountDoesNotChangeTheBits) {
  // A query tile's key tiles run in parallel waves; the sums over keys are added in tile order
  // after each wave. Several query and key tiles (128 x 128), every mask feature, packed
  // sequences, a few rows against many keys; the family quantities too.
  std::vector<Problem> ps;
  Problem p = Base();
  p.seqlen_q = 300;
  p.seqlen_k = 700;
  p.causal = true;
  ps.push_back(p);
  p.causal = false;
  p.window_left = 90;
  p.window_right = 200;
  p.softcap = 3.0;
  p.alibi_slopes = std::vector<double>(static_cast<size_t>(p.heads_q), 0.125);
  ps.push_back(p);
  Problem packed = Base();
  packed.batch = 3;
  packed.seqlen_q = 200;
  packed.seqlen_k = 400;
  packed.causal = true;
  packed.cu_seqlens_q = std::vector<int32_t>{0, 100, 101, 290};
  packed.cu_seqlens_k = std::vector<int32_t>{0, 300, 301, 700};
  ps.push_back(packed);
  Problem few = Base();
  few.seqlen_q = 3;
  few.seqlen_k = 2000;
  ps.push_back(few);
  const RoundingPoints pts = TestPoints();
  const QuantisedScoreModel model{.rel = 0.0625, .abs = 1e-3};
  for (size_t n = 0; n < ps.size(); ++n) {
    const Problem& q = ps[n];
    const std::string what = "problem " + std::to_string(n);
    const Computed c = RunCase(q, 100 + n);
    std::vector<uint8_t> flags(static_cast<size_t>(q.TotalQ()));
    for (size_t t = 0; t < flags.size(); ++t) flags[t] = t % 3 == 0 || t % 7 == 5;
    std::vector<RoundingFloors> full, fwd, sampled;
    std::vector<GradientTermScales> terms, family, family_fwd;
    for (int threads : {1, 3}) {
      auto f = ComputeRoundingFloors(q, pts, c.in.q, c.in.k, c.in.v, c.in.dout, c.ref.lse,
                                     c.ref.o, c.ref.delta, nullptr, threads);
      auto g = ComputeRoundingFloors(q, pts, c.in.q, c.in.k, c.in.v, Tensor(), c.ref.lse,
                                     Tensor(), Tensor(), nullptr, threads);
      auto s = ComputeRoundingFloors(q, pts, c.in.q, c.in.k, c.in.v, Tensor(), c.ref.lse,
                                     Tensor(), Tensor(), &flags, threads);
      auto t = ComputeGradientTermScales(q, c.in.q, c.in.k, c.in.v, c.in.dout, c.ref.lse,
                                         threads);
      auto m = ComputeGradientTermScales(q, c.in.q, c.in.k, c.in.v, c.in.dout, c.ref.lse,
                                         &model, threads);
      auto mf = ComputeGradientTermScales(q, c.in.q, c.in.k, c.in.v, Tensor(), c.ref.lse,
                                          &model, threads);
      ASSERT_TRUE(f.ok() && g.ok() && s.ok() && t.ok() && m.ok() && mf.ok()) << what;
      full.push_back(*f);
      fwd.push_back(*g);
      sampled.push_back(*s);
      terms.push_back(*t);
      family.push_back(*m);
      family_fwd.push_back(*mf);
    }
    ExpectSameBits({{&full[0].o, &full[1].o}, {&full[0].dq, &full[1].dq},
                    {&full[0].dk, &full[1].dk}, {&full[0].dv, &full[1].dv},
                    {&fwd[0].o, &fwd[1].o}, {&sampled[0].o, &sampled[1].o}},
                   what + " floors");
    ExpectSameBits({{&terms[0].dq, &terms[1].dq}, {&terms[0].dk, &terms[1].dk}},
                   what + " terms");
    ExpectSameBits({{&family[0].dq, &family[1].dq}, {&family[0].dk, &family[1].dk},
                    {&family[0].score_error, &family[1].score_error},
                    {&family[0].o, &family[1].o}, {&family[0].dv, &family[1].dv},
                    {&family_fwd[0].score_error, &family_fwd[1].score_error},
                    {&family_fwd[0].o, &family_fwd[1].o}},
                   what + " family terms");
  }
}

TEST(GradientTermScales, MatchesNaiveLoopOnEveryFeature) {
  ExpectMatchesNaive(Base(), "dense GQA, D != Dv");
  {
    Problem p = Base();
    p.causal = true;  // bottom-right, Sq < Sk
    ExpectMatchesNaive(p, "causal bottom-right");
    p.seqlen_q = 300;
    p.seqlen_k = 70;  // rows 0..229 see nothing: empty rows
    ExpectMatchesNaive(p, "causal with empty rows");
    p.causal_align = CausalAlign::kTopLeft;
    ExpectMatchesNaive(p, "causal top-left");
  }
  {
    Problem p = Base();
    p.window_left = 20;
    p.window_right = 5;
    p.softcap = 3.0;
    p.scale = 0.4;  // not 1/sqrt(D)
    ExpectMatchesNaive(p, "window + softcap + explicit scale");
  }
  {
    Problem p = Base();
    p.alibi_slopes = std::vector<double>{0.5, 0.25, 0.125, 0.0625};
    p.causal = true;
    p.prefix_lm = 9;
    ExpectMatchesNaive(p, "alibi + prefix-lm");
  }
  {
    Problem p = Base();
    p.heads_kv = 1;  // all four query heads feed one kv head's dk
    p.document_ids_q = std::vector<std::vector<int32_t>>(2, std::vector<int32_t>(70));
    p.document_ids_k = std::vector<std::vector<int32_t>>(2, std::vector<int32_t>(300));
    for (auto& row : *p.document_ids_q) {
      for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<int32_t>(i / 30);
    }
    for (auto& row : *p.document_ids_k) {
      for (size_t j = 0; j < row.size(); ++j) row[j] = static_cast<int32_t>(j / 90);
    }
    ExpectMatchesNaive(p, "documents, MQA");
  }
  {
    Problem p = Base();
    p.block_sparse = BlockSparse{16, 64, {{0, 0}, {1, 2}, {3, 4}, {4, 1}}};
    ExpectMatchesNaive(p, "block-sparse (queries of unlisted blocks see nothing)");
  }
  {
    Problem p = Base();
    p.batch = 3;
    p.cu_seqlens_q = std::vector<int32_t>{0, 5, 75, 80};
    p.cu_seqlens_k = std::vector<int32_t>{0, 260, 270, 530};
    p.seqlen_q = 70;
    p.seqlen_k = 260;
    p.causal = true;
    ExpectMatchesNaive(p, "varlen causal");
  }
}

// One key: P = 1, dP_i = dO_i . v = D_i, so the exact dq and dk are 0 while the terms are
// |scale| 2 |D_i| max_d |k_d| (dq) and the same with |q| summed over queries and heads (dk).
TEST(GradientTermScales, SingleKeyCancelsExactlyButTermsDoNot) {
  Problem p;
  p.batch = 1;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = 129;
  p.seqlen_k = 1;
  p.head_dim = 64;
  p.head_dim_v = 64;
  const Computed c = RunCase(p, 2026);
  for (double x : c.ref.dq.span<const double>()) ASSERT_EQ(x, 0.0);
  for (double x : c.ref.dk.span<const double>()) ASSERT_EQ(x, 0.0);
  const double* K = c.in.k.data<double>();
  double kmax = 0;
  for (int64_t x = 0; x < 64; ++x) kmax = std::max(kmax, std::fabs(K[x]));
  const double scale = p.EffectiveScale();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 129; ++i) {
      // W = sum_d |dO_id v_d| = Dabs (P = 1), times Dv = 64.
      const double* DO = c.in.dout.data<double>();
      const double* V = c.in.v.data<double>();
      double w = 0;
      for (int64_t x = 0; x < 64; ++x) w += std::fabs(DO[(i * 2 + h) * 64 + x] * V[x]);
      const double want = 64 * scale * 2 * w * kmax;
      EXPECT_NEAR(c.terms.dq.data<double>()[i * 2 + h], want, 1e-12 * want);
      EXPECT_GT(want, 0);
    }
  }
  EXPECT_GT(c.terms.dk.data<double>()[0], 0);
}

TEST(GradientTermScales, ErrorsNameTheTensor) {
  Problem p = Base();
  const Computed c = RunCase(p);
  auto bad = ComputeGradientTermScales(p, c.in.q, c.in.k, c.in.v, c.in.dout, c.ref.dq);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("lse"), std::string::npos) << bad.error().message;
  auto no_do = ComputeGradientTermScales(p, c.in.q, c.in.k, c.in.v, Tensor(), c.ref.lse);
  ASSERT_FALSE(no_do.ok());
  EXPECT_NE(no_do.error().message.find("do"), std::string::npos) << no_do.error().message;
}

}  // namespace
}  // namespace attest
