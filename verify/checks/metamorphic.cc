// Metamorphic relations (see metamorphic.h). The transformed problems stay inside the
// kernel's capabilities whenever the original does (MHA is GQA's special case; a permutation
// changes no feature; window needs the window claim, checked first), so a refusal of one
// is a failure, not a skip.
#include "verify/checks/metamorphic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "verify/metrics.h"

namespace attest {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The outputs of one kernel run, or the verdicts explaining why there are none.
struct RunOutputs {
  std::optional<std::vector<Verdict>> stop;  // set: no outputs (failure verdicts or none)
  ForwardResult fwd;
  std::optional<BackwardResult> bwd;
};

RunOutputs RunKernel(std::string_view check, Kernel& kernel, const Problem& p, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& dout, bool with_backward,
                     std::string_view what) {
  RunOutputs r;
  auto f = kernel.Forward(p, q, k, v);
  if (auto s = NonOutputVerdicts(check, kernel, p, f, fmt::format("forward ({})", what))) {
    r.stop = std::move(s);
    return r;
  }
  r.fwd = std::get<ForwardResult>(std::move(f));
  if (with_backward) {
    auto b = kernel.Backward(p, q, k, v, r.fwd.o, r.fwd.lse, dout);
    if (auto s = NonOutputVerdicts(check, kernel, p, b, fmt::format("backward ({})", what))) {
      r.stop = std::move(s);
      return r;
    }
    r.bwd = std::get<BackwardResult>(std::move(b));
  }
  return r;
}

// The base run: the context's cached answers.
RunOutputs BaseRun(std::string_view check, CheckContext& ctx, bool with_backward) {
  RunOutputs r;
  const Problem& p = ctx.case_.problem;
  const auto& f = ctx.KernelForward();
  if (auto s = NonOutputVerdicts(check, *ctx.kernel, p, f, "forward")) {
    r.stop = std::move(s);
    return r;
  }
  r.fwd = std::get<ForwardResult>(f);
  if (with_backward) {
    const auto& b = ctx.KernelBackward();
    if (auto s = NonOutputVerdicts(check, *ctx.kernel, p, b, "backward")) {
      r.stop = std::move(s);
      return r;
    }
    r.bwd = std::get<BackwardResult>(b);
  }
  return r;
}

// Whether `got` agrees with what the relation predicts (`expected`): bitwise when ulps is 0,
// else |got - expected| <= ulps * Quantum(row scale) in got's format, the row scale being
// max |scale| over the element's row (rows along the last axis; lse element by element).
// Non-finite values must match exactly.
Verdict Agree(std::string_view check, std::string_view tensor, const Problem& p,
              const Tensor& expected, const Tensor& got, double ulps,
              const Tensor* scale = nullptr) {
  if (got.shape() != expected.shape()) {
    return Failure(check, tensor, "outputs of the relation's shape",
                   fmt::format("{}: shape {} where the relation predicts {}", tensor,
                               ShapeString(got.shape()), ShapeString(expected.shape())));
  }
  const Format f = FormatOf(got.dtype()).value_or(Format::kF64);
  const Tensor e = ToF64(expected), g = ToF64(got);
  const Tensor s = scale != nullptr ? ToF64(*scale) : e;
  const auto se = e.span<const double>(), sg = g.span<const double>(), ss = s.span<const double>();
  const bool per_element = tensor == "lse" || e.rank() == 0;
  const int64_t row = per_element ? 1 : std::max<int64_t>(1, e.shape().back());
  int64_t differing = 0, nonfinite = 0;
  double worst = -1, worst_err = 0, worst_allowed = 0;
  int64_t worst_flat = -1;
  for (int64_t r0 = 0; r0 < static_cast<int64_t>(se.size()); r0 += row) {
    double row_scale = 0;
    for (int64_t e2 = r0; e2 < r0 + row; ++e2) {
      if (std::isfinite(ss[static_cast<size_t>(e2)])) {
        row_scale = std::max(row_scale, std::fabs(ss[static_cast<size_t>(e2)]));
      }
    }
    const double allowed = ulps == 0 ? 0.0 : ulps * Quantum(row_scale, f);
    for (int64_t e2 = r0; e2 < r0 + row; ++e2) {
      const double a = se[static_cast<size_t>(e2)], b = sg[static_cast<size_t>(e2)];
      if (std::memcmp(&a, &b, sizeof(double)) != 0) ++differing;
      double ratio;
      double err;
      if (!std::isfinite(a) || !std::isfinite(b)) {
        if (a == b) continue;  // equal infinities
        ++nonfinite;
        err = kInf;
        ratio = kInf;
      } else {
        err = std::fabs(a - b);
        ratio = ulps == 0 ? (std::memcmp(&a, &b, sizeof(double)) != 0 ? kInf : 0.0)
                          : Margin(err, allowed);
      }
      if (ratio > worst) {
        worst = ratio;
        worst_err = err;
        worst_allowed = allowed;
        worst_flat = e2;
      }
    }
  }
  Verdict v;
  v.check = std::string(check);
  v.tensor = std::string(tensor);
  v.policy = ulps == 0 ? std::string("bitwise equal")
                       : fmt::format("|diff| <= {} {} ulp(row)", ulps, Name(f));
  v.observed = worst_err;
  v.allowed = worst_allowed;
  v.margin = worst < 0 ? 0.0 : worst;
  if (worst_flat >= 0 && v.margin > 0) {
    v.worst = LocateElement(p, tensor, e.shape(), worst_flat);
    v.worst.observed = sg[static_cast<size_t>(worst_flat)];
    v.worst.reference = se[static_cast<size_t>(worst_flat)];
  }
  v.pass = nonfinite == 0 && v.margin <= 1.0;
  v.message = fmt::format(
      "{}: {} of {} element(s) differ bitwise{}; largest |diff| {:.3g} vs allowed {:.3g}{}",
      tensor, differing, se.size(), nonfinite ? fmt::format(" ({} non-finite)", nonfinite) : "",
      worst_err, worst_allowed,
      worst_flat >= 0 && v.margin > 0 ? " at " + v.worst.ToString() : std::string());
  return v;
}

// Axes of a problem's tensors (padded vs packed layouts).
int64_t HeadAxis(const Problem& p, bool lse) {
  if (lse) return p.varlen() ? 0 : 1;
  return p.varlen() ? 1 : 2;
}

}  // namespace

Tensor Gather(const Tensor& t, int64_t axis, const std::vector<int64_t>& src) {
  Shape shape = t.shape();
  shape[static_cast<size_t>(axis)] = static_cast<int64_t>(src.size());
  Tensor out = Tensor::Zeros(t.dtype(), shape);
  for (size_t k = 0; k < src.size(); ++k) {
    out.Narrow(axis, static_cast<int64_t>(k), 1).CopyFrom(t.Narrow(axis, src[k], 1));
  }
  return out;
}

std::vector<Verdict> RunGqaEquivalence(CheckContext& ctx) {
  constexpr std::string_view kCheck = "gqa-mha";
  const Problem& p = ctx.case_.problem;
  if (p.heads_q == p.heads_kv) return {};  // nothing to relate
  const CaseInputs& in = ctx.inputs;
  const bool bwd = ctx.WantsBackward();
  RunOutputs base = BaseRun(kCheck, ctx, bwd);
  if (base.stop) return *base.stop;

  const int64_t r = p.gqa_ratio();
  Problem mha = p;
  mha.heads_kv = p.heads_q;
  std::vector<int64_t> repeat(static_cast<size_t>(p.heads_q));
  for (int64_t h = 0; h < p.heads_q; ++h) repeat[static_cast<size_t>(h)] = p.KvHead(h);
  const int64_t kv_axis = HeadAxis(p, false);
  const Tensor k2 = Gather(in.k, kv_axis, repeat), v2 = Gather(in.v, kv_axis, repeat);
  RunOutputs rel = RunKernel(kCheck, *ctx.kernel, mha, in.q, k2, v2, in.dout, bwd,
                             "MHA with repeated k/v");
  if (rel.stop) return *rel.stop;

  // o, lse, dq: one query head's computation is the same in both problems (the 2-ULP budget
  // admits kernels that tile the GQA case differently).
  std::vector<Verdict> out;
  out.push_back(Agree(kCheck, "o", p, base.fwd.o, rel.fwd.o, 2));
  out.push_back(Agree(kCheck, "lse", p, base.fwd.lse, rel.fwd.lse, 4));
  if (bwd) {
    out.push_back(Agree(kCheck, "dq", p, base.bwd->dq, rel.bwd->dq, 2));
    // dk, dv of a kv head: the sum over its query heads of the MHA gradients (each rounded to
    // the output dtype; the GQA kernel may round once after summing): r/2 + 1 ULPs at the
    // scale of the largest summand.
    for (const char* name : {"dk", "dv"}) {
      const Tensor& mha_grad = std::string_view(name) == "dk" ? rel.bwd->dk : rel.bwd->dv;
      const Tensor& gqa_grad = std::string_view(name) == "dk" ? base.bwd->dk : base.bwd->dv;
      const Tensor wide = ToF64(mha_grad);
      Tensor sum = Tensor::Zeros(DType::kF64, gqa_grad.shape());
      Tensor mag = Tensor::Zeros(DType::kF64, gqa_grad.shape());
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const Tensor src = wide.Select(kv_axis, h).Clone();
        const Tensor dst = sum.Select(kv_axis, p.KvHead(h)).Clone();
        const Tensor dmag = mag.Select(kv_axis, p.KvHead(h)).Clone();
        auto s = src.span<const double>();
        auto d = dst.span<double>();
        auto m = dmag.span<double>();
        for (size_t e = 0; e < s.size(); ++e) {
          d[e] += s[e];
          m[e] = std::max(m[e], std::fabs(s[e]));
        }
        sum.Select(kv_axis, p.KvHead(h)).CopyFrom(dst);
        mag.Select(kv_axis, p.KvHead(h)).CopyFrom(dmag);
      }
      out.push_back(Agree(kCheck, name, p, sum, gqa_grad, static_cast<double>(r) / 2 + 1, &mag));
    }
  }
  for (Verdict& v : out) v.message += fmt::format(" (GQA {}:{} vs MHA)", p.heads_q, p.heads_kv);
  return out;
}

std::vector<Verdict> RunPermutation(CheckContext& ctx) {
  constexpr std::string_view kCheck = "permutation";
  const Problem& p = ctx.case_.problem;
  // Packed batches are not permuted (their cu_seqlens would have to be rebuilt); heads are.
  const bool permute_batch = !p.varlen() && p.batch > 1;
  if (!permute_batch && p.heads_q == 1) return {};  // the identity relates nothing
  const CaseInputs& in = ctx.inputs;
  const bool bwd = ctx.WantsBackward();
  RunOutputs base = BaseRun(kCheck, ctx, bwd);
  if (base.stop) return *base.stop;

  // Batch reversed; kv heads reversed; query heads reversed inside each group, so that query
  // head h' still reads the kv head of its source head.
  std::vector<int64_t> src_b(static_cast<size_t>(p.batch));
  std::iota(src_b.begin(), src_b.end(), 0);
  if (permute_batch) std::reverse(src_b.begin(), src_b.end());
  const int64_t r = p.gqa_ratio();
  std::vector<int64_t> src_kv(static_cast<size_t>(p.heads_kv)), src_q(static_cast<size_t>(p.heads_q));
  for (int64_t g = 0; g < p.heads_kv; ++g) src_kv[static_cast<size_t>(g)] = p.heads_kv - 1 - g;
  for (int64_t h = 0; h < p.heads_q; ++h) {
    src_q[static_cast<size_t>(h)] = src_kv[static_cast<size_t>(h / r)] * r + (r - 1 - h % r);
  }
  Problem pp = p;
  if (p.alibi_slopes) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      (*pp.alibi_slopes)[static_cast<size_t>(h)] =
          (*p.alibi_slopes)[static_cast<size_t>(src_q[static_cast<size_t>(h)])];
    }
  }
  if (permute_batch) {
    for (auto* ids : {&pp.document_ids_q, &pp.document_ids_k}) {
      if (!*ids) continue;
      const auto orig = **ids;
      for (int64_t b = 0; b < p.batch; ++b) {
        (**ids)[static_cast<size_t>(b)] = orig[static_cast<size_t>(src_b[static_cast<size_t>(b)])];
      }
    }
  }
  const int64_t ha = HeadAxis(p, false), hl = HeadAxis(p, true);
  auto perm = [&](const Tensor& t, const std::vector<int64_t>& heads, int64_t head_axis) {
    const Tensor x = permute_batch ? Gather(t, 0, src_b) : t;
    return Gather(x, head_axis, heads);
  };
  const Tensor q2 = perm(in.q, src_q, ha), k2 = perm(in.k, src_kv, ha), v2 = perm(in.v, src_kv, ha);
  const Tensor do2 = bwd ? perm(in.dout, src_q, ha) : Tensor();
  RunOutputs rel = RunKernel(kCheck, *ctx.kernel, pp, q2, k2, v2, do2, bwd,
                             "permuted batch and heads");
  if (rel.stop) return *rel.stop;

  const double ulps = ctx.kernel->capabilities().deterministic ? 0 : 2;
  std::vector<Verdict> out;
  out.push_back(Agree(kCheck, "o", p, perm(base.fwd.o, src_q, ha), rel.fwd.o, ulps));
  out.push_back(Agree(kCheck, "lse", p, perm(base.fwd.lse, src_q, hl), rel.fwd.lse, ulps));
  if (bwd) {
    out.push_back(Agree(kCheck, "dq", p, perm(base.bwd->dq, src_q, ha), rel.bwd->dq, ulps));
    out.push_back(Agree(kCheck, "dk", p, perm(base.bwd->dk, src_kv, ha), rel.bwd->dk, ulps));
    out.push_back(Agree(kCheck, "dv", p, perm(base.bwd->dv, src_kv, ha), rel.bwd->dv, ulps));
  }
  // Locations are those of the permuted problem; say how to map them back.
  for (Verdict& v : out) {
    v.message += fmt::format(" (batch {}, heads reversed{}; coordinates in the permuted run)",
                             permute_batch ? "reversed" : "kept",
                             r > 1 ? " per kv group" : "");
  }
  return out;
}

std::vector<Verdict> RunWindowCausal(CheckContext& ctx) {
  constexpr std::string_view kCheck = "window-causal";
  const Problem& p = ctx.case_.problem;
  const Capabilities caps = ctx.kernel->capabilities();
  if (!p.causal || p.window_left >= 0 || p.window_right >= 0 || p.prefix_lm > 0 || !caps.window) {
    return {};
  }
  const CaseInputs& in = ctx.inputs;
  const bool bwd = ctx.WantsBackward();
  RunOutputs base = BaseRun(kCheck, ctx, bwd);
  if (base.stop) return *base.stop;
  Problem w = p;
  w.causal = false;
  w.window_left = p.seqlen_k;  // reaches every key of the longest sequence
  w.window_right = 0;
  RunOutputs rel = RunKernel(kCheck, *ctx.kernel, w, in.q, in.k, in.v, in.dout, bwd,
                             "window (Sk, 0) without causal");
  if (rel.stop) return *rel.stop;
  std::vector<Verdict> out;
  out.push_back(Agree(kCheck, "o", p, base.fwd.o, rel.fwd.o, 2));
  out.push_back(Agree(kCheck, "lse", p, base.fwd.lse, rel.fwd.lse, 4));
  if (bwd) {
    out.push_back(Agree(kCheck, "dq", p, base.bwd->dq, rel.bwd->dq, 2));
    out.push_back(Agree(kCheck, "dk", p, base.bwd->dk, rel.bwd->dk, 2));
    out.push_back(Agree(kCheck, "dv", p, base.bwd->dv, rel.bwd->dv, 2));
  }
  for (Verdict& v : out) v.message += " (causal vs window (Sk, 0))";
  return out;
}

}  // namespace attest
