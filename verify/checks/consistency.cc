// Forward/backward consistency (see consistency.h; docs/design.md "Checks"): the rounding
// model of a recipe, the kernel run, and CheckConsistency, which runs the identities and the
// constant-V probe (consistency_identities.cc, with their derivations and bounds) and the
// recipe gradient (consistency_recipe_gradient.cc).
#include "verify/checks/consistency.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"
#include "verify/tolerance/baseline.h"
#include "verify/checks/check.h"
#include "verify/checks/consistency_internal.h"

namespace attest {
namespace consistency_detail {

// Forward + backward; an Error string, "" with unsupported = true, or the run.
std::variant<KernelRun, Unsupported, Error> RunKernel(Kernel& kernel, const Problem& p,
                                                      const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& dout,
                                                      const Tensor& sink) {
  auto fwd = p.sink ? kernel.ForwardSink(p, q, k, v, sink) : kernel.Forward(p, q, k, v);
  if (auto* u = std::get_if<Unsupported>(&fwd)) return *u;
  if (auto* e = std::get_if<Error>(&fwd)) return Error{"forward: " + e->message};
  KernelRun r;
  r.sink = sink;
  r.o_raw = std::get<ForwardResult>(fwd).o;
  r.lse_raw = std::get<ForwardResult>(fwd).lse;
  r.o = ToF64(r.o_raw);
  if (r.lse_raw.defined()) r.lse = ToF64(r.lse_raw);  // undefined: the kernel returns no lse
  auto bwd = p.sink ? kernel.BackwardSink(p, q, k, v, r.o_raw, r.lse_raw, dout, sink)
                    : kernel.Backward(p, q, k, v, r.o_raw, r.lse_raw, dout);
  if (auto* u = std::get_if<Unsupported>(&bwd)) return *u;
  if (auto* e = std::get_if<Error>(&bwd)) return Error{"backward: " + e->message};
  const BackwardResult& b = std::get<BackwardResult>(bwd);
  r.dq = ToF64(b.dq);
  r.dk = ToF64(b.dk);
  r.dv = ToF64(b.dv);
  return r;
}

Expected<Operands> OperandsOf(const Recipe& r, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& dout) {
  Operands x;
  std::pair<Tensor*, std::pair<const Tensor*, const OperandQuant*>> items[] = {
      {&x.qs, {&q, &r.qk.a}},   {&x.ks, {&k, &r.qk.b}},    {&x.vo, {&v, &r.pv.b}},
      {&x.dop, {&dout, &r.dov.a}}, {&x.vp, {&v, &r.dov.b}}, {&x.dov, {&dout, &r.pdo.b}},
      {&x.kq, {&k, &r.dsk.b}},  {&x.qk, {&q, &r.dsq.b}}};
  for (auto& [dst, src] : items) {
    Expected<Tensor> t = QuantizeForRecipe(*src.first, *src.second);
    if (!t.ok()) return Error{"recipe " + std::string(r.name) + ": " + t.error().message};
    *dst = std::move(*t);
  }
  // D's dO (recipe.h DeltaDo): as stored, or dO·Vᵀ's own operand.
  x.dout = r.delta_do == DeltaDo::kDovOperand ? x.dop : dout;
  return x;
}

}  // namespace consistency_detail

namespace {

using consistency_detail::Geometry;
using consistency_detail::Identities;
using consistency_detail::kCheck;
using consistency_detail::KernelRun;
using consistency_detail::Operands;
using consistency_detail::OperandsOf;
using consistency_detail::Probe;
using consistency_detail::RecipeGradient;
using consistency_detail::RoundingModel;
using consistency_detail::RunKernel;

// Unit roundoff of a format: half its spacing at 1.
double UnitRoundoff(Format f) { return Quantum(1.0, f) / 2; }

// Relative rounding of an operand scheme (block schemes: their element format's unit
// roundoff; the underflow of elements far below their block's amax is not modelled, which
// matters only for block recipes of the P / dS operands).
double OperandRoundoff(const OperandQuant& q) {
  switch (q.scheme.kind) {
    case OperandKind::kNone: return 0;
    case OperandKind::kElement: return UnitRoundoff(q.scheme.element);
    case OperandKind::kBlock: {
      const Scheme* s = FindScheme(q.scheme.block);
      return s ? UnitRoundoff(s->element) : 0.5;
    }
  }
  return 0;
}

// Half the smallest positive value of an elementwise-rounded operand, in the operand's own
// (unscaled) units: a value in the subnormal range errs by up to this much absolutely, which
// the relative roundoff does not cover (f16 dS of tiny scores times a softcap probe's large
// q). Block schemes and unrounded operands: 0 (see OperandRoundoff).
double OperandTiny(const OperandQuant& q) {
  if (q.scheme.kind != OperandKind::kElement) return 0;
  return Quantum(0.0, q.scheme.element) / 2 / q.scheme.pre_scale;
}

// A block-scaled operand flushes elements far below its block's amax: their absolute error
// reaches half the element format's smallest step at the block's scale, and the scale is at
// most 2 amax / 2^emax (MX RCEIL rounds it up). Returns that error per unit of amax; 0 for
// element and unrounded operands.
double BlockTinyPerAmax(const OperandQuant& q) {
  if (q.scheme.kind != OperandKind::kBlock) return 0;
  const Scheme* s = FindScheme(q.scheme.block);
  if (s == nullptr) return 0;
  return Quantum(0.0, s->element) / std::ldexp(1.0, Spec(s->element).max_exponent());
}

RoundingModel RoundingOf(const Problem& p, const Recipe& r, std::optional<Format> kernel_dp) {
  RoundingModel x;
  const Format in = FormatOf(p.dtype).value_or(Format::kF32);
  const Format out = r.output.value_or(in);
  const Format grad = r.gradients.value_or(in);
  x.u_o = UnitRoundoff(out);
  x.u_g = UnitRoundoff(grad);
  // A scaled output's smallest step is the format's over the scale (recipe.h OutputRounding);
  // the gradients' is the largest of the three (the loosest, so never a false alarm).
  x.tiny_o = MinPositive(out) / r.output_scale;
  x.tiny_g = MinPositive(grad) / *std::min_element(r.gradient_scales.begin(),
                                                   r.gradient_scales.end());
  for (size_t i = 0; i < 3; ++i) {
    if (r.gradient_scales[i] != 1.0) x.sat_g[i] = MaxFinite(grad) / r.gradient_scales[i];
  }
  x.u_pv = OperandRoundoff(r.pv.a);
  x.u_pdo = OperandRoundoff(r.pdo.a);
  x.u_ds = std::max(OperandRoundoff(r.dsk.a), OperandRoundoff(r.dsq.a));
  x.tiny_ds = std::max(OperandTiny(r.dsk.a), OperandTiny(r.dsq.a));
  x.tiny_pdo = OperandTiny(r.pdo.a);
  x.blk_ds_dq = BlockTinyPerAmax(r.dsk.a);
  x.blk_ds_dk = BlockTinyPerAmax(r.dsq.a);
  x.delta_rounded = r.delta == DeltaSource::kRoundedO;
  for (const std::optional<Format>& f : {r.dp, kernel_dp}) {
    if (!f) continue;
    x.u_dp = std::max(x.u_dp, UnitRoundoff(*f));
    x.tiny_dp = std::max(x.tiny_dp, MinPositive(*f) / 2);
  }
  return x;
}

// The power of two that brings the RMS raw score scale·q·k (over visible pairs) up to the
// softcap; 1 when it already is there.
double SoftcapProbeScale(const Problem& p, const CaseInputs& in) {
  const Geometry g{p};
  const double* q = in.q.span<const double>().data();
  const double* k = in.k.span<const double>().data();
  const double scale = p.EffectiveScale();
  double sum2 = 0;
  int64_t n = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView m(p, b);
    const Sequence& s = m.sequence();
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < s.q_len; ++i) {
        ForEachVisibleKey(m, i, [&](int64_t j) {
          double dot = 0;
          for (int64_t d = 0; d < p.head_dim; ++d) {
            dot += q[g.Q(s.q_begin + i, h, d)] * k[g.K(s.k_begin + j, p.KvHead(h), d)];
          }
          sum2 += scale * scale * dot * dot;
          ++n;
        });
      }
    }
  }
  if (n == 0 || sum2 == 0) return 1;
  const double rms = std::sqrt(sum2 / static_cast<double>(n));
  double lambda = std::max(1.0, std::exp2(std::round(std::log2(p.softcap / rms))));
  // Scaling by a power of two is exact only while it stays in range: tiny scores (q of
  // 1e-5 in f16) asked for 2^29 and overflowed f16 q to inf. Keep max|q| x lambda 2^4 below
  // the input format's top binade (headroom for dk = scale sum_i dS q_i).
  double q_max = 0;
  for (const double x : in.q.span<const double>()) q_max = std::max(q_max, std::fabs(x));
  if (const std::optional<Format> f = FormatOf(p.dtype); f && q_max > 0) {
    const double top = std::exp2(Spec(*f).max_exponent() - 4);
    while (lambda > 1 && q_max * lambda > top) lambda /= 2;
  }
  return lambda;
}

const Recipe* DefaultRecipe(const Problem& p) {
  switch (p.dtype) {
    case DType::kBF16: return FindRecipe("bf16");
    case DType::kF16: return FindRecipe("f16");
    default: return nullptr;
  }
}

}  // namespace

std::vector<Verdict> CheckConsistency(Kernel& kernel, const Problem& p, const CaseInputs& in,
                                      const ConsistencyOptions& options, const Recipe* recipe,
                                      const Profile* profile) {
  const Capabilities caps = kernel.capabilities();
  if (!caps.backward || !caps.Covers(p) || !in.dout.defined()) return {};
  if (recipe == nullptr && !caps.recipe.empty()) recipe = FindRecipe(caps.recipe);
  const bool declared = recipe != nullptr;
  if (recipe == nullptr) recipe = DefaultRecipe(p);
  if (recipe == nullptr) return {};  // no rounding model to bound with
  if (profile == nullptr) {
    Expected<const Profile*> pr = ProfileFor(caps);
    if (pr.ok()) profile = *pr;
  }
  // A low-precision family's row (fp8, mxfp8, nvfp4: absolute and cosine bounds, no baseline)
  // with no recipe declared: nothing says which operands the kernel quantises, so the default
  // recipe's bf16 rounding model would judge an MXFP8 kernel's identities and gradient (a
  // correct one failed its recipe gradient by 50x and the probe by 1276x). Consistency needs the
  // recipe (docs/protocol.md "Recipes"); the profile's own checks still judge the kernel.
  if (!declared && profile != nullptr && !profile->needs_baseline()) return {};
  const RoundingModel rd = RoundingOf(p, *recipe, kernel.BackwardDpFormat(p));
  std::vector<Verdict> out;
  // Identities and the recipe gradient on one set of inputs; false when the kernel refused.
  const auto run_on = [&](const CaseInputs& x, const std::string& label) -> bool {
    auto answer = RunKernel(kernel, p, x.q, x.k, x.v, x.dout, x.sink);
    if (std::holds_alternative<Unsupported>(answer)) return false;
    if (auto* e = std::get_if<Error>(&answer)) {
      std::string call(kCheck);
      if (!label.empty()) call += ", " + label.substr(0, label.find_last_not_of(": ") + 1);
      Verdict v = KernelError(kernel, call, e->message);
      v.repro = options.repro;
      out.push_back(v);
      return true;
    }
    const KernelRun& run = std::get<KernelRun>(answer);
    if (options.identities) {
      Expected<Operands> ops = OperandsOf(*recipe, x.q, x.k, x.v, x.dout);
      if (!ops.ok()) {
        Verdict v;
        v.check = std::string(kCheck);
        v.policy = "recipe operands";
        v.margin = std::numeric_limits<double>::infinity();
        v.message = label + ops.error().message;
        v.repro = options.repro;
        out.push_back(v);
      } else if (declared) {
        Identities(p, *ops, run, rd, options.repro, label, out);
      } else {
        // No recipe declared, so nothing says which O D = rowsum(dO∘O) reads: FlashAttention-2
        // reads the rounded O (the default recipe's kRoundedO), a kernel that keeps its fp32
        // O reads that (PyTorch's math backend: golden/findings/sdpa-math-dk-sum-tiny-gqa
        // failed dk-sum by 10x under the rounded O). Both are correct, so the kernel is judged
        // by the one its gradients fit; a wrong D fits neither.
        RoundingModel other = rd;
        other.delta_rounded = !rd.delta_rounded;
        std::vector<Verdict> a, b;
        Identities(p, *ops, run, rd, options.repro, label, a);
        Identities(p, *ops, run, other, options.repro, label, b);
        auto worst = [](const std::vector<Verdict>& vs) {
          double m = 0;
          for (const Verdict& v : vs) m = std::max(m, v.margin);
          return m;
        };
        const bool use_b = worst(b) < worst(a);
        const bool rounded = use_b ? other.delta_rounded : rd.delta_rounded;
        for (Verdict& v : use_b ? b : a) {
          if (v.tensor == "dk") {
            v.message += rounded ? " (no recipe declared: D from the rounded O fits best)"
                                 : " (no recipe declared: D from the fp32 O fits best)";
          }
          out.push_back(std::move(v));
        }
      }
    }
    if (options.recipe_gradient && profile != nullptr) {
      const size_t first = out.size();
      RecipeGradient(p, x, run, *recipe, *profile, kernel.BackwardDpFormat(p), options.repro,
                     out);
      for (size_t n = first; n < out.size(); ++n) out[n].message = label + out[n].message;
    }
    return true;
  };
  if (options.identities || options.recipe_gradient) {
    if (!run_on(in, "")) return {};
    if (!out.empty() && out.back().check == kKernelErrorCheck) {
      return out;
    }
    // Softcap probe: the derivative 1 - tanh²(s/cap) only matters once |s| is comparable to
    // the cap; with unit-variance data and cap 30 it is 1 - O(1e-3), below bf16's rounding of
    // dS, so a backward that drops it hides in the rounding bound. Rerun the identities and
    // the recipe gradient with q scaled by a power of two (exact in every format and block
    // scheme) that puts the RMS score at the cap, where tanh' is ~0.4.
    if (p.softcap > 0) {
      const double lambda = SoftcapProbeScale(p, in);
      if (lambda > 1) {
        CaseInputs x = in;
        x.q = in.q.Clone();
        for (double& e : x.q.span<double>()) e *= lambda;
        run_on(x, fmt::format("softcap probe (q x {}): ", lambda));
      }
    }
  }
  if (options.probe) Probe(kernel, p, in, *recipe, rd, options.repro, out);
  return out;
}

std::vector<Verdict> RunConsistency(CheckContext& ctx) {
  if (ctx.kernel == nullptr) return {};
  if (!ctx.WantsBackward()) {
    ctx.not_applicable = "no backward claimed (or a sampled case)";
    return {};
  }
  ConsistencyOptions options;
  options.repro = ctx.repro;
  std::vector<Verdict> verdicts = CheckConsistency(*ctx.kernel, ctx.case_.problem, ctx.inputs,
                                                   options, nullptr, ctx.profile);
  Finish(verdicts, ctx);
  return verdicts;
}

}  // namespace attest
