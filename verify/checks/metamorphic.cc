// Metamorphic relations (see metamorphic.h): gqa-mha, permutation and window-causal, and the
// helpers every relation shares (metamorphic_internal.h); padding is metamorphic_padding.cc.
// The transformed problems stay inside the kernel's capabilities whenever the original does
// (MHA is GQA's special case; a permutation changes no feature; window needs the window
// claim, checked first), so a refusal of one is a failure, not a skip.
#include "verify/checks/metamorphic.h"
#include "verify/checks/metamorphic_internal.h"
#include "verify/checks/relation_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <span>
#include <string>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "reference/formats/quantize.h"
#include "reference/problem/mask.h"
#include "reference/recipes/recipe.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/term_scale.h"
#include "verify/tolerance/tolerance.h"

namespace attest {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Axes of a problem's tensors (padded vs packed layouts).
int64_t HeadAxis(const Problem& p, bool lse) {
  if (lse) return p.varlen() ? 0 : 1;
  return p.varlen() ? 1 : 2;
}

// The format the kernel accumulates its sums in (its recipe's; fp32 where it names none).
Format AccumulateFormat(const CheckContext& ctx) {
  if (ctx.profile == nullptr) return Format::kF32;
  const Recipe* r = FindRecipe(ctx.profile->name);
  if (r == nullptr && !ctx.profile->baseline_recipe.empty()) {
    r = FindRecipe(ctx.profile->baseline_recipe);
  }
  return r != nullptr ? r->accumulate : Format::kF32;
}

}  // namespace

namespace metamorphic_detail {

RunOutputs RunKernel(std::string_view check, Kernel& kernel, const Problem& p, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& dout, bool with_backward,
                     std::string_view what, const Tensor* sink) {
  RunOutputs r;
  const bool with_sink = p.sink && sink != nullptr;
  auto f = with_sink ? kernel.ForwardSink(p, q, k, v, *sink) : kernel.Forward(p, q, k, v);
  if (auto s = NonOutputVerdicts(check, kernel, p, f, fmt::format("forward ({})", what))) {
    r.stop = std::move(s);
    return r;
  }
  r.fwd = std::get<ForwardResult>(std::move(f));
  if (with_backward) {
    auto b = with_sink ? kernel.BackwardSink(p, q, k, v, r.fwd.o, r.fwd.lse, dout, *sink)
                       : kernel.Backward(p, q, k, v, r.fwd.o, r.fwd.lse, dout);
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
// else |got - expected| <= ulps * Quantum(row scale) in UlpFormat, the row scale being
// max |scale| over the element's row (rows along the last axis; lse element by element).
// Non-finite values must match: equal infinities, or NaN on both sides (any payload).
// `extra` (f64, expected's shape) adds a per-element allowance on top of the ulps budget.
Verdict Agree(std::string_view check, std::string_view tensor, const Problem& p,
              const Profile* profile, const Tensor& expected, const Tensor& got, double ulps,
              const Tensor* scale, const Tensor* extra) {
  if (!expected.defined() || !got.defined()) {  // a claimed output missing (unwritten-outputs)
    return Failure(check, tensor, "outputs the kernel claims",
                   fmt::format("{}: not returned by one of the two runs", tensor));
  }
  if (got.shape() != expected.shape()) {
    return Failure(check, tensor, "outputs of the relation's shape",
                   fmt::format("{}: shape {} where the relation predicts {}", tensor,
                               ShapeString(got.shape()), ShapeString(expected.shape())));
  }
  const Format f = UlpFormat(profile, tensor, got);
  // A scaled output rounding (a declared recipe's E4M3 gradients at a static scale) saturates
  // at MaxFinite / scale: where either run reached it, the relation's sum or sharing no longer
  // holds for the values written (sat(a + b) != sat(a) + sat(b)), so such elements are not
  // compared, and counted; accuracy judges them against the recipe, which saturates too.
  const double fscale = UlpFormatScale(profile, tensor);
  const double saturated = fscale != 1.0 ? MaxFinite(f) / fscale : kInf;
  int64_t skipped_saturated = 0;
  const Tensor e = ToF64(expected), g = ToF64(got);
  const Tensor s = scale != nullptr ? ToF64(*scale) : e;
  const auto se = e.span<const double>(), sg = g.span<const double>(), ss = s.span<const double>();
  const Tensor x = extra != nullptr ? ToF64(*extra) : Tensor();
  const std::span<const double> sx = extra != nullptr ? x.span<const double>()
                                                      : std::span<const double>();
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
    const double row_allowed =
        ulps == 0 ? 0.0 : ulps * Quantum(row_scale * fscale, f) / fscale;
    for (int64_t e2 = r0; e2 < r0 + row; ++e2) {
      const double a = se[static_cast<size_t>(e2)], b = sg[static_cast<size_t>(e2)];
      // (`scale`, where given, is the largest summand: GQA's dk from saturated MHA terms.)
      if (std::fabs(a) >= saturated || std::fabs(b) >= saturated ||
          std::fabs(ss[static_cast<size_t>(e2)]) >= saturated) {
        ++skipped_saturated;
        continue;
      }
      const double allowed = row_allowed + (sx.empty() ? 0.0 : sx[static_cast<size_t>(e2)]);
      if (std::memcmp(&a, &b, sizeof(double)) != 0) ++differing;
      double ratio;
      double err;
      if (!std::isfinite(a) || !std::isfinite(b)) {
        // Equal infinities, or NaN on both sides: the relation holds (a NaN is
        // special-values' finding, not a broken relation).
        if (a == b || (std::isnan(a) && std::isnan(b))) continue;
        ++nonfinite;
        err = kInf;
        ratio = kInf;
      } else {
        err = std::fabs(a - b);
        ratio = allowed == 0 ? (std::memcmp(&a, &b, sizeof(double)) != 0 ? kInf : 0.0)
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
  v.policy = ulps == 0 && extra == nullptr ? std::string("bitwise equal")
             : extra == nullptr
                 ? fmt::format("|diff| <= {} {} ulp(row)", ulps, Name(f))
                 : fmt::format("|diff| <= {} {} ulp(row) + rounding allowance", ulps, Name(f));
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
  if (skipped_saturated > 0) {
    v.message += fmt::format("; {} saturated element(s) (|x| >= {:.3g}, the format's maximum "
                             "over its scale) not compared",
                             skipped_saturated, saturated);
  }
  return v;
}

// The scale lse's ulps are counted at in a relation: |lse| + ln(longest key sequence).
// A kernel forms lse = m + ln(l) in fp32 (m the row's largest score, l <= Sk its rescaled
// sum), so its rounding follows |m| <= |lse| + ln(Sk) and ln(l), not the sum, which can
// cancel: the H200's flex-triton and a CPU model retiled by padding moved an lse of -0.0175 by
// 1.2e-7 (one ulp of the terms, sixteen of the result).
Tensor LseScale(const Problem& p, const Tensor& lse) {
  if (!lse.defined()) return lse;
  int64_t longest = 1;
  for (int64_t b = 0; b < p.batch; ++b) longest = std::max(longest, SequenceOf(p, b).k_len);
  const double log_sk = std::log(static_cast<double>(longest));
  Tensor out = ToF64(lse).Clone();
  for (double& x : out.span<double>()) {
    if (std::isfinite(x)) x = std::fabs(x) + log_sk;
  }
  return out;
}

// SumOrderBound on the case's own problem, P from the run's lse (the oracle's where the kernel
// returns none).
OrderAllowance CaseOrderBound(CheckContext& ctx, const Tensor& o, const Tensor& lse) {
  const Tensor& l = JudgesLse(*ctx.kernel) && lse.defined() ? lse : ctx.OracleForward().lse;
  return SumOrderBound(ctx.case_.problem, ctx.inputs, o, l, AccumulateFormat(ctx));
}


// The longest block, in positions, of the kernel's recipe operands that are block-scaled along
// the sequence (recipe.h QuantAxis::kSequence; cpu/mxfp8-cudnn: V, dO, K, Q copies and dS in
// MXFP8 blocks of 32 positions along the packed token axis), 0 when there are none or the
// kernel's profile names no recipe. Such a recipe shares one scale among the positions of a
// block, so a relation that shifts positions by other than whole blocks, or puts new tokens
// into a real token's block, changes scales legitimately (the same design leak that
// non-interference reports): the relations below keep the block grid for them instead.
int64_t SequenceBlock(const CheckContext& ctx) {
  if (ctx.profile == nullptr) return 0;
  const Recipe* r = FindRecipe(ctx.profile->name);
  if (r == nullptr && !ctx.profile->baseline_recipe.empty()) {
    r = FindRecipe(ctx.profile->baseline_recipe);
  }
  if (r == nullptr) return 0;
  int64_t block = 0;
  for (const GemmQuant* g : {&r->qk, &r->pv, &r->dov, &r->pdo, &r->dsk, &r->dsq}) {
    for (const OperandQuant* o : {&g->a, &g->b}) {
      if (o->axis != QuantAxis::kSequence || o->scheme.kind != OperandKind::kBlock) continue;
      int64_t n = o->scheme.block_options.block_size.value_or(0);
      if (n == 0) {
        if (const Scheme* sc = FindScheme(o->scheme.block)) n = sc->block_cols;
      }
      block = std::max(block, n);
    }
  }
  return block;
}

}  // namespace metamorphic_detail

namespace {

using metamorphic_detail::Agree;
using metamorphic_detail::BaseRun;
using metamorphic_detail::CaseOrderBound;
using metamorphic_detail::LseScale;
using metamorphic_detail::RunKernel;
using metamorphic_detail::RunOutputs;
using metamorphic_detail::SequenceBlock;

}  // namespace

Tensor Gather(const Tensor& t, int64_t axis, const std::vector<int64_t>& src) {
  if (!t.defined()) return t;  // an output the kernel did not return: Agree reports it
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
  if (p.heads_q == p.heads_kv) {  // nothing to relate
    ctx.not_applicable = "Hq = Hkv: no GQA group to relate to MHA";
    return {};
  }
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
  // The two calls reach the kernel with other shapes and strides, and may sum in another
  // order: SumOrderBound for o and dv, RecomputeBound for dq and dk.
  const OrderAllowance order = CaseOrderBound(ctx, base.fwd.o, base.fwd.lse);
  std::vector<Verdict> out;
  out.push_back(Agree(kCheck, "o", p, ctx.profile, base.fwd.o, rel.fwd.o, 2, nullptr,
                      order.o_or_null()));
  if (JudgesLse(*ctx.kernel)) {
    const Tensor lse_scale = LseScale(p, base.fwd.lse);
    out.push_back(Agree(kCheck, "lse", p, ctx.profile, base.fwd.lse, rel.fwd.lse, 4, &lse_scale));
  }
  // A kernel that declares another dP rounding point for the MHA problem runs another
  // backward there: dq and dk then also differ by what that rounding moves (DpRoundingBound).
  std::string dp_note;
  const std::optional<DpRoundingAllowance> dp_allowance =
      DpAllowance(ctx, mha, base.fwd, base.bwd.has_value(), &dp_note);
  if (bwd) {
    const RecomputeAllowance extra = RecomputeBound(
        ctx, p, in, base.fwd.o, base.fwd.lse, rel.fwd.o, rel.fwd.lse,
        [&] { return ctx.OracleForward().lse; }, dp_allowance ? &*dp_allowance : nullptr);
    out.push_back(Agree(kCheck, "dq", p, ctx.profile, base.bwd->dq, rel.bwd->dq, 2, nullptr,
                        extra.dq_or_null()));
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
      const Tensor* more = std::string_view(name) == "dk" ? extra.dk_or_null()
                                                          : order.dv_or_null();
      out.push_back(Agree(kCheck, name, p, ctx.profile, sum, gqa_grad,
                          static_cast<double>(r) / 2 + 1, &mag, more));
    }
  }
  for (Verdict& v : out) {
    v.message += fmt::format(" (GQA {}:{} vs MHA{})", p.heads_q, p.heads_kv, dp_note);
  }
  return out;
}

std::vector<Verdict> RunPermutation(CheckContext& ctx) {
  constexpr std::string_view kCheck = "permutation";
  const Problem& p = ctx.case_.problem;
  // Batch entries are permuted in both layouts: padded entries along the batch axis, packed
  // sequences by rebuilding cu_seqlens and gathering their token rows (every sequence moves
  // to another offset of the packed axis).
  // A recipe blocked along the packed token axis (SequenceBlock) would see its blocks regrouped
  // when the sequences move, which changes scales legitimately: there only heads move.
  const bool seq_blocked_packed = p.varlen() && SequenceBlock(ctx) > 0;
  const bool permute_batch = p.batch > 1 && !seq_blocked_packed;
  if (!permute_batch && p.heads_q == 1) {  // the identity relates nothing
    ctx.not_applicable = "one sequence and one head: no permutation to apply";
    return {};
  }
  const CaseInputs& in = ctx.inputs;
  const bool bwd = ctx.WantsBackward();
  RunOutputs base = BaseRun(kCheck, ctx, bwd);
  if (base.stop) return *base.stop;

  // Batch reversed; kv heads reversed; query heads reversed inside each group, so that query
  // head h' still reads the kv head of its source head (and MQA still moves heads). A kernel
  // that sums dk / dv over a group's heads in head order then adds them in another order:
  // PyTorch's math backend moved by one bf16 ulp on the H200, so the relation allows a few
  // ulps of the row (below) rather than bitwise equality.
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
  // Source rows along the token axis (packed) or the batch axis (padded).
  std::vector<int64_t> src_q_rows = src_b, src_k_rows = src_b;
  if (permute_batch) {
    for (auto* ids : {&pp.document_ids_q, &pp.document_ids_k}) {
      if (!*ids) continue;
      const auto orig = **ids;
      for (int64_t b = 0; b < p.batch; ++b) {
        (**ids)[static_cast<size_t>(b)] = orig[static_cast<size_t>(src_b[static_cast<size_t>(b)])];
      }
    }
    if (p.varlen()) {
      std::vector<int32_t> cq = {0}, ck = {0};
      src_q_rows.clear();
      src_k_rows.clear();
      for (int64_t b : src_b) {
        const Sequence s = SequenceOf(p, b);
        for (int64_t i = 0; i < s.q_len; ++i) src_q_rows.push_back(s.q_begin + i);
        for (int64_t j = 0; j < s.k_len; ++j) src_k_rows.push_back(s.k_begin + j);
        cq.push_back(cq.back() + static_cast<int32_t>(s.q_len));
        ck.push_back(ck.back() + static_cast<int32_t>(s.k_len));
      }
      pp.cu_seqlens_q = cq;
      pp.cu_seqlens_k = ck;
    }
  }
  const int64_t ha = HeadAxis(p, false), hl = HeadAxis(p, true);
  // Packed lse is [Hq, total_q]: its token axis is 1; every other tensor's rows are axis 0.
  auto perm = [&](const Tensor& t, const std::vector<int64_t>& heads, int64_t head_axis,
                  const std::vector<int64_t>& rows, int64_t row_axis) {
    const Tensor x = permute_batch ? Gather(t, row_axis, rows) : t;
    return Gather(x, head_axis, heads);
  };
  const int64_t lse_rows = p.varlen() ? 1 : 0;
  const Tensor q2 = perm(in.q, src_q, ha, src_q_rows, 0);
  const Tensor k2 = perm(in.k, src_kv, ha, src_k_rows, 0);
  const Tensor v2 = perm(in.v, src_kv, ha, src_k_rows, 0);
  const Tensor do2 = bwd ? perm(in.dout, src_q, ha, src_q_rows, 0) : Tensor();
  RunOutputs rel = RunKernel(kCheck, *ctx.kernel, pp, q2, k2, v2, do2, bwd,
                             "permuted batch and heads");
  if (rel.stop) return *rel.stop;

  // A few ulps of the row, also for deterministic kernels: determinism is about repeating the
  // same call; a kernel may legitimately pick its reduction split from a sequence's position
  // or a batch's layout (PyTorch's math backend in f16 on the H200 moved one lse by 1 ulp
  // when packed sequences were reversed). A real permutation bug moves values by far more.
  const double ulps = 2;
  std::string dp_note;
  const std::optional<DpRoundingAllowance> dpa =
      DpAllowance(ctx, pp, base.fwd, base.bwd.has_value(), &dp_note);
  // The permuted call may sum in another order (SumOrderBound, on the permuted problem).
  const Tensor base_lse_perm = perm(base.fwd.lse, src_q, hl, src_q_rows, lse_rows);
  const OrderAllowance order = SumOrderBound(
      pp, CaseInputs{q2, k2, v2, do2}, perm(base.fwd.o, src_q, ha, src_q_rows, 0),
      JudgesLse(*ctx.kernel) && base.fwd.lse.defined()
          ? base_lse_perm
          : perm(ctx.OracleForward().lse, src_q, hl, src_q_rows, lse_rows),
      AccumulateFormat(ctx));
  std::vector<Verdict> out;
  out.push_back(Agree(kCheck, "o", p, ctx.profile, perm(base.fwd.o, src_q, ha, src_q_rows, 0),
                      rel.fwd.o, ulps, nullptr, order.o_or_null()));
  if (JudgesLse(*ctx.kernel)) {
    const Tensor lse_scale = perm(LseScale(p, base.fwd.lse), src_q, hl, src_q_rows, lse_rows);
    out.push_back(Agree(kCheck, "lse", p, ctx.profile, perm(base.fwd.lse, src_q, hl, src_q_rows, lse_rows),
                        rel.fwd.lse, ulps, &lse_scale));
  }
  if (bwd) {
    // The allowances on the permuted problem (rel's layout): DpAllowance's, computed on the
    // case's problem, permuted like its gradients; the two runs' own roundings.
    std::optional<DpRoundingAllowance> dpa_perm;
    if (dpa) {
      dpa_perm = DpRoundingAllowance{perm(dpa->dq, src_q, ha, src_q_rows, 0),
                                     perm(dpa->dk, src_kv, ha, src_k_rows, 0)};
    }
    const RecomputeAllowance extra = RecomputeBound(
        ctx, pp, CaseInputs{q2, k2, v2, do2}, perm(base.fwd.o, src_q, ha, src_q_rows, 0),
        perm(base.fwd.lse, src_q, hl, src_q_rows, lse_rows), rel.fwd.o, rel.fwd.lse,
        [&] { return perm(ctx.OracleForward().lse, src_q, hl, src_q_rows, lse_rows); },
        dpa_perm ? &*dpa_perm : nullptr);
    out.push_back(Agree(kCheck, "dq", p, ctx.profile, perm(base.bwd->dq, src_q, ha, src_q_rows, 0),
                        rel.bwd->dq, ulps, nullptr, extra.dq_or_null()));
    out.push_back(Agree(kCheck, "dk", p, ctx.profile, perm(base.bwd->dk, src_kv, ha, src_k_rows, 0),
                        rel.bwd->dk, ulps, nullptr, extra.dk_or_null()));
    out.push_back(Agree(kCheck, "dv", p, ctx.profile, perm(base.bwd->dv, src_kv, ha, src_k_rows, 0),
                        rel.bwd->dv, ulps, nullptr, order.dv_or_null()));
  }
  // Locations are those of the permuted problem; say how to map them back.
  for (Verdict& v : out) {
    v.message += fmt::format(" ({}, heads reversed{}; coordinates in the permuted run{})",
                             !permute_batch ? (seq_blocked_packed
                                                   ? "batch kept: sequence-blocked recipe"
                                                   : "batch kept")
                             : p.varlen()   ? "packed sequences reversed"
                                            : "batch reversed",
                             r > 1 ? " per kv group" : "", dp_note);
  }
  return out;
}

std::vector<Verdict> RunWindowCausal(CheckContext& ctx) {
  constexpr std::string_view kCheck = "window-causal";
  const Problem& p = ctx.case_.problem;
  const Capabilities caps = ctx.kernel->capabilities();
  const bool windowed = p.window_left >= 0 || p.window_right >= 0;
  if (windowed || p.prefix_lm > 0 || !caps.window) {
    ctx.not_applicable = !caps.window ? "the kernel claims no window to relate causal to"
                                      : "the case has a window or prefix-LM of its own";
    return {};
  }
  const CaseInputs& in = ctx.inputs;
  const bool bwd = ctx.WantsBackward();
  RunOutputs base = BaseRun(kCheck, ctx, bwd);
  if (base.stop) return *base.stop;
  // The relations, each a window problem that must equal the case:
  //   causal:     window (L, 0) without causal, on the same diagonal (mask.h: a window is
  //               relative to the causal_align diagonal whether or not causal is set), L the
  //               smallest left bound that reaches key 0 from every query's diagonal plus
  //               one: Sk for bottom-right (the last query's diagonal is key Sk - 1; the
  //               flash-attention idiom window_left = seqlen_k), Sq for top-left (query i's
  //               diagonal is key i, so (Sk, 0) would hide keys from queries i > Sk once
  //               Sq > Sk + 1: not the causal mask, a false alarm on correct kernels);
  //   not causal: windows whose bounds reach past every key, (Sq + Sk, -1) and (-1, Sq + Sk):
  //               no window. A kernel that rewrites an unbounded or too large bound (clamps it
  //               to seqlen_k, flash-attention #895) drops keys here once Sq > Sk.
  struct Relation {
    Problem w;
    std::string what;
  };
  std::vector<Relation> relations;
  const int64_t reach = p.seqlen_q + p.seqlen_k;  // past every key of the longest sequence
  if (p.causal) {
    Problem w = p;
    w.causal = false;
    const bool top_left = p.causal_align == CausalAlign::kTopLeft;
    w.window_left = top_left ? p.seqlen_q : p.seqlen_k;
    w.window_right = 0;
    relations.push_back({w, top_left ? "causal (top-left) vs window (Sq, 0)"
                                     : "causal vs window (Sk, 0)"});
  } else {
    Problem left = p, right = p;
    left.window_left = reach;
    right.window_right = reach;
    relations.push_back({left, fmt::format("no window vs window ({}, -1)", reach)});
    relations.push_back({right, fmt::format("no window vs window (-1, {})", reach)});
  }
  // The window problem may run other code, summing in another order (SumOrderBound).
  const OrderAllowance order = CaseOrderBound(ctx, base.fwd.o, base.fwd.lse);
  std::vector<Verdict> out;
  for (const Relation& rel_case : relations) {
    RunOutputs rel = RunKernel(kCheck, *ctx.kernel, rel_case.w, in.q, in.k, in.v, in.dout, bwd,
                               rel_case.what);
    if (rel.stop) return *rel.stop;
    // A hybrid kernel may route the window problem to another backward (DpAllowance).
    std::string dp_note;
    const std::optional<DpRoundingAllowance> dpa =
        DpAllowance(ctx, rel_case.w, base.fwd, base.bwd.has_value(), &dp_note);
    std::vector<Verdict> part;
    part.push_back(Agree(kCheck, "o", p, ctx.profile, base.fwd.o, rel.fwd.o, 2, nullptr,
                         order.o_or_null()));
    if (JudgesLse(*ctx.kernel)) {
      const Tensor lse_scale = LseScale(p, base.fwd.lse);
      part.push_back(Agree(kCheck, "lse", p, ctx.profile, base.fwd.lse, rel.fwd.lse, 4, &lse_scale));
    }
    if (bwd) {
      // The window problem may run other code (a mask path instead of the causal one): each
      // run's own roundings (RecomputeBound) on top of the ulps.
      const RecomputeAllowance extra = RecomputeBound(
          ctx, p, in, base.fwd.o, base.fwd.lse, rel.fwd.o, rel.fwd.lse,
          [&] { return ctx.OracleForward().lse; }, dpa ? &*dpa : nullptr);
      part.push_back(Agree(kCheck, "dq", p, ctx.profile, base.bwd->dq, rel.bwd->dq, 2, nullptr,
                           extra.dq_or_null()));
      part.push_back(Agree(kCheck, "dk", p, ctx.profile, base.bwd->dk, rel.bwd->dk, 2, nullptr,
                           extra.dk_or_null()));
      part.push_back(Agree(kCheck, "dv", p, ctx.profile, base.bwd->dv, rel.bwd->dv, 2, nullptr,
                           order.dv_or_null()));
    }
    for (Verdict& v : part) {
      v.message += " (" + rel_case.what + dp_note + ")";
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace attest
