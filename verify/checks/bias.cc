// The bias check (see bias.h).
#include "verify/checks/bias.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "reference/formats/format.h"
#include "reference/recipes/recipe.h"
#include "verify/tolerance/baseline.h"

namespace attest {
namespace {

// The recipe whose bias the kernel's outputs are expected to carry: the declared one, else
// the dtype's FlashAttention-2 row, except for a kernel that declares only a low-precision
// family profile (nothing says where it rounds). nullptr with `why` set: abstain.
const Recipe* ExpectedRecipe(const CheckContext& ctx, std::string& why) {
  const Capabilities caps = ctx.kernel->capabilities();
  if (!caps.recipe.empty()) {
    if (const Recipe* r = FindRecipe(caps.recipe)) return r;
    why = "bias: the declared recipe '" + caps.recipe + "' is unknown";
    return nullptr;
  }
  if (ctx.profile != nullptr && !ctx.profile->needs_baseline()) {
    why = "bias: no recipe declared, and the family profile '" + ctx.profile->name +
          "' does not say where the kernel rounds";
    return nullptr;
  }
  const Problem& p = ctx.case_.problem;
  if (p.dtype == DType::kBF16) return FindRecipe("bf16");
  if (p.dtype == DType::kF16) return FindRecipe("f16");
  why = fmt::format("bias: no recipe for dtype {} (declare one)", Name(p.dtype));
  return nullptr;
}

struct Slot {
  const char* name;
  const Tensor* observed;
  Tensor oracle, expected;
  Shape shape;
  int64_t block;  // consecutive elements of one row: D, Dv, or a run of 8 queries for lse
};

// Judges one slot; appends its verdict, or its abstention to `abstained`.
void JudgeSlot(const CheckContext& ctx, const Slot& s, const BiasOptions& options,
               const std::string& recipe_name, std::vector<Verdict>& out,
               std::vector<std::string>& abstained) {
  const Problem& p = ctx.case_.problem;
  if (Status st = CheckOutputTensor(*s.observed, s.name, s.shape); !st.ok()) {
    abstained.push_back(fmt::format("{}: {}", s.name, st.error().message));
    return;  // unwritten-outputs and accuracy name this
  }
  const Format format = FormatOf(s.observed->dtype()).value_or(Format::kF64);
  // An output in the format of the arithmetic (fp32 lse; an fp32 kernel's o) was not rounded
  // to a narrower one: the tolerance of unrounded outputs (bias.h BiasOptions).
  BiasOptions opts = options;
  if (format == Format::kF32 || format == Format::kF64) {
    opts.tolerance_ulps = options.tolerance_ulps_unrounded;
  }
  const Tensor x = ToF64(*s.observed), r = ToF64(s.oracle), e = ToF64(s.expected);
  const BiasJudgement stat = ComputeBias(x.span<const double>(), r.span<const double>(),
                                    e.span<const double>(), format, s.block, opts);
  const std::string fname(Name(format));
  if (stat.abstained) {
    abstained.push_back(fmt::format("{}: {}", s.name, stat.abstain_reason));
    return;
  }
  const std::string policy = fmt::format(
      "|mean excess signed error| <= {} {} ulp, signed and radial, vs recipe {} (t-test on "
      "row means, false alarm <= {:g} per verdict)",
      opts.tolerance_ulps, fname, recipe_name, opts.alpha);
  const std::string message = DescribeBias(stat, fname);
  Verdict v = stat.pass ? Passing(kBiasCheck, s.name, policy, message)
                        : Failure(kBiasCheck, s.name, policy, message);
  v.observed = std::max(stat.signed_dir.lower_bound, stat.radial.lower_bound);
  v.allowed = opts.tolerance_ulps;
  v.margin = stat.margin;
  if (stat.worst >= 0) {
    v.worst = LocateElement(p, s.name, s.shape, stat.worst);
    v.worst.observed = x.span<const double>()[static_cast<size_t>(stat.worst)];
    v.worst.reference = r.span<const double>()[static_cast<size_t>(stat.worst)];
  }
  out.push_back(std::move(v));
}

}  // namespace

std::vector<Verdict> CheckBias(CheckContext& ctx, const BiasOptions& options) {
  const Problem& p = ctx.case_.problem;
  if (ctx.sample) {
    ctx.not_applicable = "bias: a sampled case (the recipe reference needs every row)";
    return {};
  }
  // The t-test treats row means as independent, which holds for independently drawn inputs.
  // Other generators build structure shared across rows on purpose (constant rows, outlier
  // channels, values at a format's edge): every row then rounds alike, and a correct model's
  // row means agree far beyond their spread (measured: margins up to 1e33 on constant rows).
  if (!ctx.case_.generator || ctx.case_.generator->name != "gaussian") {
    ctx.not_applicable = fmt::format(
        "bias: inputs {}: rows that share structure are not independent samples (judged on "
        "gaussian inputs)",
        ctx.case_.generator ? "of generator '" + ctx.case_.generator->name + "'"
                            : std::string("from a file"));
    return {};
  }
  std::string why;
  const Recipe* recipe = ExpectedRecipe(ctx, why);
  if (recipe == nullptr) {
    ctx.not_applicable = why;
    return {};
  }
  const auto& f = ctx.KernelForward();
  if (auto v = NonOutputVerdicts(kBiasCheck, *ctx.kernel, p, f, "forward")) return *v;
  const ForwardResult& fwd = std::get<ForwardResult>(f);
  const BackwardResult* bwd = nullptr;
  if (ctx.WantsBackward()) {
    const auto& b = ctx.KernelBackward();
    if (auto v = NonOutputVerdicts(kBiasCheck, *ctx.kernel, p, b, "backward")) return *v;
    bwd = &std::get<BackwardResult>(b);
  }
  const CaseInputs& in = ctx.inputs;
  Expected<BaselineOut> ref = bwd != nullptr
                                  ? RecipeReferenceBackward(p, *recipe, in.q, in.k, in.v, in.dout)
                                  : RecipeReferenceForward(p, *recipe, in.q, in.k, in.v);
  if (!ref.ok()) {
    ctx.not_applicable = "bias: recipe reference: " + ref.error().message;
    return {};
  }
  const int64_t lse_block = 8;  // runs of 8 queries of one (batch, head)
  std::vector<Slot> slots;
  if (bwd != nullptr) {
    const BackwardOut& o = ctx.OracleBackward();
    slots = {{"o", &fwd.o, o.o, ref->o, p.OShape(), p.head_dim_v},
             {"lse", &fwd.lse, o.lse, ref->lse, p.LseShape(), lse_block},
             {"dq", &bwd->dq, o.dq, ref->dq, p.QShape(), p.head_dim},
             {"dk", &bwd->dk, o.dk, ref->dk, p.KShape(), p.head_dim},
             {"dv", &bwd->dv, o.dv, ref->dv, p.VShape(), p.head_dim_v}};
  } else {
    const ForwardOut& o = ctx.OracleForward();
    slots = {{"o", &fwd.o, o.o, ref->o, p.OShape(), p.head_dim_v},
             {"lse", &fwd.lse, o.lse, ref->lse, p.LseShape(), lse_block}};
  }
  std::vector<Verdict> out;
  std::vector<std::string> abstained;
  const bool judge_lse = JudgesLse(*ctx.kernel);
  for (const Slot& s : slots) {
    if (std::string_view(s.name) == "lse" && !judge_lse) continue;
    JudgeSlot(ctx, s, options, std::string(recipe->name), out, abstained);
  }
  std::string note;
  for (const std::string& a : abstained) note += (note.empty() ? "" : "; ") + a;
  if (out.empty()) {
    ctx.not_applicable = "bias abstains: " + note;
    return {};
  }
  if (!note.empty()) {
    for (Verdict& v : out) v.message += " [abstained: " + note + "]";
  }
  return out;
}

std::vector<Verdict> RunBias(CheckContext& ctx) { return CheckBias(ctx, BiasOptions{}); }

}  // namespace attest
