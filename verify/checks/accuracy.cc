// The accuracy check (see accuracy.h): the same comparison as `attest compare`
// (run/compare.cc), run on a kernel's answers instead of a file.
#include "verify/checks/accuracy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "reference/recipes/recipe.h"
#include "verify/tolerance/baseline.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/term_scale.h"

namespace attest {
namespace {

// Sampled cases (verify/metrics/sample.h): whether each element of output `name` (o, lse, dq: query
// rows; dk, dv: key rows) belongs to a sampled row.
std::vector<uint8_t> JudgedElements(const Problem& p, const RowSample& sample,
                                    std::string_view name, const Shape& shape) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  std::vector<uint8_t> out(static_cast<size_t>(n), 0);
  const bool keys = name == "dk" || name == "dv";
  const std::vector<uint8_t>& rows = keys ? sample.key_rows : sample.query_rows;
  const int64_t tq = p.TotalQ();
  for (int64_t e = 0; e < n; ++e) {
    int64_t t = 0;
    if (name == "lse") {
      // [B, Hq, Sq] padded, [Hq, total_q] packed.
      t = p.varlen() ? e % tq : (e / (p.heads_q * p.seqlen_q)) * p.seqlen_q + e % p.seqlen_q;
    } else {
      t = e / (shape[shape.size() - 1] * shape[shape.size() - 2]);  // [..., tokens, H, D]
    }
    out[static_cast<size_t>(e)] = rows[static_cast<size_t>(t)];
  }
  return out;
}

// The token of lse element e (for the empty-row rule).
int64_t LseToken(const Problem& p, int64_t e) {
  return p.varlen() ? e % p.TotalQ()
                    : (e / (p.heads_q * p.seqlen_q)) * p.seqlen_q + e % p.seqlen_q;
}

// A copy of `t` (f64) with 0 wherever `judged` is 0.
Tensor ZeroUnjudged(const Tensor& t, const std::vector<uint8_t>& judged) {
  Tensor w = ToF64(t).Clone();
  auto span = w.span<double>();
  for (size_t e = 0; e < span.size(); ++e) {
    if (!judged[e]) span[e] = 0;
  }
  return w;
}

// An output of the problem: its name, the kernel's tensor and the shape it must have. Slot k
// is reference k of References (o, lse, dq, dk, dv).
struct Slot {
  const char* name;
  const Tensor* observed;
  Shape shape;
};

std::vector<Slot> OutputSlots(const Problem& p, const ForwardResult& fwd,
                              const BackwardResult* bwd) {
  std::vector<Slot> slots = {{"o", &fwd.o, p.OShape()}, {"lse", &fwd.lse, p.LseShape()}};
  if (bwd != nullptr) {
    slots.push_back({"dq", &bwd->dq, p.QShape()});
    slots.push_back({"dk", &bwd->dk, p.KShape()});
    slots.push_back({"dv", &bwd->dv, p.VShape()});
  }
  return slots;
}

// What the kernel's outputs are judged against, per slot: the oracle, the same-precision
// baseline where the profile asks for it, and the gradients' term magnitudes, the rounding
// floors and the format bounds where the profile floors on them.
struct References {
  Tensor ref[5];
  Tensor base[5];
  Tensor ref_dsink, base_dsink;  // a problem with a sink, backward only
  Tensor ref_drel, base_drel;    // a problem with a relative bias, backward only
  bool with_baseline = false;
  std::optional<GradientTermScales> terms;
  std::optional<RoundingFloors> floors;
  std::optional<FormatBounds> format_bounds;
};

// 1. Outputs that cannot be compared at all (the unwritten-outputs check names the bug
// class; accuracy still fails, because nothing about the values is known).
void UncomparableOutputs(std::string_view check, const std::vector<Slot>& slots, bool judge_lse,
                         std::vector<Verdict>& out) {
  for (const Slot& s : slots) {
    if (&s == &slots[1] && !judge_lse) continue;
    if (Status st = CheckOutputTensor(*s.observed, s.name, s.shape); !st.ok()) {
      out.push_back(Failure(check, s.name, "output of the problem's shape",
                            "cannot compare: " + st.error().message));
    }
  }
}

// 2. Oracle and, where the profile asks for it, the same-precision baseline. False, with the
// failure in `out`, when the baseline cannot be computed.
bool LoadOracleAndBaseline(CheckContext& ctx, std::string_view check, const BackwardResult* bwd,
                           const RowSample* sample, References& r, std::vector<Verdict>& out) {
  const Problem& p = ctx.case_.problem;
  if (bwd != nullptr) {
    const BackwardOut& b = ctx.OracleBackward();
    r.ref[0] = b.o;
    r.ref[1] = b.lse;
    r.ref[2] = b.dq;
    r.ref[3] = b.dk;
    r.ref[4] = b.dv;
    r.ref_dsink = b.dsink;
    r.ref_drel = b.drel_bias;
  } else {
    const ForwardOut& f = ctx.OracleForward();
    r.ref[0] = f.o;
    r.ref[1] = f.lse;
  }
  r.with_baseline = ctx.profile->needs_baseline();
  if (r.with_baseline) {
    const CaseInputs& in = ctx.inputs;
    auto b = ProfileBaseline(*ctx.profile, p, in.q, in.k, in.v, bwd != nullptr ? &in.dout : nullptr,
                             sample != nullptr ? &sample->query_rows : nullptr,
                             ctx.oracle_options.threads, p.sink ? &in.sink : nullptr,
                             p.rel_bias ? &in.rel_bias : nullptr);
    if (!b.ok()) {
      out.push_back(Failure(check, "", "a baseline for the profile",
                            fmt::format("profile {}: {}", ctx.profile->name, b.error().message)));
      return false;
    }
    r.base[0] = b->o;
    r.base[1] = b->lse;
    r.base[2] = b->dq;
    r.base[3] = b->dk;
    r.base[4] = b->dv;
    r.base_dsink = b->dsink;
    r.base_drel = b->drel_bias;
  }
  return true;
}

// An empty row's lse is -inf, or +inf where the kernel declares it (kernels/kernel.h
// Capabilities::empty_row_lse; docs/design.md): the reference follows the declaration (v2).
void FollowDeclaredEmptyRowLse(const CheckContext& ctx, References& r) {
  if (ctx.kernel != nullptr && EmptyRowLse(ctx.kernel->capabilities()) > 0) {
    for (Tensor* t : {&r.ref[1], &r.base[1]}) {
      if (!t->defined()) continue;
      Tensor w = ToF64(*t).Clone();
      for (double& x : w.span<double>()) {
        if (std::isinf(x) && x < 0) x = std::numeric_limits<double>::infinity();
      }
      *t = w;
    }
  }
}

// The gradients' term magnitudes, where the profile floors dq / dk on them (tolerance.h
// FloorScale::kTerms): from the oracle's own lse and delta, never the kernel's. False, with
// the failure in `out`, when they cannot be computed.
bool LoadTermScales(CheckContext& ctx, std::string_view check, const BackwardResult* bwd,
                    References& r, std::vector<Verdict>& out) {
  const Problem& p = ctx.case_.problem;
  if (bwd != nullptr && ctx.profile->needs_term_scale()) {
    const BackwardOut& b = ctx.OracleBackward();
    const CaseInputs& in = ctx.inputs;
    auto t = ComputeGradientTermScales(p, in.q, in.k, in.v, in.dout, b.lse,
                                       ctx.oracle_options.threads);
    if (!t.ok()) {
      out.push_back(Failure(check, "dq", "gradient term magnitudes", t.error().message));
      return false;
    }
    r.terms = std::move(t).value();
  }
  return true;
}

// The rounding floors of the profile's rounding points (tolerance.h Policy::rounding_floor,
// verify/tolerance/term_scale.h), on the oracle's P, dS and D; dP rounded where the kernel says so.
// False, with the failure in `out`, when they cannot be computed.
bool LoadRoundingFloors(CheckContext& ctx, std::string_view check, const BackwardResult* bwd,
                        const RowSample* sample, References& r, std::vector<Verdict>& out) {
  const Problem& p = ctx.case_.problem;
  if (ctx.profile->needs_rounding_floor()) {
    const Recipe* recipe = FindRecipe(ctx.profile->rounding_recipe);
    if (recipe == nullptr) {
      out.push_back(Failure(check, "", "the profile's rounding recipe",
                            fmt::format("profile {}: no recipe '{}'", ctx.profile->name,
                                        ctx.profile->rounding_recipe)));
      return false;
    }
    const std::optional<Format> dp =
        ctx.kernel != nullptr && bwd != nullptr ? ctx.kernel->BackwardDpFormat(p) : std::nullopt;
    const RoundingPoints points = RoundingPointsOf(*recipe, p.dtype, dp);
    const CaseInputs& in = ctx.inputs;
    Expected<RoundingFloors> f =
        bwd != nullptr
            ? ComputeRoundingFloors(p, points, in.q, in.k, in.v, in.dout, ctx.OracleBackward().lse,
                                    ctx.OracleBackward().o, ctx.OracleBackward().delta, nullptr,
                                    ctx.oracle_options.threads)
            : ComputeRoundingFloors(p, points, in.q, in.k, in.v, Tensor(),
                                    ctx.OracleForward().lse, Tensor(), Tensor(),
                                    sample != nullptr ? &sample->query_rows : nullptr,
                                    ctx.oracle_options.threads);
    if (!f.ok()) {
      out.push_back(Failure(check, "", "rounding floors", f.error().message));
      return false;
    }
    r.floors = std::move(f).value();
  }
  return true;
}

// The family rows' format bounds (tolerance.h FormatErrors), from the oracle's lse. False,
// with the failure in `out`, when they cannot be computed.
bool LoadFormatBounds(CheckContext& ctx, std::string_view check, const BackwardResult* bwd,
                      References& r, std::vector<Verdict>& out) {
  const Problem& p = ctx.case_.problem;
  if (ctx.profile->needs_format_bound()) {
    const Tensor& lse = bwd != nullptr ? ctx.OracleBackward().lse : ctx.OracleForward().lse;
    const CaseInputs& in = ctx.inputs;
    auto f = ComputeFormatBounds(p, *ctx.profile->format_errors, in.q, in.k, in.v,
                                 bwd != nullptr ? in.dout : Tensor(), lse,
                                 ctx.oracle_options.threads);
    if (!f.ok()) {
      out.push_back(Failure(check, "", "format bounds", f.error().message));
      return false;
    }
    r.format_bounds = std::move(f).value();
  }
  return true;
}

// Sampled case (docs/checks.md "Sampled rows"): outside the sampled rows the kernel's outputs
// are checked only for non-finite values (an lse of -inf or +inf only on an empty row, known
// exactly from the mask); inside, the comparison below runs on copies in which every other
// element is 0 in the output, the oracle and the baseline alike (no error, no weight in any
// maximum or norm; the oracle's NaN there means "not computed", never a failure or a pass).
// `sampled_observed` gets those copies of the outputs; `r` has its references replaced.
void JudgeOutsideSample(const Problem& p, std::string_view check, const std::vector<Slot>& slots,
                        bool judge_lse, const RowSample& sample, const std::string& sample_note,
                        References& r, Tensor (&sampled_observed)[5], std::vector<Verdict>& out) {
  const std::vector<uint8_t> empty = EmptyQueryRows(p);
  for (size_t k = 0; k < slots.size(); ++k) {
    if (k == 1 && !judge_lse) continue;
    const Slot& s = slots[k];
    const std::vector<uint8_t> judged = JudgedElements(p, sample, s.name, s.shape);
    const Tensor obs = ToF64(*s.observed);
    const auto span = obs.span<const double>();
    int64_t bad = 0, first = -1, outside = 0;
    for (size_t e = 0; e < span.size(); ++e) {
      if (judged[e]) continue;
      ++outside;
      const double x = span[e];
      const bool empty_lse = k == 1 && std::isinf(x) &&
                             empty[static_cast<size_t>(LseToken(p, static_cast<int64_t>(e)))];
      if (std::isfinite(x) || empty_lse) continue;
      if (bad++ == 0) first = static_cast<int64_t>(e);
    }
    const std::string policy = "outside the sampled rows: finite (lse +-inf only on empty rows)";
    if (bad > 0) {
      Verdict v = Failure(check, s.name, policy,
                          fmt::format("{} of {} {} elements outside the sampled rows are not "
                                      "finite; first at flat {} ({}){}",
                                      bad, outside, s.name, first,
                                      span[static_cast<size_t>(first)], sample_note));
      v.worst = LocateElement(p, s.name, s.shape, first);
      out.push_back(std::move(v));
    } else {
      out.push_back(Passing(check, s.name, policy,
                            fmt::format("{} elements outside the sampled rows finite{}", outside,
                                        sample_note)));
    }
    sampled_observed[k] = ZeroUnjudged(obs, judged);
    r.ref[k] = ZeroUnjudged(r.ref[k], judged);
    if (r.with_baseline) r.base[k] = ZeroUnjudged(r.base[k], judged);
  }
}

// A declared tanh approximation (kernels/kernel.h Capabilities::softcap_tanh_abs_error):
// every score may be off by softcap x its error e; lse then by at most that, and o_i =
// sum_j P_ij v_j by at most 2 softcap e max|v| (first order: dP_ij = P_ij (ds_ij -
// sum_l P_il ds_il), so sum_j |dP_ij| <= 2 max |ds|). Sets slot k's declared allowance in `m`.
void DeclaredTanhAllowance(const CheckContext& ctx, size_t k, TensorMetrics& m) {
  const Problem& p = ctx.case_.problem;
  const double tanh_error =
      ctx.kernel != nullptr && p.softcap > 0 ? ctx.kernel->capabilities().softcap_tanh_abs_error
                                             : 0.0;
  if (tanh_error > 0 && (k == 0 || k == 1)) {
    const double score_error = p.softcap * tanh_error;
    double v_max = 0;
    if (k == 0) {
      const Tensor v_all = ToF64(ctx.inputs.v);  // alive while its span is read
      for (double x : v_all.span<const double>()) {
        if (std::isfinite(x)) v_max = std::max(v_max, std::fabs(x));
      }
    }
    m.declared_allowance = k == 1 ? score_error : 2 * score_error * v_max;
    m.declared_note = k == 1 ? fmt::format("softcap {} x declared tanh error {}", p.softcap,
                                           tanh_error)
                             : fmt::format("2 x softcap {} x declared tanh error {} x max|v| {}",
                                           p.softcap, tanh_error, v_max);
  }
}

// 3. Metrics and verdicts of slot k, ULPs counted in the format the kernel delivered
// (`slot`'s tensor); `observed` is what is compared (the sampled copy for a sampled case).
void JudgeSlot(CheckContext& ctx, std::string_view check, const Slot& slot, size_t k,
               const Tensor& observed, const References& r, bool sampled,
               const std::string& sample_note, std::vector<Verdict>& out) {
  const Problem& p = ctx.case_.problem;
  const Format format = FormatOf(slot.observed->dtype()).value_or(Format::kF64);
  const Layout layout = LayoutOf(p, slot.name);
  const CompareOptions copts{.threads = ctx.oracle_options.threads};
  auto m = Compare(slot.name, observed, r.ref[k], format, layout, copts);
  if (!m.ok()) {
    out.push_back(Failure(check, slot.name, "comparable outputs", m.error().message));
    return;
  }
  const char* what = "";
  if (Status st = ApplyTermsAndFloors(*m, k, r.terms ? &*r.terms : nullptr,
                                      r.format_bounds ? &*r.format_bounds : nullptr,
                                      r.floors ? &*r.floors : nullptr, &what);
      !st.ok()) {
    out.push_back(Failure(check, slot.name, what, st.error().message));
    return;
  }
  // Sampled: floors computed from the oracle's lse are NaN where it was not computed.
  if (sampled && m->rounding_floor.defined()) {
    Tensor f = ToF64(m->rounding_floor).Clone();
    for (double& x : f.span<double>()) {
      if (std::isnan(x)) x = 0;
    }
    m->rounding_floor = f;
  }
  DeclaredTanhAllowance(ctx, k, *m);
  std::optional<TensorMetrics> bm;
  if (r.with_baseline) {
    auto b = Compare(slot.name, r.base[k], r.ref[k], format, layout, copts);
    if (!b.ok()) {
      out.push_back(Failure(check, slot.name, "comparable baseline", b.error().message));
      return;
    }
    bm = std::move(b).value();
  }
  for (Verdict& v : EvaluateProfile(*ctx.profile, *m, bm ? &*bm : nullptr, check)) {
    v.message += sample_note;
    out.push_back(std::move(v));
  }
}

}  // namespace

std::vector<Verdict> JudgeAgainstOracle(CheckContext& ctx, std::string_view check,
                                        const ForwardResult& fwd, const BackwardResult* bwd) {
  const Problem& p = ctx.case_.problem;
  std::vector<Verdict> out;
  const std::vector<Slot> slots = OutputSlots(p, fwd, bwd);
  // Slot k is reference k (o, lse, dq, dk, dv); a kernel without lse skips slot 1.
  const bool judge_lse = ctx.kernel == nullptr || JudgesLse(*ctx.kernel);
  UncomparableOutputs(check, slots, judge_lse, out);
  if (!out.empty()) return out;
  if (ctx.profile == nullptr) {
    out.push_back(Failure(check, "", "a tolerance profile", "the kernel has no tolerance profile"));
    return out;
  }

  References r;
  const RowSample* sample = ctx.sample ? &*ctx.sample : nullptr;
  if (!LoadOracleAndBaseline(ctx, check, bwd, sample, r, out)) return out;
  FollowDeclaredEmptyRowLse(ctx, r);
  if (!LoadTermScales(ctx, check, bwd, r, out)) return out;
  if (!LoadRoundingFloors(ctx, check, bwd, sample, r, out)) return out;
  if (!LoadFormatBounds(ctx, check, bwd, r, out)) return out;

  Tensor sampled_observed[5];
  std::string sample_note;
  if (sample != nullptr) {
    sample_note = " [" + sample->Describe() + "; forward judged]";
    JudgeOutsideSample(p, check, slots, judge_lse, *sample, sample_note, r, sampled_observed,
                       out);
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (k == 1 && !judge_lse) continue;
    const Tensor& observed = sample != nullptr ? sampled_observed[k] : *slots[k].observed;
    JudgeSlot(ctx, check, slots[k], k, observed, r, sample != nullptr, sample_note, out);
  }
  if (bwd != nullptr && p.sink) {
    for (Verdict& v : JudgeDsink(ctx, check, fwd, *bwd, r.ref_dsink, r.base_dsink)) {
      out.push_back(std::move(v));
    }
  }
  if (bwd != nullptr && p.rel_bias) {
    for (Verdict& v : JudgeDrelBias(ctx, check, fwd, *bwd, r.ref_drel, r.base_drel)) {
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::vector<Verdict> RunAccuracy(CheckContext& ctx) {
  constexpr std::string_view kCheck = "accuracy";
  const Problem& p = ctx.case_.problem;
  const auto& f = ctx.KernelForward();
  if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, f, "forward")) return *v;
  const ForwardResult& fwd = std::get<ForwardResult>(f);
  const BackwardResult* bwd = nullptr;
  std::vector<Verdict> out;
  if (ctx.WantsBackward()) {
    const auto& b = ctx.KernelBackward();
    if (auto v = NonOutputVerdicts(kCheck, *ctx.kernel, p, b, "backward")) {
      out = *v;  // a failed backward; the forward is still judged
    } else {
      bwd = &std::get<BackwardResult>(b);
    }
  }
  for (Verdict& v : JudgeAgainstOracle(ctx, kCheck, fwd, bwd)) out.push_back(std::move(v));
  return out;
}

}  // namespace attest
