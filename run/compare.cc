// `attest compare` as a library call (see compare.h).
#include "run/compare.h"

#include <fmt/format.h>

#include <chrono>
#include <optional>
#include <stdexcept>

#include "reference/case/inputs.h"
#include "verify/checks/accuracy.h"
#include "verify/tolerance/baseline.h"
#include "verify/tolerance/term_scale.h"

namespace attest {
namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

// An output of the problem: its name, its shape, whether it must be given, and the tensor
// given.
struct Slot {
  const char* name;
  Shape shape;
  bool required;
  const Tensor* tensor = nullptr;
};

// 1. Which outputs are there, with the problem's shapes: the slots' tensors; sets any_grad when
// a gradient is given.
Status FindOutputs(const NamedTensors& outputs, const CompareOutputsOptions& options,
                   std::vector<Slot>& slots, bool& any_grad) {
  for (Slot& s : slots) {
    if (&s == &slots[1] && !options.lse) continue;  // a producer without lse: not judged
    s.tensor = outputs.Find(s.name);
    if (s.tensor == nullptr) {
      if (s.required) return Error{fmt::format("outputs: no tensor named '{}'", s.name)};
      continue;
    }
    const DType dt = s.tensor->dtype();
    if (!Info(dt).is_float || dt == DType::kE8M0FNU) {
      return Error{
          fmt::format("outputs: tensor '{}' has dtype {}, not a float dtype", s.name, Name(dt))};
    }
    if (s.tensor->shape() != s.shape) {
      return Error{fmt::format("outputs: tensor '{}' has shape {}, the problem needs {}", s.name,
                               ShapeText(s.tensor->shape()), ShapeText(s.shape))};
    }
    if (!s.required) any_grad = true;
  }
  return Status::Ok();
}

// The oracle's outputs and what the profile's policies add to them: term magnitudes, rounding
// floors and format bounds.
struct OracleSide {
  Tensor ref[5];
  std::optional<GradientTermScales> terms;
  std::optional<RoundingFloors> floors;
  std::optional<FormatBounds> format_bounds;  // the family rows (tolerance.h kFormatBound)
  Tensor dsink;      // a problem with a sink, backward
  Tensor drel_bias;  // a problem with a relative bias, backward
};

// The oracle's options with the case's learnable sink and relative bias (Problem::sink,
// Problem::rel_bias).
OracleOptions WithSink(const CompareOutputsOptions& options, const CaseInputs& in) {
  OracleOptions o = options.oracle;
  if (in.sink.defined()) o.sink = &in.sink;
  if (in.rel_bias.defined()) o.rel_bias = &in.rel_bias;
  return o;
}

// The backward oracle, with the term magnitudes, format bounds and rounding floors the
// profile needs.
Status OracleBackward(const Problem& p, const Profile& profile, const CaseInputs& in,
                      const std::optional<RoundingPoints>& points,
                      const CompareOutputsOptions& options, OracleSide& o) {
  const int threads = options.oracle.threads;
  BackwardOut b = Backward<double>(p, in.q, in.k, in.v, in.dout, WithSink(options, in));
  o.dsink = b.dsink;
  o.drel_bias = b.drel_bias;
  o.ref[0] = b.o;
  o.ref[1] = b.lse;
  o.ref[2] = b.dq;
  o.ref[3] = b.dk;
  o.ref[4] = b.dv;
  // dq / dk floors on the terms' magnitude (tolerance.h FloorScale::kTerms).
  if (profile.needs_term_scale()) {
    auto t = ComputeGradientTermScales(p, in.q, in.k, in.v, in.dout, b.lse, threads);
    if (!t.ok()) return Error{fmt::format("term magnitudes: {}", t.error().message)};
    o.terms = std::move(t).value();
  }
  if (profile.needs_format_bound()) {
    auto f = ComputeFormatBounds(p, *profile.format_errors, in.q, in.k, in.v, in.dout, b.lse,
                                 threads);
    if (!f.ok()) return Error{fmt::format("format bounds: {}", f.error().message)};
    o.format_bounds = std::move(f).value();
  }
  if (points) {
    auto f = ComputeRoundingFloors(p, *points, in.q, in.k, in.v, in.dout, b.lse, b.o, b.delta,
                                   nullptr, threads);
    if (!f.ok()) return Error{fmt::format("rounding floors: {}", f.error().message)};
    o.floors = std::move(f).value();
  }
  return Status::Ok();
}

// The forward oracle, with the format bounds and rounding floors the profile needs.
Status OracleForward(const Problem& p, const Profile& profile, const CaseInputs& in,
                     const std::optional<RoundingPoints>& points,
                     const CompareOutputsOptions& options, OracleSide& o) {
  const int threads = options.oracle.threads;
  ForwardOut f = Forward<double>(p, in.q, in.k, in.v, WithSink(options, in));
  o.ref[0] = f.o;
  o.ref[1] = f.lse;
  if (profile.needs_format_bound()) {
    auto r = ComputeFormatBounds(p, *profile.format_errors, in.q, in.k, in.v, Tensor(), f.lse,
                                 threads);
    if (!r.ok()) return Error{fmt::format("format bounds: {}", r.error().message)};
    o.format_bounds = std::move(r).value();
  }
  if (points) {
    auto r = ComputeRoundingFloors(p, *points, in.q, in.k, in.v, Tensor(), f.lse, Tensor(),
                                   Tensor(), nullptr, threads);
    if (!r.ok()) return Error{fmt::format("rounding floors: {}", r.error().message)};
    o.floors = std::move(r).value();
  }
  return Status::Ok();
}

// 3. Metrics and verdicts, tensor by tensor, into result.
Status JudgeOutputs(const Problem& p, const Profile& profile, const std::vector<Slot>& slots,
                    const OracleSide& o, const Tensor (&base)[5], bool with_baseline,
                    const CompareOutputsOptions& options, CompareOutputsResult& result) {
  Report& report = result.report;
  for (size_t k = 0; k < slots.size(); ++k) {
    const Slot& s = slots[k];
    if (s.tensor == nullptr) continue;
    const Format format = options.output_format
                              ? *options.output_format
                              : FormatOf(s.tensor->dtype()).value_or(Format::kF64);
    CompareOptions copts;
    copts.allow_pos_inf_for_neg_inf = k == 1 && options.lse_pos_inf_for_empty;
    const Layout layout = LayoutOf(p, s.name);
    auto m = Compare(s.name, *s.tensor, o.ref[k], format, layout, copts);
    if (!m.ok()) return m.error();
    const char* what = "";
    if (Status st = ApplyTermsAndFloors(*m, k, o.terms ? &*o.terms : nullptr,
                                        o.format_bounds ? &*o.format_bounds : nullptr,
                                        o.floors ? &*o.floors : nullptr, &what);
        !st.ok()) {
      return st.error();
    }
    const TensorMetrics* bm = nullptr;
    if (with_baseline) {
      auto b = Compare(s.name, base[k], o.ref[k], format, layout, copts);
      if (!b.ok()) return b.error();
      result.baseline_metrics.push_back(std::move(b).value());
      bm = &result.baseline_metrics.back();
    }
    for (Verdict& v : EvaluateProfile(profile, *m, bm)) {
      if (!v.pass) v.repro = options.repro;
      report.verdicts.push_back(std::move(v));
    }
    result.metrics.push_back(std::move(m).value());
  }
  return Status::Ok();
}

// A learnable parameter's gradient (gradients given): the outputs' `name` ("dsink" [Hq] with
// Problem::sink, "drel_bias" [Hq, W] with Problem::rel_bias) by the accuracy check's rule
// (verify/checks/accuracy.h JudgeDsink / JudgeDrelBias: dv's baseline-ratio policies per
// element, raised to `floor`).
Status JudgeParamGradOutput(std::string_view name, std::string_view field, const Shape& shape,
                            const Profile& profile, const NamedTensors& outputs,
                            const Tensor& ref, const Tensor& base, const Tensor& floor,
                            const CompareOutputsOptions& options, CompareOutputsResult& result) {
  const Tensor* got = outputs.Find(std::string(name));
  if (got == nullptr) {
    return Error{fmt::format("outputs: no tensor named '{}' ({} with gradients given)", name,
                             field)};
  }
  if (got->shape() != shape) {
    return Error{fmt::format("outputs: tensor '{}' has shape {}, the problem needs {}", name,
                             ShapeText(got->shape()), ShapeText(shape))};
  }
  const std::vector<Policy> policies = DsinkPolicies(profile);
  if (policies.empty() || !base.defined()) {
    return Error{fmt::format("profile {}: no baseline-ratio policy for dv to derive {}'s "
                             "tolerance from",
                             profile.name, name)};
  }
  const Layout layout = Layout::Flat(static_cast<int64_t>(shape.size()));
  auto m = Compare(std::string(name), *got, ref, Format::kF32, layout);
  auto bm = Compare(std::string(name), base, ref, Format::kF32, layout);
  if (!m.ok()) return m.error();
  if (!bm.ok()) return bm.error();
  if (Status st = SetRoundingFloor(*m, floor); !st.ok()) return st.error();
  for (const Policy& policy : policies) {
    Verdict v = Evaluate(policy, *m, &*bm);
    if (!v.pass) v.repro = options.repro;
    result.report.verdicts.push_back(std::move(v));
  }
  result.metrics.push_back(std::move(m).value());
  result.baseline_metrics.push_back(std::move(bm).value());
  return Status::Ok();
}

// dsink and drel_bias (gradients given) with their rounding floors of D from the rounded o.
Status JudgeParamGrads(const Problem& p, const Profile& profile, const NamedTensors& outputs,
                       const CaseInputs& in, const OracleSide& o, const Tensor& base_dsink,
                       const Tensor& base_drel, const CompareOutputsOptions& options,
                       CompareOutputsResult& result) {
  const Tensor* out_o = outputs.Find("o");
  const Format o_format = options.output_format
                              ? *options.output_format
                              : FormatOf(out_o->dtype()).value_or(Format::kF32);
  if (p.sink) {
    const Tensor floor = DsinkRoundingFloor(p, o.ref[0], o.ref[1], in.dout, in.sink, o_format);
    if (Status st = JudgeParamGradOutput("dsink", "problem.sink", Shape{p.heads_q}, profile,
                                         outputs, o.dsink, base_dsink, floor, options, result);
        !st.ok()) {
      return st.error();
    }
  }
  if (p.rel_bias) {
    const Tensor floor = DrelBiasRoundingFloor(p, in, o.ref[0], o.ref[1], o_format);
    if (Status st = JudgeParamGradOutput("drel_bias", "problem.rel_bias", p.RelBiasShape(),
                                         profile, outputs, o.drel_bias, base_drel, floor,
                                         options, result);
        !st.ok()) {
      return st.error();
    }
  }
  return Status::Ok();
}

}  // namespace

Expected<CompareOutputsResult> CompareOutputs(const Case& c, const NamedTensors& outputs,
                                              const CompareOutputsOptions& options) {
  using Clock = std::chrono::steady_clock;
  const Problem& p = c.problem;
  const Profile* profile = options.profile ? options.profile : ProfileForDType(p.dtype);
  if (profile == nullptr) {
    return Error{fmt::format("problem.dtype: no tolerance profile for dtype {}; pass --profile",
                             Name(p.dtype))};
  }

  // 1. Which outputs are there, with the problem's shapes.
  std::vector<Slot> slots = {{"o", p.OShape(), true},
                             {"lse", p.LseShape(), true},
                             {"dq", p.QShape(), false},
                             {"dk", p.KShape(), false},
                             {"dv", p.VShape(), false}};
  bool any_grad = false;
  if (Status st = FindOutputs(outputs, options, slots, any_grad); !st.ok()) return st.error();

  // 2. Inputs, oracle, baseline.
  CompareOutputsResult result;
  Report& report = result.report;
  report.suite = "compare";
  report.seed = c.generator ? c.generator->seed : 0;
  auto inputs = MakeCaseInputs(c);
  if (!inputs.ok()) return inputs.error();
  if (any_grad && !inputs->dout.defined()) {
    return Error{"outputs: gradients given but the case has no 'do' to differentiate with"};
  }
  OracleSide oracle;
  // The profile's rounding points (tolerance.h Policy::rounding_floor); a file carries no
  // kernel, so dP is taken as fp32 (FlashAttention's).
  std::optional<RoundingPoints> points;
  if (profile->needs_rounding_floor()) {
    const Recipe* recipe = FindRecipe(profile->rounding_recipe);
    if (recipe == nullptr) {
      return Error{fmt::format("profile {}: no rounding recipe '{}'", profile->name,
                               profile->rounding_recipe)};
    }
    points = RoundingPointsOf(*recipe, p.dtype);
  }
  // The oracle's thread count for the terms, floors, bounds and baseline too (their results do
  // not depend on it).
  const int threads = options.oracle.threads;
  auto start = Clock::now();
  try {
    Status st = any_grad ? OracleBackward(p, *profile, *inputs, points, options, oracle)
                         : OracleForward(p, *profile, *inputs, points, options, oracle);
    if (!st.ok()) return st.error();
  } catch (const std::exception& e) {
    return Error{fmt::format("oracle: {}", e.what())};
  }
  report.timings.push_back({"oracle", Since(start)});

  Tensor base[5], base_dsink, base_drel;
  const bool with_baseline = profile->needs_baseline();
  if (with_baseline) {
    start = Clock::now();
    auto b = ProfileBaseline(*profile, p, inputs->q, inputs->k, inputs->v,
                             any_grad ? &inputs->dout : nullptr, nullptr, threads,
                             p.sink ? &inputs->sink : nullptr,
                             p.rel_bias ? &inputs->rel_bias : nullptr);
    if (!b.ok()) {
      return Error{fmt::format("profile {}: {}", profile->name, b.error().message)};
    }
    base[0] = b->o;
    base[1] = b->lse;
    base[2] = b->dq;
    base[3] = b->dk;
    base[4] = b->dv;
    base_dsink = b->dsink;
    base_drel = b->drel_bias;
    report.timings.push_back({"baseline", Since(start)});
  }

  // 3. Metrics and verdicts, tensor by tensor.
  start = Clock::now();
  if (Status st = JudgeOutputs(p, *profile, slots, oracle, base, with_baseline, options, result);
      !st.ok()) {
    return st.error();
  }
  if (any_grad) {
    if (Status st = JudgeParamGrads(p, *profile, outputs, *inputs, oracle, base_dsink, base_drel,
                                    options, result);
        !st.ok()) {
      return st.error();
    }
  }
  report.timings.push_back({"compare", Since(start)});
  return result;
}

}  // namespace attest
