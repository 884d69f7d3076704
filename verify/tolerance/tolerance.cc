// Tolerance policies, the profile table and Evaluate (see tolerance.h; the profiles as JSON
// are profile_json.cc). Every number in the table cites its evidence; numbers marked
// "estimate" come from format precision, not from a measurement. The family rows fp8 / mxfp8 /
// nvfp4 are bounds derived from the element formats (below). docs/tolerances.md shows the
// measured ratios of the low-precision models against the bound.
#include "verify/tolerance/tolerance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <mutex>
#include <limits>

#include "reference/names.h"
#include "reference/recipes/recipe.h"

namespace attest {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Num(double x) { return fmt::format("{:.3g}", x); }

// ---- The profile table ----
//
// bf16 / f16 / f32 (docs/references.md "Measured: PyTorch 2.11 SDPA backends on an NVIDIA H200",
// max|kernel - f64| / max|f64|, "pt" = PyTorch math path in the input dtype):
//   o:  flash bf16 2.4e-3 vs pt 2.1e-3 (1.14x), efficient 1.14x, cudnn 2.9e-3 vs 2.9e-3
//       (1.0x); fp16 flash 1.06x, cudnn 1.08x. FlashAttention-2's tests use 2x for out:
//       ratio 2 keeps its rule and leaves 1.75x headroom over the worst measured backend.
//   dq: bf16 flash 3.6e-3 vs 1.9e-3 (1.9x), efficient 1.4x, cudnn 5.6e-3 vs 1.5e-3 (3.7x);
//       fp16 flash 1.26x, cudnn 1.31x. "A bound of 2-3x pt without a rounding floor would
//       fail them": bf16 gradients get ratio 4 (3.7x measured) plus the floor; fp16
//       gradients get FlashAttention-2's 3x (2.3x headroom over 1.31x).
//   "pt" is verify/tolerance/baseline.h's kSdpaMath mode, the path that was measured (PyTorch's
//       math backend upcasts bf16/fp16 to fp32 by default, so its error is mostly the
//       output rounding: 2.3e-3 of max|o| in baseline_test, 2.1e-3 to 2.9e-3 on the H200).
//   floor: 2 ULPs of the promised output format (the input dtype for o and gradients, fp32
//       for lse, whatever the producer stored) at the row's largest |ref|. A correctly rounded
//       output is within 0.5 ULP of its own value, and the row's magnitude bounds the
//       accumulated terms; 2 ULPs keeps an exact "pt" from making the bound zero
//       (flash-attention #1136, #1231, #1849) without admitting a wrong element of a
//       non-degenerate row (a permuted element is off by O(|ref|) = O(2^m) ULPs).
//   lse: fp32 in every kernel; its baseline is the same logsumexp computed naively in fp32
//       (verify/tolerance/baseline.h). No measurement yet: ratio 4 (the gradients' number) plus a
//       4-ULP fp32 floor at the row's largest |lse| (estimate).
// f32: no measurement of fp32 kernels in docs/references.md; the bf16 rule is kept as is
//       (estimate): the ratio is relative to the fp32 "pt", so it scales with the format.
//
// Low-precision family rows (fp8, mxfp8, nvfp4): a kernel that names its element formats but
// no recipe. No reference of its arithmetic exists, so each tensor is bounded by what
// quantising the operands with the family's element formats can move it by (kFormatBound;
// verify/checks/accuracy.cc ComputeFormatBounds, on the term magnitudes of
// verify/tolerance/term_scale.cc), plus the output rounding (2 bf16 ULPs at the row's largest |ref|; 4
// fp32 ULPs for lse; dq, dk also 2 fp32 ULPs of the row's terms, as in the bf16 row). The
// element errors (tolerance.h FormatErrors), relative to the element unless noted:
//   E4M3 (3 mantissa bits, max 448, subnormal spacing 2^-9): RNE error 2^-4 of the value. An
//     MX block of 32 with an E8M0 scale X (OCP MX v1.0 sec. 6.3): FLOOR takes X =
//     2^(floor(log2 amax) - 8), so amax / X lies in [256, 512) and a block's largest
//     elements above 464 X saturate to 448 X: up to (512 - 448) / 512 = 1/8 of the value.
//     CEIL / RCEIL / EVEN scales are at least FLOOR's, so 1/8 covers every rounding of the
//     scale. Underflow: half the subnormal spacing, 2^-10 X <= 2^-10 amax / 224 (CEIL and
//     RCEIL keep amax / X in (224, 448]). mxfp8: 1/8 for Q, K, V, dO, P, dS; 2^-10 / 224 of
//     the row's largest |element| for Q and K (blocks along d: the row bounds the block).
//   E2M1 (1 mantissa bit; values 0, 0.5, 1, 1.5, 2, 3, 4, 6): RNE error 2^-2 of the value.
//     NVFP4's E4M3 block scale (per 16) is amax / 6 rounded to E4M3 (2^-4), so the block's
//     largest element reaches at most 6 / (1 - 2^-4) = 6.4 and saturates by 1/16 < 2^-2;
//     underflow below 1 errs by half the spacing 0.5 times the decode scale (<= amax / 6 x
//     17/16): 0.25 x 17/16 / 6 = 0.044 of the block max. nvfp4: those for Q and K; V, dO, P,
//     dS in FP8 E4M3 as NVFP4 attention recipes keep them (cpu/nvfp4-mixed), 1/8.
//   fp8 (one fp32 scale per tensor covering the data, amax or static): 2^-4 for Q, K, V, dO;
//     1/8 for P and dS (which a kernel may block-scale); no underflow term (an assumption of
//     the row: a scale that flushes the data is outside it).
// From these (accuracy.cc has the algebra): the score error |s'_ij - s_ij| <= |scale| (rel_s
// sum_d |q_id||k_jd| + underflow), rel_s = 2 rel + rel^2, and Delta_i its maximum over the
// row's visible keys; lse (softmax is 1-Lipschitz in the max norm) |lse' - lse| <= Delta_i;
// P moves by a factor within e^(+-2 Delta_i), and o, dS, dq, dk, dv bounds follow as products
// of (1 + e) factors over the term magnitudes max_d sum_j P |v| (o), |scale| max_d sum_j P
// (|dO||v| + Dabs) |k| (dq; dk over the group with |q|) and max_d sum_i P |dO| (dv). They hold
// for every kernel that quantises at most these operands with these formats, whatever its
// tiles and scale rounding; no cosine floor (a correct MXFP8 kernel's row cosine of o reached
// 0.92 and of a cancelled dq row -0.8 on the gate). Measured on the gate (docs/tolerances.md
// "The family rows"; verify/checks/family_profile_test.cc): worst margins of correct models
// MXFP8 FLOOR / RCEIL lse 0.12, o and gradients <= 0.014; NVFP4 lse 0.16, others <= 0.052;
// per-tensor FP8 (forward) lse 0.44, o 0.82. The bounds are worst cases (every rounding error
// at its maximum and aligned): lse bugs fail (lse-log2, lse-scaled-twice), store-permutation
// fails on the gate's small cases, while split-kv-combine, rowsum-before-p-cast and
// e8m0-scale-off-by-one stay inside what the formats allow (a declared recipe catches them).
//
// Recipe rows (mxfp8-cudnn, mxfp8-pvbf16, nvfp4-mixed, fp8-e4m3-tensor), the profiles of the
// cpu/ low-precision models: the same baseline-ratio rule as bf16, with the "pt" replaced by
// the reference implementation of the same recipe (verify/tolerance/baseline.h RecipeReference*: the
// recipe's quantised operands, float64 arithmetic, P and dS rounded where the recipe rounds
// them; cudnn-frontend judges cuDNN's MXFP8 SDPA against exactly such a reference,
// test/python/sdpa/mxfp8_ref.py). Against the unquantised oracle, kernel and reference share
// the quantisation error of the operands bit for bit; what the ratio bounds is what the kernel
// adds on top (fp32 accumulation, tile order, P rounded against a running max).
//   o ratio 2, grads ratio 4, 2-ULP bf16 row floor, lse ratio 4 + 4 fp32 ULPs: the bf16
//   row's numbers and evidence unchanged (H200: production kernels reach o 1.14x and dq 3.7x
//   their same-precision "pt"); nothing is re-tuned for the low-precision recipes.
//   Measured (docs/tolerances.md; tolerance_sweep over the gate's accuracy cases and 300
//   random cases): the largest ratio of a correct model is 1.16 on any tensor (o and
//   gradients), so k = 2 / 4 leaves 1.7x / 3.4x headroom; the largest accuracy margin 0.558.
// `out` is the format o and the gradients are delivered in (the input dtype); lse is fp32.
//   dq, dk: the same 2 ULPs, at max(row max|ref|, the row's term magnitude)
//   (FloorScale::kTerms, verify/tolerance/term_scale.h). On the H200 (docs/gpu-results.md), gate row
//   "tile boundary 129x1" (Sk = 1, so exact dq = dk = 0): PyTorch sdpa-cudnn and
//   sdpa-efficient (bf16) returned dq ~6e-7, dk ~3e-6 -- D = rowsum(dO o) and dP = dO v^T
//   rounded in different orders -- and failed the row floor (0 there) by ~1e33. The terms
//   P (|dP| + |D|) |k| are what a correct fp32 backward rounds; dv = sum_i P_ij dO_i has no
//   such cancellation and keeps the row floor.
//   rounding floor (rounding = true: the bf16 / f16 rows, whose "pt" is SDPA math): the ratio
//   term is max(k x pt, R_e), R_e the first-order error of FlashAttention-2's rounding points
//   (P and dS in the input dtype, D from the rounded O; verify/tolerance/term_scale.h), bounded per
//   element by min(sum_j b_j, 4 sqrt(sum_j b_j^2)). SDPA math rounds none of them, so with
//   few keys its error collapses below what they cost: fuzzing the correct cpu/flash2-* and
//   feather models (S <= 256) failed 8-17% of cases on dq/dk (e.g. Sq2 Sk2 with one key
//   channel x8: dk 0.00136 vs allowed 0.00022, 6x pt). docs/tolerances.md "The rounding
//   floor" has the counts before/after and how the bound moved on the gate's cases.
// The numbers of a HighPrecision row, by name.
struct RatioBounds {
  Format out;           // the format o and the gradients are delivered in
  double o_ratio;       // o: err <= o_ratio x baseline + 2 ulps of the row
  double grad_ratio;    // dq, dk, dv: the same with this ratio
  bool rounding = false;  // add FlashAttention-2's rounding floor (the bf16 / f16 rows)
};

std::vector<TensorPolicies> HighPrecision(const RatioBounds& b) {
  const Format out = b.out;
  const double o_ratio = b.o_ratio, grad_ratio = b.grad_ratio;
  const bool rounding = b.rounding;
  Policy o = BaselineRatio(o_ratio, 2, FloorScale::kRow, out);
  Policy g = BaselineRatio(grad_ratio, 2, FloorScale::kRow, out);
  o.rounding_floor = g.rounding_floor = rounding;
  // m = 2 fp32 ULPs of the terms, which already carry Higham's factor n = Dv of the two
  // cancelling fp32 dot products (term_scale.h): the worst-case rounding of dP - D, with no
  // number fitted to a kernel. A bf16-sized floor on the terms hid two mutant verdicts.
  Policy g_terms = BaselineRatio(grad_ratio, 2, FloorScale::kTerms, out);
  g_terms.term_ulps = 2;
  g_terms.rounding_floor = rounding;
  const Policy lse = BaselineRatio(4, 4, FloorScale::kRow, Format::kF32);
  return {{"o", {o}}, {"lse", {lse}}, {"dq", {g_terms}}, {"dk", {g_terms}}, {"dv", {g}}};
}

// A family row (fp8, mxfp8, nvfp4): every tensor bounded by its format bound (kFormatBound;
// the accuracy check computes it from `errors`), plus 2 ULPs of the output format at the row's
// largest |ref| for the output rounding (4 fp32 ULPs for lse), and for dq and dk 2 fp32 ULPs
// of the row's terms (the fp32 accumulation noise of a cancelled row, as in the bf16 row).
Profile FamilyProfile(std::string_view name, std::string_view description,
                      std::string_view evidence, const FormatErrors& errors) {
  const Policy out = FormatBound(2, FloorScale::kRow, Format::kBF16);
  Policy terms = FormatBound(2, FloorScale::kTerms, Format::kBF16);
  terms.term_ulps = 2;
  const Policy lse = FormatBound(4, FloorScale::kRow, Format::kF32);
  Profile p{std::string(name), std::string(description), std::string(evidence),
            {{"o", {out}}, {"lse", {lse}}, {"dq", {terms}}, {"dk", {terms}}, {"dv", {out}}},
            {}, {}, errors};
  return p;
}

// A recipe row: the bf16 rule (see above) against the recipe's reference implementation, with
// the ulps of the format the recipe delivers o and the gradients in.
// `r`: a declared recipe, whose output and gradient formats and scales (recipe.h) the ULP floors
// of o and of dq, dk, dv are counted in; nullptr: o and the gradients in `out`.
Profile RecipeProfile(std::string_view name, std::string_view description,
                      Format out = Format::kBF16, const Recipe* r = nullptr) {
  Profile p{std::string(name), std::string(description),
            "bf16 ratios (docs/references.md H200: o <= 1.14x, dq <= 3.7x pt) against the recipe "
            "reference (cudnn-frontend mxfp8_ref.py's rule)",
            HighPrecision({.out = out, .o_ratio = 2, .grad_ratio = 4}), std::string(name), {},
            std::nullopt};
  if (r != nullptr) {
    const Format grad = r->gradients.value_or(out);
    for (TensorPolicies& t : p.tensors) {
      const int which = t.tensor == "dq" ? 0 : t.tensor == "dk" ? 1 : t.tensor == "dv" ? 2 : -1;
      if (t.tensor != "o" && which < 0) continue;
      for (Policy& policy : t.policies) {
        policy.format = which < 0 ? out : grad;
        policy.format_scale =
            which < 0 ? r->output_scale : r->gradient_scales[static_cast<size_t>(which)];
      }
    }
  }
  return p;
}

// The row of a recipe a kernel declared (reference/recipes/recipe_json.h): the recipe rows'
// rule, built once per recipe and kept for the process's life.
const Profile* DeclaredRecipeProfile(std::string_view name) {
  const Recipe* r = FindDeclaredRecipe(name);
  if (r == nullptr) return nullptr;
  static std::mutex mu;
  static std::deque<Profile>* rows = new std::deque<Profile>;
  std::lock_guard<std::mutex> lock(mu);
  for (const Profile& p : *rows) {
    if (p.name == name) return &p;
  }
  const Format in = r->input_dtypes.empty()
                        ? Format::kBF16
                        : FormatOf(r->input_dtypes.front()).value_or(Format::kBF16);
  rows->push_back(RecipeProfile(r->name, "declared recipe " + std::string(r->name) + ": " +
                                             std::string(r->description),
                                r->output.value_or(in), r));
  return &rows->back();
}

std::vector<Profile> BuildProfiles() {
  const char* kH200 = "docs/references.md H200 SDPA measurements (o <= 1.14x pt, dq <= 3.7x pt)";
  std::vector<Profile> t;
  t.push_back({"f32", "fp32 inputs and accumulation; o/grads vs an fp32 'pt' baseline",
               "bf16 rule kept (estimate: no fp32 kernel measured)",
               HighPrecision({.out = Format::kF32, .o_ratio = 2, .grad_ratio = 4}), {}, {},
               std::nullopt});
  t.push_back({"bf16", "bf16 inputs, fp32 accumulation (FlashAttention-2/3, cuDNN, SDPA)", kH200,
               HighPrecision(
                   {.out = Format::kBF16, .o_ratio = 2, .grad_ratio = 4, .rounding = true}),
               {}, "bf16", std::nullopt});
  t.push_back({"f16", "fp16 inputs, fp32 accumulation (FlashAttention-2, cuDNN, RDNA3)",
               "docs/references.md H200 fp16: o <= 1.08x pt, dq <= 1.31x pt; FA2's 2x/3x rules",
               HighPrecision(
                   {.out = Format::kF16, .o_ratio = 2, .grad_ratio = 3, .rounding = true}),
               {}, "f16", std::nullopt});
  // The family rows (derivation at the top of this file; docs/tolerances.md "The family
  // rows"): E4M3 u = 2^-4, OCP FLOOR E8M0 saturation 1/8, E2M1 u = 2^-2.
  t.push_back(FamilyProfile(
      "fp8", "per-tensor FP8 E4M3 operands (scale covering the data), bf16/fp16 outputs",
      "format bound: E4M3 RNE 2^-4 per operand element (derived; docs/tolerances.md)",
      {.qk_rel = 0x1p-4, .qk_abs = 0, .v_rel = 0x1p-4, .do_rel = 0x1p-4, .p_rel = 0x1p-3,
       .ds_rel = 0x1p-3}));
  t.push_back(FamilyProfile(
      "mxfp8", "MXFP8 (E4M3, E8M0 scale per 32, any OCP / cuDNN scale rounding) operands",
      "format bound: E4M3 2^-4, FLOOR saturation 1/8, underflow 2^-10/224 of the block max",
      {.qk_rel = 0x1p-3, .qk_abs = 0x1p-10 / 224, .v_rel = 0x1p-3, .do_rel = 0x1p-3,
       .p_rel = 0x1p-3, .ds_rel = 0x1p-3}));
  t.push_back(FamilyProfile(
      "nvfp4", "NVFP4 Q, K (E2M1, E4M3 scale per 16, fp32 tensor scale); V, dO, P, dS in FP8",
      "format bound: E2M1 2^-2, underflow 0.25 x 17/16 / 6 of the block max; E4M3 1/8",
      {.qk_rel = 0x1p-2, .qk_abs = 0.25 * (17.0 / 16) / 6, .v_rel = 0x1p-3, .do_rel = 0x1p-3,
       .p_rel = 0x1p-3, .ds_rel = 0x1p-3}));
  // One row per recipe of reference/recipes: judged against the recipe's own reference.
  t.push_back(RecipeProfile("mxfp8-cudnn",
                            "recipe mxfp8-cudnn: cuDNN MXFP8 SDPA (P x16 -> E4M3)"));
  t.push_back(RecipeProfile("mxfp8-pvbf16",
                            "recipe mxfp8-pvbf16: MXFP8 QK^T and dO.V^T, P.V and dS products "
                            "in bf16"));
  t.push_back(RecipeProfile("nvfp4-mixed",
                            "recipe nvfp4-mixed: NVFP4 Q, K; FP8 V scaled per token and head; "
                            "P x16 -> E4M3"));
  t.push_back(RecipeProfile("fp8-e4m3-tensor",
                            "recipe fp8-e4m3-tensor: E4M3 with static descales per (batch, "
                            "head), P x256"));
  return t;
}

Verdict Base(const Policy& policy, const TensorMetrics& m, std::string_view check) {
  Verdict v;
  v.check = std::string(check);
  v.tensor = m.tensor;
  v.policy = policy.Describe();
  return v;
}

// The location (with values) of flat element `flat` of m's tensors.
Location LocateFlat(const TensorMetrics& m, int64_t flat) {
  std::vector<int64_t> index(m.shape.size());
  int64_t rest = flat;
  for (int64_t a = static_cast<int64_t>(m.shape.size()) - 1; a >= 0; --a) {
    const auto ua = static_cast<size_t>(a);
    index[ua] = rest % m.shape[ua];
    rest /= m.shape[ua];
  }
  Location loc = Locate(m.layout, index);
  loc.flat = flat;
  loc.observed = m.observed.data<double>()[flat];
  loc.reference = m.reference.data<double>()[flat];
  return loc;
}

// Shared loop of the per-element bounds: allowed(e) for every finite pair; keeps the element
// with the largest observed / allowed.
template <class AllowedFn>
void WorstElement(const TensorMetrics& m, AllowedFn&& allowed_at, Verdict& v) {
  const double* obs = m.observed.data<double>();
  const double* ref = m.reference.data<double>();
  double worst = -1;
  int64_t worst_flat = -1;
  double worst_err = 0, worst_allowed = 0;
  const auto n_rows = static_cast<int64_t>(m.rows.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t begin = m.row_begin[static_cast<size_t>(r)];
    const int64_t end = begin + m.rows[static_cast<size_t>(r)].length;
    for (int64_t e = begin; e < end; ++e) {
      if (ClassifyPair(obs[e], ref[e], m.options) != PairKind::kFinite) continue;
      const double err = std::fabs(obs[e] - ref[e]);
      const double allowed = allowed_at(e, r);
      const double ratio = Margin(err, allowed);
      if (ratio > worst) {
        worst = ratio;
        worst_flat = e;
        worst_err = err;
        worst_allowed = allowed;
      }
    }
  }
  v.observed = worst_err;
  v.allowed = worst_allowed;
  v.margin = worst < 0 ? 0.0 : worst;
  if (worst_flat >= 0) v.worst = LocateFlat(m, worst_flat);
}

}  // namespace

std::string_view Name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kBaselineRatio:
      return "baseline-ratio";
    case PolicyKind::kAbsRel:
      return "atol-rtol";
    case PolicyKind::kUlpBudget:
      return "ulp";
    case PolicyKind::kCosineFloor:
      return "cosine";
    case PolicyKind::kFormatBound:
      return "format-bound";
  }
  return "?";
}

std::string_view Name(FloorScale scale) {
  switch (scale) {
    case FloorScale::kElement:
      return "element";
    case FloorScale::kRow:
      return "row";
    case FloorScale::kTerms:
      return "terms";
  }
  return "?";
}

namespace {
// "e4m3fn " or, at a pre-scale, "e4m3fn x128 " (Policy::format_scale); "" without a format.
std::string FormatWord(const Policy& p) {
  if (!p.format) return "";
  if (p.format_scale == 1.0) return std::string(Name(*p.format)) + " ";
  return fmt::format("{} x{} ", Name(*p.format), Num(p.format_scale));
}
// One ULP of x in the policy's format at its pre-scale (Policy::format_scale).
double PolicyQuantum(const Policy& p, double x, Format f) {
  const double s = p.format ? p.format_scale : 1.0;
  return s == 1.0 ? Quantum(x, f) : Quantum(x * s, f) / s;
}
}  // namespace

std::string Policy::Describe() const {
  switch (kind) {
    case PolicyKind::kBaselineRatio:
    {
      const std::string base = rounding_floor
                                    ? fmt::format("max({}x baseline, rounding)", Num(ratio))
                                    : fmt::format("{}x baseline", Num(ratio));
      if (floor_scale == FloorScale::kTerms) {
        return fmt::format("err <= {} + {} {}ulp(row) + {} f32 ulp(terms)", base,
                           Num(floor_ulps), FormatWord(*this),
                           Num(term_ulps));
      }
      return fmt::format("err <= {} + {} {}ulp({})", base, Num(floor_ulps),
                         FormatWord(*this), Name(floor_scale));
    }
    case PolicyKind::kAbsRel:
      return fmt::format("err <= {}{} + {}|ref|", Num(atol),
                         atol_relative_to_max ? " max|ref|" : "", Num(rtol));
    case PolicyKind::kUlpBudget:
      return fmt::format("err <= {} {}ulp", Num(ulps),
                         FormatWord(*this));
    case PolicyKind::kCosineFloor:
      return fmt::format("cos >= {}{}", min_cosine, per_row ? " per row" : "");
    case PolicyKind::kFormatBound:
      if (floor_scale == FloorScale::kTerms) {
        return fmt::format("err <= format bound + {} {}ulp(row) + {} f32 ulp(terms)",
                           Num(floor_ulps), FormatWord(*this),
                           Num(term_ulps));
      }
      return fmt::format("err <= format bound + {} {}ulp({})", Num(floor_ulps),
                         FormatWord(*this), Name(floor_scale));
  }
  return "?";
}

Policy BaselineRatio(double ratio, double floor_ulps, FloorScale scale,
                     std::optional<Format> format) {
  Policy p;
  p.format = format;
  p.kind = PolicyKind::kBaselineRatio;
  p.ratio = ratio;
  p.floor_ulps = floor_ulps;
  p.floor_scale = scale;
  return p;
}

Policy AbsRel(double atol, double rtol, bool atol_relative_to_max) {
  Policy p;
  p.kind = PolicyKind::kAbsRel;
  p.atol = atol;
  p.rtol = rtol;
  p.atol_relative_to_max = atol_relative_to_max;
  return p;
}

Policy UlpBudget(double ulps, std::optional<Format> format) {
  Policy p;
  p.format = format;
  p.kind = PolicyKind::kUlpBudget;
  p.ulps = ulps;
  return p;
}

Policy FormatBound(double floor_ulps, FloorScale scale, std::optional<Format> format) {
  Policy p;
  p.format = format;
  p.kind = PolicyKind::kFormatBound;
  p.floor_ulps = floor_ulps;
  p.floor_scale = scale;
  return p;
}

Policy CosineFloor(double min_cosine, bool per_row) {
  Policy p;
  p.kind = PolicyKind::kCosineFloor;
  p.min_cosine = min_cosine;
  p.per_row = per_row;
  return p;
}

const std::vector<Policy>* Profile::For(std::string_view tensor) const {
  for (const TensorPolicies& t : tensors) {
    if (t.tensor == tensor) return &t.policies;
  }
  return nullptr;
}

bool Profile::needs_baseline() const {
  for (const TensorPolicies& t : tensors) {
    for (const Policy& p : t.policies) {
      if (p.needs_baseline()) return true;
    }
  }
  return false;
}

bool Profile::needs_term_scale() const {
  for (const TensorPolicies& t : tensors) {
    for (const Policy& p : t.policies) {
      if ((p.kind == PolicyKind::kBaselineRatio || p.kind == PolicyKind::kFormatBound) &&
          p.floor_scale == FloorScale::kTerms) {
        return true;
      }
    }
  }
  return false;
}

bool Profile::needs_rounding_floor() const {
  if (rounding_recipe.empty()) return false;
  for (const TensorPolicies& t : tensors) {
    for (const Policy& p : t.policies) {
      if (p.kind == PolicyKind::kBaselineRatio && p.rounding_floor) return true;
    }
  }
  return false;
}

bool Profile::needs_format_bound() const {
  if (!format_errors) return false;
  for (const TensorPolicies& t : tensors) {
    for (const Policy& p : t.policies) {
      if (p.kind == PolicyKind::kFormatBound) return true;
    }
  }
  return false;
}

std::span<const Profile> AllProfiles() {
  static const std::vector<Profile> kTable = BuildProfiles();
  return kTable;
}

const Profile* FindProfile(std::string_view name) {
  for (const Profile& p : AllProfiles()) {
    if (p.name == name) return &p;
  }
  // Recipes "bf16" and "f16" share their dtype's row; "fp16" is the common alias.
  if (name == "fp16") return FindProfile("f16");
  if (name == "fp32") return FindProfile("f32");
  return DeclaredRecipeProfile(name);
}

const Profile* ProfileForDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF64:
      return FindProfile("f32");
    case DType::kBF16:
      return FindProfile("bf16");
    case DType::kF16:
      return FindProfile("f16");
    case DType::kE4M3FN:
    case DType::kE5M2:
      return FindProfile("fp8");
    default:
      return nullptr;
  }
}

Expected<const Profile*> ProfileFor(const Capabilities& caps) {
  std::vector<std::string> names;  // for "did you mean" (reference/names.h)
  for (const Profile& p : AllProfiles()) names.push_back(p.name);
  if (!caps.profile.empty()) {
    if (const Profile* p = FindProfile(caps.profile)) return p;
    return Error{
        fmt::format("capabilities.profile: unknown tolerance profile '{}'{} (see "
                    "`attest list profiles`)",
                    caps.profile, DidYouMean(caps.profile, names))};
  }
  if (!caps.recipe.empty()) {
    if (const Profile* p = FindProfile(caps.recipe)) return p;
    return Error{fmt::format("capabilities.recipe: no tolerance profile for recipe '{}'{} (see "
                             "`attest list recipes`)",
                             caps.recipe, DidYouMean(caps.recipe, names))};
  }
  if (!caps.dtypes.empty()) {
    if (const Profile* p = ProfileForDType(caps.dtypes.front())) return p;
    return Error{fmt::format("capabilities.dtypes: no tolerance profile for dtype {}",
                             Name(caps.dtypes.front()))};
  }
  return Error{"capabilities: the kernel declares no profile, recipe or dtype"};
}

namespace {

// The failing verdict of a tensor with non-finite mismatches.
void NonFiniteVerdict(const TensorMetrics& m, Verdict& v) {
  v.pass = false;
  v.observed = static_cast<double>(m.nonfinite_mismatches);
  v.allowed = 0;
  v.margin = kInf;
  v.worst = m.first_nonfinite;
  v.message = m.reference_nans > 0
                  ? fmt::format(
                        "{}: the reference holds {} NaN (a broken comparison never "
                        "passes); first mismatch at {}",
                        m.tensor, m.reference_nans, m.first_nonfinite.ToString())
                  : fmt::format(
                        "{}: {} non-finite value(s) where the oracle is finite (or "
                        "finite where it is infinite), first at {}",
                        m.tensor, m.nonfinite_mismatches, m.first_nonfinite.ToString());
}

// The baseline ratio: ratio x the baseline's error (or the rounding floor where the policy takes
// it and it is larger) plus the ULP floor, element by element.
void BaselineRatioVerdict(const Policy& policy, const TensorMetrics& m,
                          const TensorMetrics& baseline, Verdict& v) {
  const double b = baseline.max_abs_error;
  const double base_k = policy.ratio * b;
  const Format f = policy.format.value_or(m.format);
  const double* rfloor = policy.rounding_floor && m.rounding_floor.defined()
                             ? m.rounding_floor.data<double>()
                             : nullptr;
  WorstElement(
      m,
      [&](int64_t e, int64_t r) {
        const RowMetrics& row = m.rows[static_cast<size_t>(r)];
        const double base_term = rfloor != nullptr ? std::max(base_k, rfloor[e]) : base_k;
        double scale = 0;
        switch (policy.floor_scale) {
          case FloorScale::kElement:
            scale = std::fabs(m.reference.data<double>()[e]);
            break;
          case FloorScale::kRow:
            scale = row.ref_max_abs;
            break;
          case FloorScale::kTerms:
            return base_term + policy.floor_ulps * PolicyQuantum(policy, row.ref_max_abs, f) +
                   policy.term_ulps * Quantum(row.term_scale, Format::kF32) +
                   m.declared_allowance;
        }
        return base_term + policy.floor_ulps * PolicyQuantum(policy, scale, f) +
               m.declared_allowance;
      },
      v);
  v.message = fmt::format("{}: error {} vs allowed {} ({}x baseline {} + floor) at {}",
                          m.tensor, Num(v.observed), Num(v.allowed), Num(policy.ratio), Num(b),
                          v.worst.ToString());
  if (policy.floor_scale == FloorScale::kTerms && v.worst.flat >= 0) {
    const RowMetrics& row = m.rows[static_cast<size_t>(m.RowOf(v.worst.flat))];
    v.message += m.has_term_scale
                     ? fmt::format("; row max|ref| {}, terms {}", Num(row.ref_max_abs),
                                   Num(row.term_scale))
                     : std::string("; term magnitudes unknown: row floor");
  }
  if (rfloor != nullptr && v.worst.flat >= 0) {
    v.message += fmt::format("; rounding floor {}", Num(rfloor[v.worst.flat]));
  }
  if (m.declared_allowance > 0) {
    v.message += fmt::format("; + {} ({})", Num(m.declared_allowance), m.declared_note);
  }
  if (baseline.nonfinite_mismatches > 0) {
    v.message += fmt::format("; the baseline had {} non-finite values (ignored)",
                             baseline.nonfinite_mismatches);
  }
}

void AbsRelVerdict(const Policy& policy, const TensorMetrics& m, Verdict& v) {
  const double atol = policy.atol * (policy.atol_relative_to_max ? m.ref_max_abs : 1.0);
  const double* ref = m.reference.data<double>();
  WorstElement(
      m, [&](int64_t e, int64_t) { return atol + policy.rtol * std::fabs(ref[e]); }, v);
  v.message = fmt::format("{}: error {} vs allowed {} at {}", m.tensor, Num(v.observed),
                          Num(v.allowed), v.worst.ToString());
}

void UlpBudgetVerdict(const Policy& policy, const TensorMetrics& m, Verdict& v) {
  const Format f = policy.format.value_or(m.format);
  const double fs = policy.format ? policy.format_scale : 1.0;
  if (f == m.format && fs == 1.0) {
    v.observed = m.max_ulp;
    v.worst = m.worst_ulp;
  } else {
    // Recount in the policy's format: the largest distance wins.
    const double* obs = m.observed.data<double>();
    const double* ref = m.reference.data<double>();
    int64_t worst_flat = -1;
    v.observed = 0;
    for (int64_t e = 0; e < m.elements; ++e) {
      if (ClassifyPair(obs[e], ref[e], m.options) != PairKind::kFinite) continue;
      const double u = UlpDistance(obs[e] * fs, ref[e] * fs, f);
      if (worst_flat < 0 || u > v.observed) {
        v.observed = u;
        worst_flat = e;
      }
    }
    if (worst_flat >= 0) v.worst = LocateFlat(m, worst_flat);
  }
  v.allowed = policy.ulps;
  v.margin = Margin(v.observed, v.allowed);
  v.message = fmt::format("{}: {} ulp of {} vs allowed {} at {}", m.tensor, Num(v.observed),
                          Name(f), Num(v.allowed), v.worst.ToString());
}

void FormatBoundVerdict(const Policy& policy, const TensorMetrics& m, Verdict& v) {
  const Format f = policy.format.value_or(m.format);
  const double* fb = m.rounding_floor.defined() ? m.rounding_floor.data<double>() : nullptr;
  WorstElement(
      m,
      [&](int64_t e, int64_t r) {
        const RowMetrics& row = m.rows[static_cast<size_t>(r)];
        double allowed = (fb != nullptr ? fb[e] : 0.0) +
                         policy.floor_ulps * PolicyQuantum(policy, row.ref_max_abs, f) +
                         m.declared_allowance;
        if (policy.floor_scale == FloorScale::kTerms) {
          allowed += policy.term_ulps * Quantum(row.term_scale, Format::kF32);
        }
        return allowed;
      },
      v);
  v.message = fmt::format("{}: error {} vs allowed {} at {}", m.tensor, Num(v.observed),
                          Num(v.allowed), v.worst.ToString());
  if (fb != nullptr && v.worst.flat >= 0) {
    v.message += fmt::format("; format bound {}", Num(fb[v.worst.flat]));
  } else if (fb == nullptr) {
    v.message += "; format bounds unknown: ULP floor alone";
  }
  if (m.declared_allowance > 0) {
    v.message += fmt::format("; + {} ({})", Num(m.declared_allowance), m.declared_note);
  }
}

void CosineFloorVerdict(const Policy& policy, const TensorMetrics& m, Verdict& v) {
  const double cos = policy.per_row ? m.min_row_cosine : m.cosine;
  v.observed = std::max(0.0, 1.0 - cos);
  v.allowed = 1.0 - policy.min_cosine;
  v.margin = Margin(v.observed, v.allowed);
  v.worst = policy.per_row ? m.worst_row_cosine : m.worst_abs;
  v.message = fmt::format("{}: {}cosine {:.6f} vs floor {} at {}", m.tensor,
                          policy.per_row ? "lowest row " : "", cos, policy.min_cosine,
                          v.worst.Coordinates());
}

}  // namespace

Verdict Evaluate(const Policy& policy, const TensorMetrics& m, const TensorMetrics* baseline,
                 std::string_view check) {
  Verdict v = Base(policy, m, check);
  // 1. Non-finite mismatches fail whatever the policy says (a NaN must never hide in a max).
  if (m.nonfinite_mismatches > 0) {
    NonFiniteVerdict(m, v);
    return v;
  }
  // 2. The policy's bound.
  switch (policy.kind) {
    case PolicyKind::kBaselineRatio:
      if (baseline == nullptr) {
        v.pass = false;
        v.margin = kInf;
        v.message = fmt::format("{}: the policy '{}' needs a baseline and none was given", m.tensor,
                                v.policy);
        return v;
      }
      BaselineRatioVerdict(policy, m, *baseline, v);
      break;
    case PolicyKind::kAbsRel:
      AbsRelVerdict(policy, m, v);
      break;
    case PolicyKind::kUlpBudget:
      UlpBudgetVerdict(policy, m, v);
      break;
    case PolicyKind::kFormatBound:
      FormatBoundVerdict(policy, m, v);
      break;
    case PolicyKind::kCosineFloor:
      CosineFloorVerdict(policy, m, v);
      break;
  }
  v.pass = v.margin <= 1.0;
  return v;
}

std::vector<Verdict> EvaluateProfile(const Profile& profile, const TensorMetrics& m,
                                     const TensorMetrics* baseline, std::string_view check) {
  std::vector<Verdict> out;
  if (const auto* policies = profile.For(m.tensor)) {
    for (const Policy& p : *policies) out.push_back(Evaluate(p, m, baseline, check));
  }
  return out;
}

}  // namespace attest
