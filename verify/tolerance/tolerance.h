// Tolerance policies and profiles (docs/tolerances.md; docs/design.md "Checks"): policies are
// data (baseline ratio with a ULP floor, atol/rtol, ULP budget, cosine floor), a profile maps
// each output tensor of a kernel to its policies, and Evaluate turns metrics into a Verdict
// with its margin (observed / allowed) and worst location. The numbers in the profile table
// cite their evidence in tolerance.cc (docs/references.md "Measured: PyTorch 2.11 SDPA backends
// on an NVIDIA H200" for bf16/f16).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "reference/status.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/term_scale.h"
#include "verify/tolerance/verdict.h"

namespace attest {

enum class PolicyKind : uint8_t {
  // |obs_e - ref_e| <= ratio * B + floor_ulps * Quantum(scale_e) for every element e, where
  // B = max |baseline - ref| over the tensor (the rule of FlashAttention's tests: error at
  // most k times that of a reference implementation in the same precision, "pt") and the
  // floor keeps the bound above zero when the baseline happens to be exact
  // (flash-attention #1136, #1231, #1849).
  kBaselineRatio,
  // |obs_e - ref_e| <= atol + rtol * |ref_e| for every element (numpy.allclose form); atol is
  // absolute, or relative to max |ref| over the tensor when atol_relative_to_max.
  kAbsRel,
  // UlpDistance(obs_e, ref_e) <= ulps in the output format for every element.
  kUlpBudget,
  // cosine(obs, ref) >= min_cosine, over the tensor or over every row; the margin is taken on
  // the deficit: (1 - cos) / (1 - min_cosine).
  kCosineFloor,
  // |obs_e - ref_e| <= F_e + floor_ulps * Quantum(row max |ref|) [+ term_ulps fp32 ULPs of the
  // row's terms with FloorScale::kTerms], F_e the element's format bound
  // (TensorMetrics::rounding_floor, filled from Profile::format_errors by the accuracy check
  // and attest compare; verify/tolerance/term_scale.h ComputeFormatBounds): what quantising the operands
  // with the family's element formats can move the element by. Metrics without floors: 0.
  kFormatBound,
};
// "baseline-ratio" "atol-rtol" "ulp" "cosine" "format-bound"
std::string_view Name(PolicyKind kind);

// What the floor of kBaselineRatio is a few ULPs of.
enum class FloorScale : uint8_t {
  kElement,  // |ref_e|: the element's own magnitude
  // max |ref| over the element's row: an output element is a sum over keys (o = sum_j p v_j;
  // dq = sum_j dS k_j), and its rounding error scales with the size of the terms, not with
  // the possibly cancelled result, so a row-relative floor does not fail tiny elements of
  // correct kernels.
  kRow,
  // the kRow floor PLUS Policy::term_ulps fp32 ULPs of the row's term magnitude
  // (RowMetrics::term_scale; verify/tolerance/term_scale.h): for gradients, whose row can cancel
  // exactly (dq = dk = 0 with one visible key) while a correct kernel's fp32 accumulation
  // error stays of the size of the terms P (|dP| + |D|) |k|. The terms are rounded in fp32
  // (the accumulator), the result in the output format, hence two parts. Metrics without
  // term magnitudes (has_term_scale false) get the kRow floor alone.
  kTerms,
};
// "element", "row", "terms".
std::string_view Name(FloorScale scale);

struct Policy {
  PolicyKind kind = PolicyKind::kBaselineRatio;
  double ratio = 0;       // kBaselineRatio: k
  double floor_ulps = 0;  // kBaselineRatio: n
  double term_ulps = 0;   // kBaselineRatio with kTerms: m fp32 ULPs of the row's terms
  // kBaselineRatio: the ratio term becomes max(ratio * B, R_e), R_e the element's rounding
  // floor (TensorMetrics::rounding_floor; verify/tolerance/term_scale.h): the first-order error of the
  // rounding points the profile admits (FlashAttention-2's P and dS in the input format, D
  // from the rounded O) that the "pt" baseline does not have. Where k x pt already exceeds it
  // the bound is unchanged; it matters where the baseline collapses (few terms). Metrics
  // without floors: R_e = 0.
  bool rounding_floor = false;
  FloorScale floor_scale = FloorScale::kRow;
  double atol = 0, rtol = 0;  // kAbsRel
  bool atol_relative_to_max = false;
  double ulps = 0;        // kUlpBudget
  double min_cosine = 0;  // kCosineFloor
  bool per_row = false;   // kCosineFloor: every row (else the whole tensor)
  // The format ULPs are counted in (kBaselineRatio's floor, kUlpBudget): the format the
  // kernel is supposed to deliver (bf16 o, fp32 lse), so that a producer storing a narrower
  // format than promised does not earn a looser floor. Unset: the metrics' output format.
  std::optional<Format> format;
  // The power-of-two pre-scale `format` is written at (reference/recipes/recipe.h
  // OutputRounding: x -> Decode(Encode(x * s)) / s): a ULP of x is Quantum(x * s, format) / s,
  // so a scaled E4M3 gradient's floor is not E4M3's subnormal spacing. Only with `format` set.
  double format_scale = 1.0;

  // "err <= 2x baseline + 2 bf16 ulp(row)", "err <= 0.04 max|ref| + 0.1|ref|",
  // "err <= 4 ulp", "cos >= 0.99 per row".
  std::string Describe() const;
  bool needs_baseline() const { return kind == PolicyKind::kBaselineRatio; }
};

Policy BaselineRatio(double ratio, double floor_ulps, FloorScale scale = FloorScale::kRow,
                     std::optional<Format> format = std::nullopt);
Policy AbsRel(double atol, double rtol, bool atol_relative_to_max = false);
Policy UlpBudget(double ulps, std::optional<Format> format = std::nullopt);
Policy CosineFloor(double min_cosine, bool per_row);

Policy FormatBound(double floor_ulps, FloorScale scale = FloorScale::kRow,
                   std::optional<Format> format = std::nullopt);

struct TensorPolicies {
  std::string tensor;            // "o", "lse", "dq", "dk", "dv"
  std::vector<Policy> policies;  // all must hold
};

struct Profile {
  std::string name;         // "bf16", "mxfp8-cudnn", ...
  std::string description;  // one line
  std::string evidence;     // where the numbers come from (one line)
  std::vector<TensorPolicies> tensors;
  // The "pt" of the baseline-ratio policies: empty for the same-precision PyTorch math path
  // (verify/tolerance/baseline.h kSdpaMath), or a recipe of reference/recipes whose reference
  // implementation (baseline.h RecipeReferenceForward/Backward) is the baseline.
  std::string baseline_recipe;
  // The recipe whose elementwise rounding points (term_scale.h RoundingPointsOf) give the
  // rounding floor of the policies that ask for one: "bf16" / "f16" (FlashAttention-2: P and
  // dS rounded to the input dtype) for those dtypes' rows; empty: no rounding floor.
  std::string rounding_recipe;
  // The family rows' element errors (kFormatBound policies); unset elsewhere.
  std::optional<FormatErrors> format_errors;

  // The policies for `tensor`, or nullptr when the profile does not judge it.
  const std::vector<Policy>* For(std::string_view tensor) const;
  bool needs_baseline() const;
  // Whether a policy floors on the gradients' term magnitudes (FloorScale::kTerms): then the
  // caller fills TensorMetrics rows with verify/tolerance/term_scale.h before Evaluate.
  bool needs_term_scale() const;
  // Whether a policy asks for rounding floors and the profile names rounding points: then the
  // caller fills TensorMetrics::rounding_floor (SetRoundingFloor) before Evaluate.
  bool needs_rounding_floor() const;
  // Whether a policy is a kFormatBound: then the caller fills TensorMetrics::rounding_floor
  // with the format bounds (and, for dq and dk, the term scales) before Evaluate.
  bool needs_format_bound() const;
};

// The profile table, built once: rows f32 bf16 f16 fp8 mxfp8 nvfp4, then one per recipe
// (mxfp8-cudnn mxfp8-pvbf16 nvfp4-mixed fp8-e4m3-tensor).
std::span<const Profile> AllProfiles();
const Profile* FindProfile(std::string_view name);
// The profile for a kernel: its declared profile, else its recipe's row, else the row of its
// first dtype. Errors name the kernel field that points nowhere.
Expected<const Profile*> ProfileFor(const Capabilities& caps);
// The default profile for problems of `dtype` (e4m3fn and e5m2 inputs map to "fp8").
const Profile* ProfileForDType(DType dtype);

// {"name", "description", "evidence", "summary", "tensors": {"o": [policy...], ...}}.
nlohmann::json ProfileToJson(const Profile& p);
// One line per tensor group: "o: err <= 2x baseline + 2 ulp(row); lse: ...; dq dk dv: ...".
std::string Summary(const Profile& p);
// Every profile, for `attest list profiles`: ProfileToJson with the summary appended to the
// description (the text listing prints name and description).
nlohmann::json ProfilesToJson();
nlohmann::json PolicyToJson(const Policy& p);

// Judges `m` by `policy`. `baseline` (metrics of the same-precision reference against the
// same oracle output) is required by kBaselineRatio; without it the verdict fails and says
// so. Non-finite mismatches always fail, whatever the policy (margin inf). The verdict's
// worst location is where observed / allowed is largest.
Verdict Evaluate(const Policy& policy, const TensorMetrics& m, const TensorMetrics* baseline,
                 std::string_view check = "accuracy");
// Every policy of the profile for m.tensor, in table order (empty when it has none).
std::vector<Verdict> EvaluateProfile(const Profile& profile, const TensorMetrics& m,
                                     const TensorMetrics* baseline,
                                     std::string_view check = "accuracy");

}  // namespace attest
