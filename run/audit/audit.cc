// `attest audit`'s data collection (see audit.h; docs/audit.md). Everything is measured with
// the library that judges kernels elsewhere: the float64 oracle, Compare (metrics.h), the
// accuracy, non-interference and consistency checks, generator case files. The leak maps are
// the non-interference check's perturbation (largest finite values written into inputs a row
// must not see) swept block by block, so that a leak shows where it happens.
//
// This file: the plans, the accuracy sweeps over sequence length, head dim and distribution,
// the gradient bias and the run; the leak maps are in audit_leak.cc, the non-interference
// and consistency cases in audit_checks.cc (audit_internal.h declares what they share).
#include "run/audit/audit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/case/inputs.h"
#include "reference/data/generate.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/recipes/recipe.h"
#include "verify/checks/accuracy.h"
#include "verify/checks/check.h"
#include "verify/checks/noninterference.h"
#include "verify/metrics/metrics.h"
#include "verify/report/repro.h"
#include "verify/report/report.h"
#include "run/audit/audit_internal.h"
#include "run/run.h"
#include "run/suite.h"
#include "verify/tolerance/tolerance.h"

namespace attest {

std::vector<std::string> DefaultAuditDistributions() {
  // Required: gaussian, outlier channels, heavy tail, peaked logits and near format max; the
  // others are the rest of the fuzz generators' value families (docs/fuzz.md).
  return {"gaussian",      "uniform",       "outlier-channels", "heavy-tail",
          "token-scale-spread", "peaked-logits", "near-fp8-subnormal", "near-max",
          "constant-rows", "ties"};
}

AuditPlan DefaultAuditPlan() {
  AuditPlan p;
  p.seqlens = {128, 256, 512, 1024, 2048, 4096};
  p.seqlen_head_dim = 128;
  p.head_dims = {32, 64, 128, 256};
  p.head_dim_seqlen = 512;
  p.distributions = DefaultAuditDistributions();
  p.distribution_seqlen = 512;
  p.leak_seqlen = 256;
  p.leak_block = 8;
  p.ni_seqlens = {8, 16, 32, 64, 128};
  p.consistency_seqlen = 128;
  p.bias_seeds = 8;
  p.bias_seqlen = 256;
  return p;
}

AuditPlan QuickAuditPlan() {
  AuditPlan p;
  p.seqlens = {64, 128, 256};
  p.seqlen_head_dim = 64;
  p.head_dims = {32, 64, 128};
  p.head_dim_seqlen = 128;
  p.distributions = DefaultAuditDistributions();
  p.distribution_seqlen = 128;
  p.leak_seqlen = 128;
  p.leak_block = 8;
  p.ni_seqlens = {8, 32, 64};
  p.consistency_seqlen = 64;
  p.bias_seeds = 4;
  p.bias_seqlen = 128;
  return p;
}

bool AuditResult::passed() const { return failures() == 0; }

int AuditResult::failures() const {
  int n = 0;
  for (const AuditVerdict& v : verdicts) n += v.verdict.pass ? 0 : 1;
  return n;
}

namespace audit_internal {

Outputs RunKernel(Kernel& kernel, const Problem& p, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& dout, bool backward) {
  Outputs out;
  auto fwd = kernel.Forward(p, q, k, v);
  if (auto* u = std::get_if<Unsupported>(&fwd)) {
    out.note = "unsupported: " + u->reason;
    return out;
  }
  if (auto* e = std::get_if<Error>(&fwd)) {
    out.note = "error: forward: " + e->message;
    return out;
  }
  const ForwardResult& f = std::get<ForwardResult>(fwd);
  if (backward) {
    auto bwd = kernel.Backward(p, q, k, v, f.o, f.lse, dout);
    if (auto* b = std::get_if<BackwardResult>(&bwd)) {
      out.dq = ToF64(b->dq);
      out.dk = ToF64(b->dk);
      out.dv = ToF64(b->dv);
    } else if (auto* u = std::get_if<Unsupported>(&bwd)) {
      out.note = "backward unsupported: " + u->reason;
    } else {
      out.note = "error: backward: " + std::get<Error>(bwd).message;
    }
  }
  out.o = ToF64(f.o);
  if (f.lse.defined()) out.lse = ToF64(f.lse);  // none from a kernel without lse: not plotted
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

TensorError ErrorOf(const Problem& p, std::string_view name, const Tensor& observed,
                    const Tensor& reference) {
  TensorError e;
  if (!observed.defined() || !reference.defined()) return e;
  auto m = Compare(name, observed, reference, FormatOf(observed.dtype()).value_or(Format::kF64),
                   LayoutOf(p, name));
  if (!m.ok()) return e;
  e.present = true;
  e.elements = m->elements;
  e.nonfinite = m->nonfinite_mismatches;
  e.rel_l2 = m->rel_l2;
  e.max_rel = m->ref_max_abs > 0 ? m->max_abs_error / m->ref_max_abs : m->max_abs_error;
  e.bias = m->bias;
  // mean(err * sign(ref)) / rms(err) over finite pairs (metrics.h's bias is mean(err) / rms).
  const auto obs = m->observed.span<const double>();
  const auto ref = m->reference.span<const double>();
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (size_t i = 0; i < obs.size(); ++i) {
    if (!std::isfinite(obs[i]) || !std::isfinite(ref[i])) continue;
    const double err = obs[i] - ref[i];
    sum += ref[i] > 0 ? err : ref[i] < 0 ? -err : 0.0;
    sq += err * err;
    ++n;
  }
  e.magnitude_bias = sq > 0 ? (sum / static_cast<double>(n)) / std::sqrt(sq / n) : 0.0;
  return e;
}

KernelErrors ErrorsOf(const Problem& p, const Outputs& out, const BackwardOut* bwd,
                      const ForwardOut& fwd) {
  KernelErrors k;
  k.note = out.note;
  if (!out.ok()) return k;
  k.tensors["o"] = ErrorOf(p, "o", out.o, fwd.o);
  k.tensors["lse"] = ErrorOf(p, "lse", out.lse, fwd.lse);
  if (bwd != nullptr) {
    k.tensors["dq"] = ErrorOf(p, "dq", out.dq, bwd->dq);
    k.tensors["dk"] = ErrorOf(p, "dk", out.dk, bwd->dk);
    k.tensors["dv"] = ErrorOf(p, "dv", out.dv, bwd->dv);
  }
  return k;
}

}  // namespace

Expected<AuditCase> Auditor::Measure(const std::string& label, const Case& c, bool judge) {
  AuditCase a;
  a.label = label;
  a.c = c;
  auto inputs = MakeCaseInputs(c);
  if (!inputs.ok()) return Error{label + ": " + inputs.error().message};
  CheckContext ctx;
  ctx.kernel = &kernel_;
  ctx.kernel_spec = opt_.kernel_spec;
  ctx.case_ = c;
  ctx.inputs = std::move(inputs).value();
  ctx.profile = &profile_;
  ctx.oracle_options = oracle_;
  ctx.cuda_oracle = opt_.cuda_oracle;
  ctx.seed = c.generator->seed;
  ctx.label = label;
  ctx.repro = AuditCommand(opt_.kernel_spec, opt_.seed);
  const Problem& p = c.problem;
  try {
    const bool bwd = ctx.inputs.dout.defined() && (backward_ || baseline_backward_);
    const BackwardOut* ob = bwd ? &ctx.OracleBackward() : nullptr;
    const ForwardOut& of = ctx.OracleForward();
    // The kernel's answers through the context, so that the accuracy check reuses them.
    Outputs ko;
    const auto& kf = ctx.KernelForward();
    if (auto* f = std::get_if<ForwardResult>(&kf)) {
      ko.o = ToF64(f->o);
      if (f->lse.defined()) ko.lse = ToF64(f->lse);
      if (backward_) {
        const auto& kb = ctx.KernelBackward();
        if (auto* g = std::get_if<BackwardResult>(&kb)) {
          ko.dq = ToF64(g->dq);
          ko.dk = ToF64(g->dk);
          ko.dv = ToF64(g->dv);
        } else if (auto* u = std::get_if<Unsupported>(&kb)) {
          ko.note = "backward unsupported: " + u->reason;
        } else {
          ko.note = "error: backward: " + std::get<Error>(kb).message;
        }
      }
    } else if (auto* u = std::get_if<Unsupported>(&kf)) {
      ko.note = "unsupported: " + u->reason;
    } else {
      ko.note = "error: forward: " + std::get<Error>(kf).message;
    }
    a.kernel = ErrorsOf(p, ko, backward_ ? ob : nullptr, of);
    const Outputs bo = RunKernel(baseline_, p, ctx.inputs.q, ctx.inputs.k, ctx.inputs.v,
                                 ctx.inputs.dout, baseline_backward_ && bwd);
    a.baseline = ErrorsOf(p, bo, baseline_backward_ ? ob : nullptr, of);
    if (judge) {
      a.verdicts = RunAccuracy(ctx);
      for (Verdict& v : a.verdicts) {
        if (Status s = SaveRepro(v, c); !s.ok()) return s.error();
      }
    }
  } catch (const InfrastructureError& e) {  // the oracle rejected the case, a full disk
    return Error{label + ": " + e.what()};
  }
  return a;
}

Status Auditor::MeasureBias(AuditResult& r) {
  const AuditPlan& plan = opt_.plan;
  std::map<std::string, std::vector<double>, std::less<>> kb, bb, km, bm;
  std::map<std::string, double, std::less<>> elements;
  for (int i = 0; i < plan.bias_seeds; ++i) {
    Step(fmt::format("gradient bias: seed {}/{}", i + 1, plan.bias_seeds));
    const Case c = MakeCase(MakeProblem(plan.bias_seqlen, plan.seqlen_head_dim, causal_),
                            "gaussian", ++row_);
    auto a = Measure(fmt::format("bias seed {}", i), c, false);
    if (!a.ok()) return a.error();
    for (std::string_view t : kAuditTensors) {
      const std::string name(t);
      auto ke = a->kernel.tensors.find(name);
      auto be = a->baseline.tensors.find(name);
      if (ke != a->kernel.tensors.end() && ke->second.present) {
        kb[name].push_back(ke->second.bias);
        km[name].push_back(ke->second.magnitude_bias);
        elements[name] = static_cast<double>(ke->second.elements);
      }
      if (be != a->baseline.tensors.end() && be->second.present) {
        bb[name].push_back(be->second.bias);
        bm[name].push_back(be->second.magnitude_bias);
      }
    }
  }
  auto stats = [](const std::vector<double>& x, double& mean, double& se) {
    mean = se = std::numeric_limits<double>::quiet_NaN();
    if (x.empty()) return;
    double s = 0;
    for (double v : x) s += v;
    mean = s / static_cast<double>(x.size());
    if (x.size() < 2) return;
    double ss = 0;
    for (double v : x) ss += (v - mean) * (v - mean);
    se = std::sqrt(ss / static_cast<double>(x.size() - 1) / static_cast<double>(x.size()));
  };
  for (std::string_view t : kAuditTensors) {
    const std::string name(t);
    if (!kb.contains(name)) continue;
    BiasStat b;
    b.tensor = name;
    b.n = static_cast<int>(kb[name].size());
    b.elements = elements[name];
    stats(kb[name], b.kernel_mean, b.kernel_se);
    stats(km[name], b.kernel_magnitude_mean, b.kernel_magnitude_se);
    stats(bb[name], b.baseline_mean, b.baseline_se);
    stats(bm[name], b.baseline_magnitude_mean, b.baseline_magnitude_se);
    r.bias.push_back(b);
  }
  return {};
}

Expected<AuditResult> Auditor::Run() {
  const auto start = Clock::now();
  const AuditPlan& plan = opt_.plan;
  AuditResult r;
  r.kernel = opt_.kernel_spec;
  r.kernel_description = Kernels().Description(opt_.kernel_spec);
  r.baseline = opt_.baseline_spec;
  r.profile = profile_.name;
  r.recipe = caps_.recipe;
  r.has_backward = backward_;
  if (const Recipe* recipe = caps_.recipe.empty() ? nullptr : FindRecipe(caps_.recipe)) {
    r.sequence_block_scales = HasSequenceBlockOperands(*recipe);
  }
  r.seed = opt_.seed;
  r.oracle_device = opt_.cuda_oracle ? "cuda" : "cpu";
  r.plan = plan;
  total_ = AuditSteps(plan, backward_);

  // Every distribution must exist before anything runs (a typo should not cost minutes).
  const std::vector<std::string> known = GeneratorNames();
  for (const std::string& name : plan.distributions) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return Error{fmt::format(
          "distribution '{}' is not a generator of reference/data/generate.cc (known: {})", name,
          fmt::join(known, ", "))};
    }
  }

  auto sweep = [&](Sweep& sw, std::string name, std::string x_label,
                   const std::vector<int64_t>& xs, auto problem_of,
                   auto label_of) -> Status {
    sw.name = std::move(name);
    sw.x_label = std::move(x_label);
    for (int64_t x : xs) {
      const std::string label = label_of(x);
      Step(sw.name + " sweep: " + label);
      auto a = Measure(label, MakeCase(problem_of(x), "gaussian", ++row_), true);
      if (!a.ok()) return a.error();
      sw.x.push_back(static_cast<double>(x));
      sw.cases.push_back(std::move(a).value());
    }
    return {};
  };
  const int64_t d0 = plan.seqlen_head_dim;
  if (Status s = sweep(
          r.seqlen, "seqlen", fmt::format("sequence length ({}, Sq = Sk)", MaskWord()),
          plan.seqlens, [&](int64_t s) { return MakeProblem(s, d0, causal_); },
          [](int64_t s) { return fmt::format("S={}", s); });
      !s.ok()) {
    return s.error();
  }
  // Head dims both kernels claim (an empty list claims every value).
  std::vector<int64_t> dims;
  const auto claims = [](const Capabilities& c, int64_t d) {
    return c.head_dims.empty() || std::find(c.head_dims.begin(), c.head_dims.end(), d) !=
                                      c.head_dims.end();
  };
  const Capabilities bcaps = baseline_.capabilities();
  for (int64_t d : plan.head_dims) {
    if (claims(caps_, d) && claims(bcaps, d)) dims.push_back(d);
  }
  if (Status s = sweep(
          r.head_dim, "head_dim",
          fmt::format("head dim ({}, S = {})", MaskWord(), plan.head_dim_seqlen), dims,
          [&](int64_t d) { return MakeProblem(plan.head_dim_seqlen, d, causal_); },
          [](int64_t d) { return fmt::format("D={}", d); });
      !s.ok()) {
    return s.error();
  }
  // Skipped head dims still count as steps for the progress bar.
  done_ += static_cast<int64_t>(plan.head_dims.size() - dims.size());

  r.distributions.name = "distribution";
  r.distributions.x_label = fmt::format("input distribution (S = {}, non-causal)",
                                        plan.distribution_seqlen);
  for (size_t i = 0; i < plan.distributions.size(); ++i) {
    const std::string& g = plan.distributions[i];
    Step("distribution: " + g);
    auto a = Measure(g, MakeCase(MakeProblem(plan.distribution_seqlen, d0, false), g, ++row_),
                     false);
    if (!a.ok()) return a.error();
    r.distributions.x.push_back(static_cast<double>(i));
    r.distributions.cases.push_back(std::move(a).value());
  }

  if (Status s = MeasureLeakMaps(r); !s.ok()) return s.error();
  if (Status s = MeasureNonInterference(r); !s.ok()) return s.error();
  if (Status s = MeasureConsistency(r); !s.ok()) return s.error();
  if (Status s = MeasureBias(r); !s.ok()) return s.error();

  // The verdict table: every verdict with where it came from.
  for (const Sweep* sw : {&r.seqlen, &r.head_dim}) {
    for (const AuditCase& a : sw->cases) {
      for (const Verdict& v : a.verdicts) r.verdicts.push_back({"accuracy", a.label, v});
    }
  }
  for (const NonInterferenceCase& n : r.non_interference.cases) {
    for (const Verdict& v : n.verdicts) r.verdicts.push_back({"non-interference", n.label, v});
  }
  for (const ConsistencyCase& c : r.consistency) {
    for (const Verdict& v : c.verdicts) r.verdicts.push_back({"consistency", c.label, v});
  }
  for (const ConsistencyCase& c : r.consistency) {
    for (const Verdict& v : c.bias) r.verdicts.push_back({"bias", c.label, v});
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (opt_.progress) opt_.progress({total_, total_, "done"});
  return r;
}

}  // namespace audit_internal

int64_t AuditSteps(const AuditPlan& plan, bool has_backward) {
  const int64_t nb = (plan.leak_seqlen + plan.leak_block - 1) / plan.leak_block;
  return static_cast<int64_t>(plan.seqlens.size() + plan.head_dims.size() +
                              plan.distributions.size() + plan.ni_seqlens.size() + 4 + 4) +
         nb * (has_backward ? 2 : 1) + plan.bias_seeds;
}

Expected<AuditResult> RunAudit(const AuditOptions& options) {
  const AuditPlan& plan = options.plan;
  if (plan.leak_block <= 0 || plan.leak_seqlen <= 0 || plan.heads <= 0) {
    return Error{"audit plan: leak_block, leak_seqlen and heads must be positive"};
  }
  auto kernel = Kernels().Create(options.kernel_spec);
  if (!kernel.ok()) return kernel.error();
  auto baseline = Kernels().Create(options.baseline_spec);
  if (!baseline.ok()) return Error{"--baseline: " + baseline.error().message};
  const Capabilities caps = (*kernel)->capabilities();
  const Capabilities bcaps = (*baseline)->capabilities();
  // The dtype of every case: the kernel's first input dtype that the baseline also takes.
  std::optional<DType> dtype;
  const std::vector<DType> kd = caps.dtypes.empty() ? std::vector<DType>{DType::kBF16}
                                                    : caps.dtypes;
  for (DType d : kd) {
    if (bcaps.dtypes.empty() ||
        std::find(bcaps.dtypes.begin(), bcaps.dtypes.end(), d) != bcaps.dtypes.end()) {
      dtype = d;
      break;
    }
  }
  if (!dtype) {
    return Error{fmt::format("--baseline {} takes none of the input dtypes of {}",
                             options.baseline_spec, options.kernel_spec)};
  }
  auto profile = ProfileFor(caps);
  if (!profile.ok()) return Error{options.kernel_spec + ": " + profile.error().message};
  AuditOptions resolved = options;
  std::string note;
  auto oracle = ResolveOracleDevice(options.oracle_device, caps, "--oracle-device", &note);
  if (!oracle.ok()) return oracle.error();
  resolved.cuda_oracle = *oracle;
  audit_internal::Auditor auditor(resolved, **kernel, **baseline, **profile, *dtype);
  auto r = auditor.Run();
  if (r.ok()) r->oracle_note = note;
  return r;
}

}  // namespace attest