// `attest audit`'s data collection (see audit.h; docs/audit.md). Everything is measured with
// the library that judges kernels elsewhere: the float64 oracle, Compare (metrics.h), the
// accuracy, non-interference and consistency checks, generator case files. The leak maps are
// the non-interference check's perturbation (largest finite values written into inputs a row
// must not see) swept block by block, so that a leak shows where it happens.
#include "run/audit/audit.h"

#include <algorithm>
#include <bit>
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
#include "reference/problem/mask.h"
#include "reference/recipes/recipe.h"
#include "verify/checks/accuracy.h"
#include "verify/checks/check.h"
#include "verify/checks/consistency.h"
#include "verify/checks/noninterference.h"
#include "verify/metrics/metrics.h"
#include "verify/report/repro.h"
#include "verify/report/report.h"
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

namespace {

using Clock = std::chrono::steady_clock;

// Outputs of one kernel call pair, widened to f64.
struct Outputs {
  Tensor o, lse, dq, dk, dv;
  std::string note;  // set when there are no outputs
  bool ok() const { return o.defined(); }
};

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

// Size of a change between two values as the non-interference check counts it: 0 when the
// bits are equal, |a - b| otherwise (the smallest positive double for +0 / -0, inf when not
// finite), so that a nonzero cell always means "some bit moved".
double Change(double a, double b) {
  if (std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b)) return 0;
  const double d = std::fabs(a - b);
  if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
  return d > 0 ? d : std::numeric_limits<double>::denorm_min();
}

double MaxAbs(const Tensor& t) {
  double m = 0;
  for (double x : t.span<const double>()) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// The non-interference check's "large" perturbation (noninterference.cc explains the 2^60 /
// 2^16 limits): the value that moves a shared block scale the most while keeping every
// product finite.
double LargeValue(double x, Format f, bool query_side) {
  const double sign = std::signbit(x) ? -1.0 : 1.0;
  return sign * std::min(MaxFinite(f), query_side ? 0x1p16 : 0x1p60);
}

class Auditor {
 public:
  Auditor(const AuditOptions& options, Kernel& kernel, Kernel& baseline, const Profile& profile,
          DType dtype)
      : opt_(options), kernel_(kernel), baseline_(baseline), profile_(profile), dtype_(dtype) {
    caps_ = kernel.capabilities();
    backward_ = caps_.backward;
    // A kernel without a causal mask gets its curves, consistency and bias cases unmasked
    // (else every one of them would be "not applicable" and the audit judge nothing).
    causal_ = caps_.causal;
    baseline_backward_ = baseline.capabilities().backward;
    oracle_.threads = options.threads;
  }

  Expected<AuditResult> Run();

 private:
  void Step(const std::string& what) {
    if (opt_.progress) opt_.progress({done_, total_, what});
    ++done_;
  }
  // "causal" or "non-causal", as the sweeps and cases are run (causal_).
  std::string_view MaskWord() const { return causal_ ? "causal" : "non-causal"; }
  Problem MakeProblem(int64_t s, int64_t d, bool causal) const {
    Problem p;
    p.batch = 1;
    p.heads_q = p.heads_kv = opt_.plan.heads;
    p.seqlen_q = p.seqlen_k = s;
    p.head_dim = p.head_dim_v = d;
    p.dtype = dtype_;
    p.causal = causal;
    return p;
  }
  Case MakeCase(const Problem& p, std::string generator, uint64_t row) const {
    Case c;
    c.problem = p;
    const nlohmann::json& all = opt_.plan.distribution_params;
    nlohmann::json params = all.is_object() && all.contains(generator) ? all[generator]
                                                                       : nlohmann::json::object();
    c.generator = GeneratorSpec{std::move(generator), MixSeed(opt_.seed, row), std::move(params)};
    return c;
  }
  // Saves a failing verdict's case into out_dir/cases and points its repro line at it.
  Status SaveRepro(Verdict& v, const Case& c) {
    if (v.pass || opt_.out_dir.empty()) return {};
    auto path = SaveFailureCase(c, opt_.out_dir / "cases", opt_.kernel_spec, v);
    if (!path.ok()) return path.error();
    v.repro = ReproCommand(opt_.kernel_spec, *path, v.check);
    return {};
  }
  Expected<AuditCase> Measure(const std::string& label, const Case& c, bool judge);
  Status MeasureLeakMaps(AuditResult& r);
  Status MeasureNonInterference(AuditResult& r);
  Status MeasureConsistency(AuditResult& r);
  Status MeasureBias(AuditResult& r);

  const AuditOptions& opt_;
  Kernel& kernel_;
  Kernel& baseline_;
  const Profile& profile_;
  DType dtype_;
  Capabilities caps_;
  bool backward_ = false;
  bool causal_ = true;
  bool baseline_backward_ = false;
  OracleOptions oracle_;
  int64_t done_ = 0, total_ = 0;
  uint64_t row_ = 0;  // case counter mixed into generator seeds
};

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

Status Auditor::MeasureLeakMaps(AuditResult& r) {
  const AuditPlan& plan = opt_.plan;
  Problem p = MakeProblem(plan.leak_seqlen, plan.seqlen_head_dim, true);
  p.heads_q = p.heads_kv = 1;
  r.leak.problem = p;
  const int64_t bs = plan.leak_block;
  const int64_t nb = (p.seqlen_q + bs - 1) / bs;
  const int64_t s = p.seqlen_q;
  const Case c = MakeCase(p, "gaussian", ++row_);
  auto in = MakeCaseInputs(c);
  if (!in.ok()) return in.error();
  const Format fmt = FormatOf(dtype_).value_or(Format::kBF16);
  const MaskView mask(p, 0);
  const bool bwd = backward_;

  auto new_map = [&](std::string tensor, std::string rows, std::string cols, std::string pert) {
    LeakMap m;
    m.tensor = std::move(tensor);
    m.row_label = std::move(rows);
    m.col_label = std::move(cols);
    m.perturbation = std::move(pert);
    m.block = bs;
    m.rows = m.cols = nb;
    m.cells.assign(static_cast<size_t>(nb * nb), std::numeric_limits<double>::quiet_NaN());
    return m;
  };
  // "2^60" when the value is a power of two, else its shortest decimal.
  auto value_text = [](double v) {
    int e = 0;
    return std::frexp(v, &e) == 0.5 ? fmt::format("2^{}", e - 1) : fmt::format("{:g}", v);
  };
  const std::string key_pert =
      fmt::format("k and v of every key of the column's block set to ±{}, sign kept",
                  value_text(std::min(MaxFinite(fmt), 0x1p60)));
  const std::string query_pert =
      fmt::format("q and dO of every query of the column's block set to ±{}, sign kept",
                  value_text(std::min(MaxFinite(fmt), 0x1p16)));
  LeakMap mo = new_map("o", "query block", "perturbed key block", key_pert);
  LeakMap mdq = new_map("dq", "query block", "perturbed key block", key_pert);
  LeakMap mkv = new_map("dk,dv", "key block", "perturbed query block", query_pert);

  const Outputs base = RunKernel(kernel_, p, in->q, in->k, in->v, in->dout, bwd);
  if (!base.ok()) {
    mo.note = mdq.note = mkv.note = base.note;
    r.leak.maps = {mo};
    if (bwd) r.leak.maps.push_back(mdq), r.leak.maps.push_back(mkv);
    return {};
  }
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  // Per-row largest change of a [1, S, 1, width] tensor, relative to max |base|.
  auto row_changes = [&](const Tensor& a, const Tensor& b, int64_t width) {
    std::vector<double> out(static_cast<size_t>(s), 0.0);
    if (!a.defined() || !b.defined()) return out;
    const double norm = std::max(MaxAbs(a), std::numeric_limits<double>::min());
    const auto x = a.span<const double>();
    const auto y = b.span<const double>();
    for (int64_t i = 0; i < s; ++i) {
      double m = 0;
      for (int64_t e = i * width; e < (i + 1) * width; ++e) {
        m = std::max(m, Change(x[static_cast<size_t>(e)], y[static_cast<size_t>(e)]));
      }
      out[static_cast<size_t>(i)] = m / norm;
    }
    return out;
  };
  auto set_rows = [&](Tensor& t, int64_t begin, int64_t end, int64_t width, bool query_side) {
    t = t.Clone();
    auto span = t.span<double>();
    for (int64_t e = begin * width; e < std::min(end, s) * width; ++e) {
      span[static_cast<size_t>(e)] = LargeValue(span[static_cast<size_t>(e)], fmt, query_side);
    }
  };
  // Forward direction: perturb key block kb; judge o and dq of rows blind to every key of it.
  for (int64_t kb = 0; kb < nb; ++kb) {
    Step(fmt::format("leak map: keys {}..{}", kb * bs, std::min(s, (kb + 1) * bs) - 1));
    Tensor k = in->k, v = in->v;
    set_rows(k, kb * bs, (kb + 1) * bs, d, false);
    set_rows(v, kb * bs, (kb + 1) * bs, dv, false);
    const Outputs pert = RunKernel(kernel_, p, in->q, k, v, in->dout, bwd);
    if (!pert.ok()) {
      mo.note = "kernel gave no outputs on a perturbed input: " + pert.note;
      continue;
    }
    const std::vector<double> co = row_changes(base.o, pert.o, dv);
    const std::vector<double> cq = row_changes(base.dq, pert.dq, d);
    for (int64_t qb = 0; qb < nb; ++qb) {
      double wo = -1, wq = -1;
      for (int64_t i = qb * bs; i < std::min(s, (qb + 1) * bs); ++i) {
        bool blind = true;
        for (int64_t j = kb * bs; j < std::min(s, (kb + 1) * bs) && blind; ++j) {
          blind = !mask.Visible(i, j);
        }
        if (!blind) continue;
        wo = std::max(wo, co[static_cast<size_t>(i)]);
        wq = std::max(wq, cq[static_cast<size_t>(i)]);
      }
      if (wo >= 0) mo.cells[static_cast<size_t>(qb * nb + kb)] = wo;
      if (wq >= 0 && bwd) mdq.cells[static_cast<size_t>(qb * nb + kb)] = wq;
    }
  }
  // Backward direction: perturb q and dO of query block qb; judge dk and dv of keys that no
  // query of the block sees.
  if (bwd) {
    for (int64_t qb = 0; qb < nb; ++qb) {
      Step(fmt::format("leak map: queries {}..{}", qb * bs, std::min(s, (qb + 1) * bs) - 1));
      Tensor q = in->q, dout = in->dout;
      set_rows(q, qb * bs, (qb + 1) * bs, d, true);
      set_rows(dout, qb * bs, (qb + 1) * bs, dv, true);
      const Outputs pert = RunKernel(kernel_, p, q, in->k, in->v, dout, true);
      if (!pert.ok() || !pert.dk.defined()) {
        mkv.note = "kernel gave no outputs on a perturbed input: " + pert.note;
        continue;
      }
      const std::vector<double> ck = row_changes(base.dk, pert.dk, d);
      const std::vector<double> cv = row_changes(base.dv, pert.dv, dv);
      for (int64_t kb = 0; kb < nb; ++kb) {
        double w = -1;
        for (int64_t j = kb * bs; j < std::min(s, (kb + 1) * bs); ++j) {
          bool unseen = true;
          for (int64_t i = qb * bs; i < std::min(s, (qb + 1) * bs) && unseen; ++i) {
            unseen = !mask.Visible(i, j);
          }
          if (!unseen) continue;
          w = std::max({w, ck[static_cast<size_t>(j)], cv[static_cast<size_t>(j)]});
        }
        if (w >= 0) mkv.cells[static_cast<size_t>(kb * nb + qb)] = w;
      }
    }
  }
  r.leak.maps = {std::move(mo)};
  if (bwd) {
    r.leak.maps.push_back(std::move(mdq));
    r.leak.maps.push_back(std::move(mkv));
  } else {
    mdq.note = mkv.note = "the kernel has no backward";
  }
  for (LeakMap& m : r.leak.maps) {
    for (double x : m.cells) {
      if (std::isnan(x)) continue;
      ++m.judged_cells;
      if (x != 0) ++m.leaking_cells;
      m.max_change = std::max(m.max_change, x);
    }
  }
  return {};
}

Status Auditor::MeasureNonInterference(AuditResult& r) {
  const AuditPlan& plan = opt_.plan;
  std::vector<NonInterferenceCase> cases;
  auto add = [&](std::string label, const Problem& p) {
    NonInterferenceCase n;
    n.label = std::move(label);
    n.c = MakeCase(p, "gaussian", ++row_);
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence sq = SequenceOf(p, b);
      n.size += sq.q_len * sq.k_len;
    }
    cases.push_back(std::move(n));
  };
  const int64_t d = plan.seqlen_head_dim;
  for (int64_t s : plan.ni_seqlens) add(fmt::format("causal S={}", s), MakeProblem(s, d, true));
  const int64_t big = plan.ni_seqlens.empty() ? 64 : plan.ni_seqlens.back();
  {
    Problem p = MakeProblem(big, d, true);
    p.seqlen_q = big / 2;
    add(fmt::format("causal Sq={} < Sk={}", p.seqlen_q, p.seqlen_k), p);
  }
  {
    // A left window short enough that the middle row (the check's first pivot) hides keys.
    Problem p = MakeProblem(big, d, false);
    p.window_left = std::max<int64_t>(4, big / 8);
    p.window_right = 0;
    add(fmt::format("window ({}, 0) S={}", p.window_left, big), p);
  }
  {
    // Three packed documents, the middle one empty, none a multiple of 32 long: every
    // document boundary falls inside a 32-block.
    Problem p = MakeProblem(big, d, false);
    const int32_t a = static_cast<int32_t>(big / 2 + 3), b = static_cast<int32_t>(big - 5);
    p.batch = 3;
    p.cu_seqlens_q = p.cu_seqlens_k = std::vector<int32_t>{0, a, a, a + b};
    p.seqlen_q = p.seqlen_k = std::max(a, b);
    add(fmt::format("packed documents {}, 0, {}", a, b), p);
  }
  {
    // Two dense sequences, no mask: the only thing the second may not see is the first. A
    // scale shared across the batch (a per-tensor amax) moves it; every kernel claims this.
    Problem p = MakeProblem(big, d, false);
    p.batch = 2;
    add(fmt::format("dense batch 2 S={}", big), p);
  }
  std::stable_sort(cases.begin(), cases.end(),
                   [](const auto& x, const auto& y) { return x.size < y.size; });
  for (NonInterferenceCase& n : cases) {
    Step("non-interference: " + n.label);
    std::string why;
    if (!caps_.Covers(n.c.problem, &why)) {
      n.note = "not applicable: the kernel does not claim " + why;
      continue;
    }
    auto in = MakeCaseInputs(n.c);
    if (!in.ok()) return Error{n.label + ": " + in.error().message};
    NonInterferenceOptions o;
    o.seed = n.c.generator->seed;  // as `attest repro` on the saved case draws it
    o.repro = AuditCommand(opt_.kernel_spec, opt_.seed);
    n.verdicts = CheckNonInterference(kernel_, n.c.problem, *in, o);
    if (n.verdicts.empty()) n.note = "not applicable: nothing is hidden from any row";
    for (const Verdict& v : n.verdicts) {
      if (v.pass) continue;
      if (v.check == kKernelErrorCheck) {
        if (n.kernel_error.empty()) n.kernel_error = v.message;
      } else {
        n.leaks = true;
      }
    }
  }
  r.non_interference.cases = std::move(cases);
  for (size_t i = 0; i < r.non_interference.cases.size(); ++i) {
    NonInterferenceCase& n = r.non_interference.cases[i];
    if (!n.kernel_error.empty()) ++r.non_interference.kernel_errors;
    for (Verdict& v : n.verdicts) {
      if (v.pass) continue;
      if (r.non_interference.smallest_leak < 0 && v.check != kKernelErrorCheck) {
        r.non_interference.smallest_leak = static_cast<int>(i);
        if (!opt_.out_dir.empty()) {
          auto path = SaveFailureCase(n.c, opt_.out_dir, opt_.kernel_spec, v);
          if (!path.ok()) return path.error();
          r.non_interference.case_file = path->string();
          r.non_interference.repro = ReproCommand(opt_.kernel_spec, *path);
        }
      }
      if (Status s = SaveRepro(v, n.c); !s.ok()) return s;
    }
  }
  return {};
}

Status Auditor::MeasureConsistency(AuditResult& r) {
  const int64_t s = opt_.plan.consistency_seqlen, d = opt_.plan.seqlen_head_dim;
  std::vector<ConsistencyCase> cases;
  auto add = [&](std::string label, const Problem& p) {
    ConsistencyCase c;
    c.label = std::move(label);
    c.c = MakeCase(p, "gaussian", ++row_);
    cases.push_back(std::move(c));
  };
  const std::string_view mask = causal_ ? " causal" : "";
  add(fmt::format("S={}", s), MakeProblem(s, d, false));
  if (causal_) {
    add(fmt::format("causal S={}", s), MakeProblem(s, d, true));
  } else {
    Problem p = MakeProblem(s, d, false);
    p.seqlen_q = s / 2;
    add(fmt::format("Sq={} < Sk={}", p.seqlen_q, s), p);
  }
  {
    Problem p = MakeProblem(s, d, causal_);
    p.heads_q = 4;
    p.heads_kv = 2;
    add(fmt::format("GQA 4:2{} S={}", mask, s), p);
  }
  {
    Problem p = MakeProblem(s, d, causal_);
    const int32_t a = static_cast<int32_t>(s / 2 + 3), b = static_cast<int32_t>(s - 7);
    p.batch = 2;
    p.cu_seqlens_q = p.cu_seqlens_k = std::vector<int32_t>{0, a, a + b};
    p.seqlen_q = p.seqlen_k = std::max(a, b);
    add(fmt::format("packed documents {}, {}{}", a, b, mask), p);
  }
  for (ConsistencyCase& c : cases) {
    Step("consistency: " + c.label);
    std::string why;
    if (!backward_) {
      c.note = "not applicable: the kernel has no backward";
      continue;
    }
    if (!caps_.Covers(c.c.problem, &why)) {
      c.note = "not applicable: the kernel does not claim " + why;
      continue;
    }
    auto in = MakeCaseInputs(c.c);
    if (!in.ok()) return Error{c.label + ": " + in.error().message};
    ConsistencyOptions o;
    o.repro = AuditCommand(opt_.kernel_spec, opt_.seed);
    c.verdicts = CheckConsistency(kernel_, c.c.problem, *in, o, nullptr, &profile_);
    if (c.verdicts.empty()) c.note = "not applicable to this case";
    for (Verdict& v : c.verdicts) {
      if (Status st = SaveRepro(v, c.c); !st.ok()) return st;
    }
  }
  r.consistency = std::move(cases);
  return {};
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
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (opt_.progress) opt_.progress({total_, total_, "done"});
  return r;
}

}  // namespace

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
  Auditor auditor(resolved, **kernel, **baseline, **profile, *dtype);
  auto r = auditor.Run();
  if (r.ok()) r->oracle_note = note;
  return r;
}

}  // namespace attest
