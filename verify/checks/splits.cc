// The splits-agree relation and its bound (see splits.h).
#include "verify/checks/splits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"
#include "reference/recipes/recipe.h"
#include "verify/checks/metamorphic_internal.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/term_scale.h"

namespace attest {
namespace {

using metamorphic_detail::Agree;
using metamorphic_detail::BaseRun;
using metamorphic_detail::LseScale;
using metamorphic_detail::RunKernel;
using metamorphic_detail::RunOutputs;

constexpr std::string_view kCheck = "splits-agree";
constexpr double kU32 = 0x1p-24;

// The unit roundoff of P's rounding before P·V: the recipe's pv.a (the profile's recipe, or its
// baseline recipe), else the problem's dtype (FlashAttention-2 class kernels round P to the
// input dtype); 0 where P stays in fp32 or f64. nullopt: P is block-scaled (its scales move
// with the split), which this bound does not cover.
std::optional<double> PUnitRoundoff(const CheckContext& ctx) {
  const Recipe* r = nullptr;
  if (ctx.profile != nullptr) {
    r = FindRecipe(ctx.profile->name);
    if (r == nullptr && !ctx.profile->baseline_recipe.empty()) {
      r = FindRecipe(ctx.profile->baseline_recipe);
    }
  }
  Format f = FormatOf(ctx.case_.problem.dtype).value_or(Format::kF32);
  double directed = 1;
  if (r != nullptr) {
    const OperandScheme& s = r->pv.a.scheme;
    if (s.kind == OperandKind::kBlock) return std::nullopt;
    if (s.kind == OperandKind::kNone) return 0.0;
    f = s.element;
    if (s.rounding != Rounding::kNearestEven) directed = 2;  // a whole quantum, not half
  }
  if (f == Format::kF32 || f == Format::kF64) return 0.0;
  return directed * Quantum(1.0, f) / 2;
}

}  // namespace

SplitAllowance SplitBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                          const Tensor& lse, double p_unit_roundoff, int64_t max_splits) {
  SplitAllowance out;
  const OrderAllowance order = SumOrderBound(p, in, o, lse, Format::kF32);
  auto reorder = [](double n) { return std::min(n, kRoundingSigmas * std::sqrt(n)) + 1; };
  const Tensor q = ToF64(in.q).Clone(), k = ToF64(in.k).Clone(), v = ToF64(in.v).Clone();
  const Tensor of = ToF64(o).Clone(), lf = ToF64(lse).Clone();
  const auto Q = q.span<const double>(), K = k.span<const double>(), V = v.span<const double>();
  const auto O = of.span<const double>(), L = lf.span<const double>();
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  out.o = Tensor::Zeros(DType::kF64, o.shape());
  out.lse = Tensor::Zeros(DType::kF64, lse.shape());
  const auto AO = out.o.span<double>(), AL = out.lse.span<double>();
  const auto OO = order.o.defined() ? order.o.span<const double>() : std::span<const double>();
  const double scale = p.EffectiveScale(), n_splits = static_cast<double>(max_splits);
  const double dot_factor = reorder(static_cast<double>(d));
  auto at = [](int64_t row, int64_t heads, int64_t h, int64_t width) {
    return static_cast<size_t>((row * heads + h) * width);
  };
  std::vector<double> terms(static_cast<size_t>(dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence& seq = mask.sequence();
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      // A finite learnable sink is one more term of the combine's max and sum (splits.h).
      const double sink_h = p.sink ? ToF64(in.sink).span<const double>()[static_cast<size_t>(h)]
                                   : -std::numeric_limits<double>::infinity();
      const bool has_sink = std::isfinite(sink_h);
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t qi = seq.q_begin + i;
        const size_t row = static_cast<size_t>(
            p.varlen() ? h * p.TotalQ() + qi : (b * hq + h) * p.seqlen_q + i);
        const double lse_i = L[row];
        if (!std::isfinite(lse_i)) continue;  // an empty row: nothing is combined
        std::fill(terms.begin(), terms.end(), 0.0);
        double n_i = 0, s_max = 0, e_max = 0;
        ForEachVisibleKey(mask, i, [&](int64_t j) {
          const int64_t kj = seq.k_begin + j;
          double dot = 0, dot_abs = 0;
          for (int64_t c = 0; c < d; ++c) {
            const double x = Q[at(qi, hq, h, d) + c] * K[at(kj, hkv, g, d) + c];
            dot += x;
            dot_abs += std::fabs(x);
          }
          const double s = TransformScore(scale * dot, p.softcap, slope, mask.AlibiDistance(i, j));
          n_i += 1;
          if (!std::isfinite(s)) return;
          s_max = std::max(s_max, std::fabs(s));
          e_max = std::max(e_max, dot_factor * std::fabs(scale) * dot_abs + std::fabs(s) +
                                      std::fabs(s - lse_i) + 2);
          const double prob = std::exp(s - lse_i);
          for (int64_t c = 0; c < dv; ++c) {
            terms[static_cast<size_t>(c)] += prob * std::fabs(V[at(kj, hkv, g, dv) + c]);
          }
        });
        if (has_sink) s_max = std::max(s_max, std::fabs(sink_h));
        const double big_l = std::max(std::fabs(lse_i), s_max) + std::log(std::max(1.0, n_i));
        const double combine = kU32 * (2 * big_l + n_splits + (has_sink ? 5 : 4));
        AL[row] = 2 * (combine + kU32 * (reorder(n_i) + e_max));
        for (int64_t c = 0; c < dv; ++c) {
          const size_t e = at(qi, hq, h, dv) + static_cast<size_t>(c);
          const double oa = std::isfinite(O[e]) ? std::fabs(O[e]) : 0.0;
          const double t = terms[static_cast<size_t>(c)] + oa;
          AO[e] = 2 * (p_unit_roundoff + combine) * t + (OO.empty() ? 0.0 : OO[e]);
        }
      }
    }
  }
  return out;
}

std::vector<Verdict> RunSplitsAgree(CheckContext& ctx) {
  const std::vector<int64_t> counts = ctx.kernel->capabilities().num_splits;
  if (counts.size() < 2) {
    ctx.not_applicable = "the kernel declares fewer than two split counts (num_splits)";
    return {};
  }
  const std::optional<double> u_p = PUnitRoundoff(ctx);
  if (!u_p) {
    ctx.not_applicable = "P is block-scaled: a split moves its scales (no bound here)";
    return {};
  }
  const CaseInputs& in = ctx.inputs;
  Problem first = ctx.case_.problem;
  first.num_splits = counts.front();
  const Tensor* sink = first.sink ? &in.sink : nullptr;
  RunOutputs base = RunKernel(kCheck, *ctx.kernel, first, in.q, in.k, in.v, in.dout, false,
                              fmt::format("num_splits {}", counts.front()), sink);
  if (base.stop) return *base.stop;
  const bool judges_lse = JudgesLse(*ctx.kernel);
  const Tensor& lse_ref = judges_lse ? base.fwd.lse : ctx.OracleForward().lse;
  const int64_t max_splits = *std::max_element(counts.begin(), counts.end());
  const SplitAllowance allow = SplitBound(first, in, base.fwd.o, lse_ref, *u_p, max_splits);
  const Tensor lse_scale = judges_lse ? LseScale(first, base.fwd.lse) : Tensor();
  std::vector<Verdict> out;
  for (size_t n = 1; n < counts.size(); ++n) {
    Problem other = first;
    other.num_splits = counts[n];
    const std::string what = fmt::format("num_splits {}", counts[n]);
    RunOutputs rel =
        RunKernel(kCheck, *ctx.kernel, other, in.q, in.k, in.v, in.dout, false, what, sink);
    if (rel.stop) return *rel.stop;
    std::vector<Verdict> pair;
    pair.push_back(Agree(kCheck, "o", first, ctx.profile, base.fwd.o, rel.fwd.o, 2, nullptr,
                         &allow.o));
    if (judges_lse) {
      pair.push_back(Agree(kCheck, "lse", first, ctx.profile, base.fwd.lse, rel.fwd.lse, 4,
                           &lse_scale, &allow.lse));
    }
    for (Verdict& v : pair) {
      v.message += fmt::format(" (num_splits {} vs {})", counts[n], counts.front());
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace attest
