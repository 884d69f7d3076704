// The recipe reference (see baseline.h): a recipe's quantised operands and rounding points
// applied to a float64 attention, outputs rounded once. Compiled, as baseline.cc, without FMA
// contraction (verify/CMakeLists.txt).
#include "verify/tolerance/baseline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"

namespace attest {

Expected<Tensor> QuantizeForRecipe(const Tensor& t, const OperandQuant& quant) {
  if (quant.scheme.kind == OperandKind::kNone) return t;
  const Tensor c = ToF64(t);
  const auto span = c.span<const double>();
  std::vector<float> f(span.begin(), span.end());
  const int64_t axis =
      quant.axis == QuantAxis::kSequence ? (c.rank() == 4 ? 1 : 0) : c.rank() - 1;
  Expected<std::vector<float>> r = QuantizeOperand(f, c.shape(), axis, quant.scheme);
  if (!r.ok()) return r.error();
  return Tensor::FromF64(c.shape(), std::vector<double>(r->begin(), r->end()));
}

namespace {

// Rounds a row-major [rows, cols] matrix of one (batch, head) by `quant` (element schemes
// elementwise, block schemes along cols for kSequence-of-keys operands (axis 1) or rows).
Status RoundMatrix(std::vector<double>& m, int64_t rows, int64_t cols, const OperandQuant& quant,
                   int64_t axis) {
  if (quant.scheme.kind == OperandKind::kNone) return Status::Ok();
  if (quant.scheme.kind == OperandKind::kElement) {
    for (double& x : m) x = RoundElement(static_cast<float>(x), quant.scheme);
    return Status::Ok();
  }
  std::vector<float> f(m.begin(), m.end());
  Expected<std::vector<float>> r = QuantizeOperand(f, Shape{rows, cols}, axis, quant.scheme);
  if (!r.ok()) return r.error();
  for (size_t x = 0; x < m.size(); ++x) m[x] = (*r)[x];
  return Status::Ok();
}

double RoundOut(double x, Format f) { return f == Format::kF64 ? x : RoundTo(x, f); }
// An output rounding at a power-of-two pre-scale (recipe.h OutputRounding): exact scaling,
// saturating at the format's largest finite value, in the scheme's rounding direction.
double RoundOut(double x, const OperandScheme& s) {
  if (s.pre_scale == 1.0 && s.overflow == Overflow::kDefault &&
      s.rounding == Rounding::kNearestEven) {
    return RoundOut(x, s.element);
  }
  if (s.element == Format::kF64) return x;
  EncodeOptions options;
  options.overflow = s.overflow;
  options.rounding = s.rounding;  // a declared directed rounding (recipe.h)
  return RoundTo(x * s.pre_scale, s.element, options) / s.pre_scale;
}

// The operands of a recipe reference, each quantised as the recipe's GEMM reads it (forward
// operands, then the backward's own copies; see baseline.h).
struct RecipeOperands {
  Tensor q_s, k_s, v_o;                      // Q·Kᵀ's Q and K, P·V's V
  Tensor do_p, v_p, do_v, k_q, q_k, do_raw;  // backward only
};

Expected<RecipeOperands> QuantizeOperands(const Recipe& r, const Tensor& q_in,
                                          const Tensor& k_in, const Tensor& v_in,
                                          const Tensor* dout_in) {
  const bool backward = dout_in != nullptr;
  const auto quantized = [&](const Tensor& t, const OperandQuant& qu,
                             const char* what) -> Expected<Tensor> {
    Expected<Tensor> x = QuantizeForRecipe(t, qu);
    if (!x.ok()) {
      return Error{fmt::format("recipe reference {}: operand {}: {}", r.name, what,
                               x.error().message)};
    }
    return x;
  };
  // Forward operands, then the backward's own copies.
  auto q_s = quantized(q_in, r.qk.a, "Q of Q.K^T");
  auto k_s = quantized(k_in, r.qk.b, "K of Q.K^T");
  auto v_o = quantized(v_in, r.pv.b, "V of P.V");
  if (!q_s.ok()) return q_s.error();
  if (!k_s.ok()) return k_s.error();
  if (!v_o.ok()) return v_o.error();
  RecipeOperands ops;
  if (backward) {
    auto a = quantized(*dout_in, r.dov.a, "dO of dO.V^T");
    auto b = quantized(v_in, r.dov.b, "V of dO.V^T");
    auto c = quantized(*dout_in, r.pdo.b, "dO of P^T.dO");
    auto d = quantized(k_in, r.dsk.b, "K of dS.K");
    auto e = quantized(q_in, r.dsq.b, "Q of dS^T.Q");
    for (auto* x : {&a, &b, &c, &d, &e}) {
      if (!x->ok()) return x->error();
    }
    ops.do_p = std::move(*a);
    ops.v_p = std::move(*b);
    ops.do_v = std::move(*c);
    ops.k_q = std::move(*d);
    ops.q_k = std::move(*e);
    ops.do_raw = ToF64(*dout_in);
  }
  ops.q_s = std::move(*q_s);
  ops.k_s = std::move(*k_s);
  ops.v_o = std::move(*v_o);
  return ops;
}

// The buffers of one sequence (batch entry) of a recipe run: scores s and their softcap
// derivative c, visibility, probabilities, dS (as dS·K and dSᵀ·Q read it), the unrounded o
// rows and the rows' sums of exp.
struct RecipeSeq {
  RecipeSeq(const MaskView& mask, int64_t b, int64_t Dv)
      : mask(mask), b(b), seq(mask.sequence()), nq(seq.q_len), nk(seq.k_len) {
    s.resize(static_cast<size_t>(nq * nk));
    c.assign(static_cast<size_t>(nq * nk), 1.0);
    TileVisibility(mask, 0, nq, 0, nk, vis);  // the same for every head
    o_raw.resize(static_cast<size_t>(nq * Dv));
  }

  const MaskView& mask;
  const int64_t b;
  const Sequence seq;
  const int64_t nq, nk;
  std::vector<double> s, c;
  std::vector<uint8_t> vis;
  std::vector<double> pmat, ds_k, ds_q, o_raw;
  std::vector<double> rowsum;
};

// One run of the recipe reference (RunRecipe below checks its arguments and quantises the
// operands first): the outputs, accumulated in float64 and rounded once at the end; Compute
// walks (batch, query head).
class RecipeRun {
 public:
  RecipeRun(const Problem& p, const Recipe& r, RecipeOperands ops, bool backward,
            const Tensor* sink, const Tensor* rel_bias)
      : p_(p),
        r_(r),
        ops_(std::move(ops)),
        backward_(backward),
        in_f_(FormatOf(p.dtype).value_or(Format::kF32)),
        out_f_(OutputRoundingOf(r, in_f_)),
        grad_f_{GradientRoundingOf(r, in_f_, 0), GradientRoundingOf(r, in_f_, 1),
                GradientRoundingOf(r, in_f_, 2)},
        H_(p.heads_q),
        Hk_(p.heads_kv),
        D_(p.head_dim),
        Dv_(p.head_dim_v),
        scale_(p.EffectiveScale()),
        qs_(ops_.q_s.data<double>()),
        ks_(ops_.k_s.data<double>()),
        vo_(ops_.v_o.data<double>()) {
    o_.assign(static_cast<size_t>(p.TotalQ() * H_ * Dv_), 0.0);
    lse_.assign(static_cast<size_t>(p.TotalQ() * H_), kNegInf);
    if (backward_) {
      dq_.assign(static_cast<size_t>(p.TotalQ() * H_ * D_), 0.0);
      dk_.assign(static_cast<size_t>(p.TotalK() * Hk_ * D_), 0.0);
      dv_.assign(static_cast<size_t>(p.TotalK() * Hk_ * Dv_), 0.0);
    }
    if (sink != nullptr) {
      const Tensor w = ToF64(*sink);
      const auto span = w.span<const double>();
      sink_.assign(span.begin(), span.end());
      if (backward_) dsink_.assign(static_cast<size_t>(H_), 0.0);
    }
    if (rel_bias != nullptr) {
      const Tensor w = ToF64(*rel_bias);
      const auto span = w.span<const double>();
      rb_.assign(span.begin(), span.end());
      if (backward_) drel_.assign(rb_.size(), 0.0);
    }
  }

  Expected<BaselineOut> Compute();

 private:
  static constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  int64_t QI(int64_t t, int64_t h) const { return (t * H_ + h) * D_; }
  int64_t KI(int64_t t, int64_t h) const { return (t * Hk_ + h) * D_; }
  int64_t VI(int64_t t, int64_t h) const { return (t * Hk_ + h) * Dv_; }
  int64_t OI(int64_t t, int64_t h) const { return (t * H_ + h) * Dv_; }
  // Head h's sink (-inf without one: it adds nothing).
  double Sink(int64_t h) const { return sink_.empty() ? kNegInf : sink_[static_cast<size_t>(h)]; }
  int64_t LI(const RecipeSeq& S, int64_t h, int64_t i) const {
    return p_.varlen() ? h * p_.TotalQ() + S.seq.q_begin + i : (S.b * H_ + h) * p_.seqlen_q + i;
  }

  void Scores(RecipeSeq& S, int64_t h, int64_t hk);
  Status Forward(RecipeSeq& S, int64_t h, int64_t hk);
  Status Backward(RecipeSeq& S, int64_t h, int64_t hk);
  void BackwardProbabilities(RecipeSeq& S, int64_t h, int64_t hk);
  void AccumulateGradients(RecipeSeq& S, int64_t h, int64_t hk);
  BaselineOut Finish();

  const Problem& p_;
  const Recipe& r_;
  RecipeOperands ops_;
  const bool backward_;
  const Format in_f_;
  const OperandScheme out_f_;
  const OperandScheme grad_f_[3];
  const int64_t H_, Hk_, D_, Dv_;
  const double scale_;
  const double* qs_;
  const double* ks_;
  const double* vo_;

  std::vector<double> o_;
  std::vector<double> lse_;
  std::vector<double> dq_, dk_, dv_;
  std::vector<double> sink_, dsink_;  // [Hq], empty without a sink
  std::vector<double> rb_, drel_;     // [Hq, W], empty without a relative bias
  // Element (h, sequence-local i, j) of rb_ / drel_ (docs/semantics.md).
  size_t RelIndex(int64_t h, int64_t i, int64_t j) const {
    return static_cast<size_t>(h * p_.RelBiasWidth() + p_.seqlen_k - 1 + i - j);
  }
};

Expected<BaselineOut> RecipeRun::Compute() {
  for (int64_t b = 0; b < p_.batch; ++b) {
    const MaskView mask(p_, b);
    if (mask.sequence().q_len == 0) continue;
    RecipeSeq S(mask, b, Dv_);
    for (int64_t h = 0; h < H_; ++h) {
      const int64_t hk = p_.KvHead(h);
      Scores(S, h, hk);
      if (Status st = Forward(S, h, hk); !st.ok()) return st.error();
      if (!backward_) continue;
      if (Status st = Backward(S, h, hk); !st.ok()) return st.error();
    }
  }
  return Finish();
}

// Scores from the quantised Q·Kᵀ operands.
void RecipeRun::Scores(RecipeSeq& S, int64_t h, int64_t hk) {
  const double slope = p_.alibi_slopes ? (*p_.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
  const int64_t nq = S.nq, nk = S.nk;
  for (int64_t i = 0; i < nq; ++i) {
    const double* qr = qs_ + QI(S.seq.q_begin + i, h);
    for (int64_t j = 0; j < nk; ++j) {
      const size_t ij = static_cast<size_t>(i * nk + j);
      if (!S.vis[ij]) continue;
      const double* kr = ks_ + KI(S.seq.k_begin + j, hk);
      double dot = 0;
      for (int64_t d = 0; d < D_; ++d) dot += qr[d] * kr[d];
      const double raw = scale_ * dot;
      S.s[ij] = TransformScore(raw, p_.softcap, slope, S.mask.AlibiDistance(i, j));
      if (!rb_.empty()) S.s[ij] += rb_[RelIndex(h, i, j)];  // the relative bias, last
      if (p_.softcap > 0) {
        const double t = std::tanh(raw / p_.softcap);
        S.c[ij] = 1 - t * t;
      }
    }
  }
}

// Forward: P = exp(s - m) rounded by pv.a, o = Σ round(P) v / Σ P.
Status RecipeRun::Forward(RecipeSeq& S, int64_t h, int64_t hk) {
  const int64_t nq = S.nq, nk = S.nk;
  S.pmat.assign(static_cast<size_t>(nq * nk), 0.0);
  S.rowsum.assign(static_cast<size_t>(nq), 0.0);
  for (int64_t i = 0; i < nq; ++i) {
    double m = kNegInf;
    for (int64_t j = 0; j < nk; ++j) {
      if (S.vis[static_cast<size_t>(i * nk + j)]) {
        m = std::max(m, S.s[static_cast<size_t>(i * nk + j)]);
      }
    }
    m = std::max(m, Sink(h));
    if (m == kNegInf) continue;
    double l = 0;
    for (int64_t j = 0; j < nk; ++j) {
      const size_t ij = static_cast<size_t>(i * nk + j);
      if (!S.vis[ij]) continue;
      S.pmat[ij] = std::exp(S.s[ij] - m);
      l += S.pmat[ij];
    }
    if (Sink(h) != kNegInf) l += std::exp(Sink(h) - m);  // a logit with no value
    S.rowsum[static_cast<size_t>(i)] = l;
    lse_[static_cast<size_t>(LI(S, h, i))] = RoundOut(m + std::log(l), r_.lse);
  }
  if (Status st = RoundMatrix(S.pmat, nq, nk, r_.pv.a, 1); !st.ok()) return st.error();
  for (int64_t i = 0; i < nq; ++i) {
    const double l = S.rowsum[static_cast<size_t>(i)];
    double* orow = S.o_raw.data() + i * Dv_;
    std::fill(orow, orow + Dv_, 0.0);
    if (l == 0) continue;
    for (int64_t j = 0; j < nk; ++j) {
      const double pj = S.pmat[static_cast<size_t>(i * nk + j)];
      if (pj == 0) continue;
      const double* vr = vo_ + VI(S.seq.k_begin + j, hk);
      for (int64_t e = 0; e < Dv_; ++e) orow[e] += pj * vr[e];
    }
    for (int64_t e = 0; e < Dv_; ++e) {
      orow[e] /= l;
      o_[static_cast<size_t>(OI(S.seq.q_begin + i, h) + e)] = RoundOut(orow[e], out_f_);
    }
  }
  return Status::Ok();
}

// Backward: normalised P and dS, rounded as their GEMMs read them, then the gradients.
Status RecipeRun::Backward(RecipeSeq& S, int64_t h, int64_t hk) {
  const int64_t nq = S.nq, nk = S.nk;
  BackwardProbabilities(S, h, hk);
  S.ds_q = S.ds_k;
  if (Status st = RoundMatrix(S.pmat, nq, nk, r_.pdo.a, 0); !st.ok()) return st.error();
  if (Status st = RoundMatrix(S.ds_k, nq, nk, r_.dsk.a, 1); !st.ok()) return st.error();
  if (Status st = RoundMatrix(S.ds_q, nq, nk, r_.dsq.a, 0); !st.ok()) return st.error();
  AccumulateGradients(S, h, hk);
  return Status::Ok();
}

// Normalised P from the exact lse of these scores, and dS = P (dP - D) c.
void RecipeRun::BackwardProbabilities(RecipeSeq& S, int64_t h, int64_t hk) {
  const int64_t nq = S.nq, nk = S.nk;
  const double* dop = ops_.do_p.data<double>();
  // D's dO: as given, or as dO·Vᵀ reads it (recipe.h DeltaDo).
  const double* dor =
      r_.delta_do == DeltaDo::kDovOperand ? ops_.do_p.data<double>() : ops_.do_raw.data<double>();
  const double* vp = ops_.v_p.data<double>();
  S.pmat.assign(static_cast<size_t>(nq * nk), 0.0);
  S.ds_k.assign(static_cast<size_t>(nq * nk), 0.0);
  for (int64_t i = 0; i < nq; ++i) {
    const double l = S.rowsum[static_cast<size_t>(i)];
    if (l == 0) continue;
    double m = kNegInf;
    for (int64_t j = 0; j < nk; ++j) {
      if (S.vis[static_cast<size_t>(i * nk + j)]) {
        m = std::max(m, S.s[static_cast<size_t>(i * nk + j)]);
      }
    }
    m = std::max(m, Sink(h));
    const double lse_i = m + std::log(l);
    const int64_t t = S.seq.q_begin + i;
    // D = rowsum(dO∘O) with the O and the dO the recipe names.
    double delta = 0;
    for (int64_t e = 0; e < Dv_; ++e) {
      const double oe = r_.delta == DeltaSource::kRoundedO
                            ? o_[static_cast<size_t>(OI(t, h) + e)]
                            : S.o_raw[static_cast<size_t>(i * Dv_ + e)];
      delta += dor[OI(t, h) + e] * oe;
    }
    if (Sink(h) != kNegInf) dsink_[static_cast<size_t>(h)] -= std::exp(Sink(h) - lse_i) * delta;
    for (int64_t j = 0; j < nk; ++j) {
      const size_t ij = static_cast<size_t>(i * nk + j);
      if (!S.vis[ij]) continue;
      const double pj = std::exp(S.s[ij] - lse_i);
      const double* vr = vp + VI(S.seq.k_begin + j, hk);
      double dp = 0;
      for (int64_t e = 0; e < Dv_; ++e) dp += dop[OI(t, h) + e] * vr[e];
      if (r_.dp) dp = RoundTo(dp, *r_.dp);
      S.pmat[ij] = pj;
      if (!drel_.empty()) drel_[RelIndex(h, i, j)] += pj * (dp - delta);
      S.ds_k[ij] = pj * (dp - delta) * S.c[ij];
    }
  }
}

// dq += dS k, dk += dSᵀ q, dv += Pᵀ dO from the rounded operands, in float64.
void RecipeRun::AccumulateGradients(RecipeSeq& S, int64_t h, int64_t hk) {
  const int64_t nq = S.nq, nk = S.nk;
  const double* dov = ops_.do_v.data<double>();
  const double* kq = ops_.k_q.data<double>();
  const double* qk = ops_.q_k.data<double>();
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t t = S.seq.q_begin + i;
    double* dqr = dq_.data() + QI(t, h);
    for (int64_t j = 0; j < nk; ++j) {
      const size_t ij = static_cast<size_t>(i * nk + j);
      if (!S.vis[ij]) continue;
      const int64_t tk = S.seq.k_begin + j;
      const double* kr = kq + KI(tk, hk);
      const double* qr = qk + QI(t, h);
      const double* gr = dov + OI(t, h);
      double* dkr = dk_.data() + KI(tk, hk);
      double* dvr = dv_.data() + VI(tk, hk);
      const double a = S.ds_k[ij] * scale_, bq = S.ds_q[ij] * scale_, pj = S.pmat[ij];
      for (int64_t d = 0; d < D_; ++d) dqr[d] += a * kr[d];
      for (int64_t d = 0; d < D_; ++d) dkr[d] += bq * qr[d];
      for (int64_t e = 0; e < Dv_; ++e) dvr[e] += pj * gr[e];
    }
  }
}

// The outputs, the gradients rounded once to their formats.
BaselineOut RecipeRun::Finish() {
  BaselineOut out;
  out.o = Tensor::FromF64(p_.OShape(), std::move(o_));
  out.lse = Tensor::FromF64(p_.LseShape(), std::move(lse_));
  if (backward_) {
    for (double& x : dq_) x = RoundOut(x, grad_f_[0]);
    for (double& x : dk_) x = RoundOut(x, grad_f_[1]);
    for (double& x : dv_) x = RoundOut(x, grad_f_[2]);
    out.dq = Tensor::FromF64(p_.QShape(), std::move(dq_));
    out.dk = Tensor::FromF64(p_.KShape(), std::move(dk_));
    out.dv = Tensor::FromF64(p_.VShape(), std::move(dv_));
    if (!sink_.empty()) {
      for (double& x : dsink_) x = RoundOut(x, Format::kF32);
      out.dsink = Tensor::FromF64(Shape{H_}, std::move(dsink_));
    }
    if (!rb_.empty()) {
      for (double& x : drel_) x = RoundOut(x, Format::kF32);
      out.drel_bias = Tensor::FromF64(p_.RelBiasShape(), std::move(drel_));
    }
  }
  return out;
}

Expected<BaselineOut> RunRecipe(const Problem& p, const Recipe& r, const Tensor& q_in,
                                const Tensor& k_in, const Tensor& v_in, const Tensor* dout_in,
                                const Tensor* sink, const Tensor* rel_bias) {
  if (Status s = Validate(p); !s.ok()) return s.error();
  if (Status s = ValidateInputShapes(p, q_in, k_in, v_in, dout_in); !s.ok()) return s.error();
  if (Status s = ValidateBaselineSink(p, sink); !s.ok()) return s.error();
  if (Status s = ValidateBaselineRelBias(p, rel_bias); !s.ok()) return s.error();
  if (Status s = ValidateRecipe(r); !s.ok()) return s.error();
  auto ops = QuantizeOperands(r, q_in, k_in, v_in, dout_in);
  if (!ops.ok()) return ops.error();
  return RecipeRun(p, r, std::move(*ops), dout_in != nullptr, sink, rel_bias).Compute();
}

}  // namespace

Expected<BaselineOut> RecipeReferenceForward(const Problem& p, const Recipe& recipe,
                                             const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor* sink, const Tensor* rel_bias) {
  return RunRecipe(p, recipe, q, k, v, nullptr, sink, rel_bias);
}

Expected<BaselineOut> RecipeReferenceBackward(const Problem& p, const Recipe& recipe,
                                              const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& dout, const Tensor* sink,
                                              const Tensor* rel_bias) {
  return RunRecipe(p, recipe, q, k, v, &dout, sink, rel_bias);
}

}  // namespace attest
