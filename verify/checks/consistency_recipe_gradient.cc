// The recipe-gradient part of the consistency check (verify/checks/consistency.h): the
// kernel's gradients against the float64 oracle's backward at the operands as the recipe
// quantised them, judged with the kernel's tolerance profile.
#include "verify/checks/consistency_internal.h"

#include <limits>

#include "reference/oracle/oracle.h"
#include "verify/tolerance/baseline.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/term_scale.h"

namespace attest::consistency_detail {

// ---- Oracle backward at the recipe's quantised operands, judged by the profile ----
void RecipeGradient(const Problem& p, const CaseInputs& in, const KernelRun& run,
                    const Recipe& recipe, const Profile& profile, std::optional<Format> dp,
                    const std::string& repro, std::vector<Verdict>& out) {
  auto fail = [&](const std::string& msg) {
    Verdict v;
    v.check = std::string(kCheck);
    v.policy = "recipe-gradient";
    v.margin = std::numeric_limits<double>::infinity();
    v.message = "recipe-gradient: " + msg;
    v.repro = repro;
    out.push_back(v);
  };
  Expected<Tensor> q = QuantizeForRecipe(in.q, recipe.qk.a);
  Expected<Tensor> k = QuantizeForRecipe(in.k, recipe.qk.b);
  Expected<Tensor> v = QuantizeForRecipe(in.v, recipe.pv.b);
  if (!q.ok() || !k.ok() || !v.ok()) {
    fail("quantising operands: " + (!q.ok() ? q.error().message
                                   : !k.ok() ? k.error().message : v.error().message));
    return;
  }
  OracleOptions oracle;
  if (p.sink) oracle.sink = &in.sink;  // the sink is fp32 and no GEMM operand: never quantised
  const BackwardOut ref = Backward<double>(p, *q, *k, *v, in.dout, oracle);
  std::optional<BaselineOut> base;
  const Tensor* sink = p.sink ? &in.sink : nullptr;
  if (profile.needs_baseline()) {
    // The profile's baseline against the same quantised oracle: the same-precision "pt" on
    // the quantised operands, or the recipe reference (which quantises the inputs itself).
    Expected<BaselineOut> b =
        profile.baseline_recipe.empty()
            ? ProfileBaseline(profile, p, *q, *k, *v, &in.dout, nullptr, 1, sink)
            : ProfileBaseline(profile, p, in.q, in.k, in.v, &in.dout, nullptr, 1, sink);
    if (!b.ok()) {
      fail("baseline: " + b.error().message);
      return;
    }
    base = std::move(*b);
  }
  // The floors accuracy uses (tolerance.h FloorScale::kTerms, Policy::rounding_floor), at the
  // quantised operands: without them a cancelled row or a few-key row fails here exactly as
  // it would in accuracy.
  std::optional<GradientTermScales> terms;
  if (profile.needs_term_scale()) {
    Expected<GradientTermScales> t = ComputeGradientTermScales(p, *q, *k, *v, in.dout, ref.lse);
    if (!t.ok()) {
      fail("term magnitudes: " + t.error().message);
      return;
    }
    terms = std::move(*t);
  }
  std::optional<RoundingFloors> floors;
  if (profile.needs_rounding_floor()) {
    const Recipe* rr = FindRecipe(profile.rounding_recipe);
    if (rr == nullptr) {
      fail("profile " + profile.name + ": no rounding recipe '" + profile.rounding_recipe + "'");
      return;
    }
    Expected<RoundingFloors> f = ComputeRoundingFloors(p, RoundingPointsOf(*rr, p.dtype, dp), *q,
                                                       *k, *v, in.dout, ref.lse, ref.o, ref.delta);
    if (!f.ok()) {
      fail("rounding floors: " + f.error().message);
      return;
    }
    floors = std::move(*f);
  }
  const Format grad = recipe.gradients.value_or(FormatOf(p.dtype).value_or(Format::kF32));
  const std::pair<std::string_view, std::pair<const Tensor*, const Tensor*>> items[] = {
      {"dq", {&run.dq, &ref.dq}}, {"dk", {&run.dk, &ref.dk}}, {"dv", {&run.dv, &ref.dv}}};
  for (const auto& [name, pair] : items) {
    Expected<TensorMetrics> m = Compare(name, *pair.first, *pair.second, grad, LayoutOf(p, name));
    if (!m.ok()) {
      fail(m.error().message);
      continue;
    }
    if (terms && name != "dv") {
      if (Status st = SetRowTermScales(*m, name == "dq" ? terms->dq : terms->dk); !st.ok()) {
        fail(st.error().message);
        continue;
      }
    }
    if (floors) {
      const Tensor& fl = name == "dq" ? floors->dq : name == "dk" ? floors->dk : floors->dv;
      if (Status st = SetRoundingFloor(*m, fl); !st.ok()) {
        fail(st.error().message);
        continue;
      }
    }
    std::optional<TensorMetrics> bm;
    if (base) {
      const Tensor& bt = name == "dq" ? base->dq : name == "dk" ? base->dk : base->dv;
      Expected<TensorMetrics> x = Compare(name, bt, *pair.second, grad, LayoutOf(p, name));
      if (x.ok()) bm = std::move(*x);
    }
    for (Verdict& v : EvaluateProfile(profile, *m, bm ? &*bm : nullptr, kCheck)) {
      v.policy = "recipe-gradient (" + std::string(recipe.name) + "): " + v.policy;
      v.message = "gradient vs oracle at the recipe's quantised operands: " + v.message;
      if (!v.pass) v.repro = repro;
      out.push_back(std::move(v));
    }
  }
}

}  // namespace attest::consistency_detail
