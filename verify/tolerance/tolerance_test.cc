// Tests of verify/tolerance/tolerance.h: each policy's margin computed by hand, the ULP floor that
// keeps an exact baseline from making the bound zero, permutations and NaN failing under
// every profile, and the profile table's required rows.
#include "verify/tolerance/tolerance.h"

#include "reference/recipes/recipe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace attest {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One (b, h, i) row of D = 4 values per row, 2 rows: [1, 2, 4, 8], [0.5, 0.25, -1, 3].
Layout RowsLayout() {
  Layout l;
  l.axes = {AxisRole::kSeq, AxisRole::kDim};
  return l;
}
const std::vector<double> kRef = {1, 2, 4, 8, 0.5, 0.25, -1, 3};

TensorMetrics Metrics(const std::vector<double>& obs, Format f = Format::kBF16) {
  auto m =
      Compare("o", Tensor::FromF64({2, 4}, obs), Tensor::FromF64({2, 4}, kRef), f, RowsLayout());
  EXPECT_TRUE(m.ok());
  return std::move(m).value();
}

TEST(Evaluate, ExactBaselineStillAllowsAFewUlps) {
  // The baseline is exact (its error is 0), so k * 0 = 0: only the floor remains. One bf16
  // ULP at 8 (the first row's max) is 2^-4; 2 ULPs of floor allow 0.125 in that row.
  const TensorMetrics exact = Metrics(kRef);
  ASSERT_EQ(exact.max_abs_error, 0);
  std::vector<double> obs = kRef;
  obs[1] += 0.0625;  // one ULP of the row scale
  const Verdict pass = Evaluate(BaselineRatio(2, 2), Metrics(obs), &exact);
  EXPECT_TRUE(pass.pass) << pass.message;
  EXPECT_DOUBLE_EQ(pass.allowed, 0.125);
  EXPECT_DOUBLE_EQ(pass.margin, 0.5);
  EXPECT_EQ(pass.worst.Coordinates(), "(i=0, d=1)");
  // Three row-ULPs fail, and the margin says by how much.
  obs[1] = kRef[1] + 0.1875;
  const Verdict fail = Evaluate(BaselineRatio(2, 2), Metrics(obs), &exact);
  EXPECT_FALSE(fail.pass);
  EXPECT_DOUBLE_EQ(fail.margin, 1.5);
  // An element-scaled floor at ref = 2 is 2 * 2^-6: the same error fails by much more.
  const Verdict elem = Evaluate(BaselineRatio(2, 2, FloorScale::kElement), Metrics(obs), &exact);
  EXPECT_DOUBLE_EQ(elem.allowed, 2 * std::ldexp(1.0, -6));
  EXPECT_DOUBLE_EQ(elem.margin, 0.1875 / elem.allowed);
}

// A floor counted in a scaled format (Policy::format_scale; recipe.h gradient_scales): small
// gradients written as E4M3 of 128 x dq. The rows' max is 8 / 1024 = 2^-7, under E4M3's
// smallest normal 2^-6: one unscaled ULP there is the subnormal step 2^-9, four times the
// row's own size over 16; scaled, one ULP of 2^-7 x 128 = 1 is 2^-3, so 2^-10 after the scale.
TEST(Evaluate, AScaledFormatCountsUlpsAtItsScale) {
  std::vector<double> ref = kRef, obs = kRef;
  for (double& x : ref) x /= 1024;
  obs = ref;
  obs[1] += 0x1p-10;  // one scaled ULP of the row: allowed (2 ULPs)
  auto metrics = [&](const std::vector<double>& o) {
    auto m = Compare("dq", Tensor::FromF64({2, 4}, o), Tensor::FromF64({2, 4}, ref),
                     Format::kF32, RowsLayout());
    EXPECT_TRUE(m.ok());
    return std::move(m).value();
  };
  const TensorMetrics exact = metrics(ref);
  Policy scaled = BaselineRatio(2, 2, FloorScale::kRow, Format::kE4M3FN);
  scaled.format_scale = 128;
  const Verdict pass = Evaluate(scaled, metrics(obs), &exact);
  EXPECT_TRUE(pass.pass) << pass.message;
  EXPECT_DOUBLE_EQ(pass.allowed, 2 * 0x1p-10);
  EXPECT_NE(scaled.Describe().find("e4m3fn x128 ulp(row)"), std::string::npos)
      << scaled.Describe();
  obs[1] = ref[1] + 0x1p-8;  // a quarter of the row's max: the scaled floor catches it
  EXPECT_FALSE(Evaluate(scaled, metrics(obs), &exact).pass);
  const Policy unscaled = BaselineRatio(2, 2, FloorScale::kRow, Format::kE4M3FN);
  const Verdict loose = Evaluate(unscaled, metrics(obs), &exact);
  EXPECT_TRUE(loose.pass) << "unscaled, 2 subnormal steps 2^-8 allow it: " << loose.message;
}

TEST(Evaluate, BaselineRatioScalesWithTheBaselineError) {
  std::vector<double> base = kRef;
  base[6] += 0.5;  // baseline max error 0.5
  const TensorMetrics baseline = Metrics(base);
  std::vector<double> obs = kRef;
  obs[0] += 0.9;  // row 0: allowed 2 * 0.5 + 2 * 2^-4
  const Verdict v = Evaluate(BaselineRatio(2, 2), Metrics(obs), &baseline);
  EXPECT_TRUE(v.pass);
  EXPECT_DOUBLE_EQ(v.allowed, 1.0 + 0.125);
  EXPECT_DOUBLE_EQ(v.margin, 0.9 / 1.125);
  // Without a baseline the policy cannot pass.
  const Verdict none = Evaluate(BaselineRatio(2, 2), Metrics(obs), nullptr);
  EXPECT_FALSE(none.pass);
  EXPECT_NE(none.message.find("baseline"), std::string::npos);
}

TEST(Evaluate, AbsRelAndUlpBudgetAndCosine) {
  std::vector<double> obs = kRef;
  obs[3] = 8.5;  // err 0.5 at |ref| = 8
  const TensorMetrics m = Metrics(obs);
  const Verdict ar = Evaluate(AbsRel(0.1, 0.05), m, nullptr);
  EXPECT_DOUBLE_EQ(ar.allowed, 0.1 + 0.4);
  EXPECT_DOUBLE_EQ(ar.margin, 1.0);
  EXPECT_TRUE(ar.pass);                                             // margin exactly 1 passes (<=)
  const Verdict arm = Evaluate(AbsRel(0.01, 0, true), m, nullptr);  // 0.01 * max|ref| = 0.08
  EXPECT_DOUBLE_EQ(arm.allowed, 0.08);
  EXPECT_FALSE(arm.pass);
  // 0.5 at 8 in bf16 is 8 ULPs (spacing 2^-4 in [8, 16)).
  const Verdict ulp = Evaluate(UlpBudget(4), m, nullptr);
  EXPECT_DOUBLE_EQ(ulp.observed, 8);
  EXPECT_DOUBLE_EQ(ulp.margin, 2);
  EXPECT_EQ(ulp.worst.Coordinates(), "(i=0, d=3)");
  // Row cosine of row 0: dot / (|obs| |ref|).
  const double dot = 1 + 4 + 16 + 8 * 8.5, no = std::sqrt(1 + 4 + 16 + 72.25), nr = std::sqrt(85.0);
  const Verdict cos = Evaluate(CosineFloor(0.9999, true), m, nullptr);
  EXPECT_NEAR(cos.observed, 1 - dot / (no * nr), 1e-15);
  EXPECT_NEAR(cos.margin, cos.observed / 1e-4, 1e-9);
  EXPECT_EQ(cos.worst.Coordinates(), "(i=0)");
}

TEST(Evaluate, NanFailsEveryPolicyWithInfiniteMargin) {
  std::vector<double> obs = kRef;
  obs[5] = std::numeric_limits<double>::quiet_NaN();
  const TensorMetrics m = Metrics(obs);
  const TensorMetrics baseline = Metrics(kRef);
  for (const Policy& p :
       {BaselineRatio(1e9, 1e9), AbsRel(1e9, 1e9), UlpBudget(1e9), CosineFloor(-1, true)}) {
    const Verdict v = Evaluate(p, m, &baseline);
    EXPECT_FALSE(v.pass) << p.Describe();
    EXPECT_EQ(v.margin, kInf);
    EXPECT_EQ(v.worst.Coordinates(), "(i=1, d=1)");
    EXPECT_NE(v.message.find("non-finite"), std::string::npos);
  }
}

TEST(Evaluate, PermutedRowFailsEveryProfile) {
  // Same multiset of values per row (same norms), two elements swapped: every profile's
  // policies must reject it even with a generous baseline error.
  const Problem p = [] {
    Problem q;
    q.batch = 1;
    q.seqlen_q = q.seqlen_k = 16;
    q.heads_q = q.heads_kv = 2;
    q.head_dim = q.head_dim_v = 64;
    return q;
  }();
  const Shape shape = p.OShape();
  std::vector<double> ref(static_cast<size_t>(Tensor::NumElements(shape)));
  uint64_t s = 12345;
  for (double& x : ref) {  // deterministic pseudo-random values in (-1, 1)
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<double>(s >> 11) * 0x1.0p-53 * 2 - 1;
  }
  const Tensor reference = Tensor::FromF64(shape, ref);
  Tensor permuted = reference.Clone();
  // The largest and smallest entries of row (b=0, i=7, h=1) trade places.
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < 64; ++d) {
    if (reference.at<double>({0, 7, 1, d}) < reference.at<double>({0, 7, 1, lo})) lo = d;
    if (reference.at<double>({0, 7, 1, d}) > reference.at<double>({0, 7, 1, hi})) hi = d;
  }
  std::swap(permuted.at<double>({0, 7, 1, lo}), permuted.at<double>({0, 7, 1, hi}));
  // A baseline with bf16-sized errors: the reference rounded to bf16.
  const Tensor base = RoundTensor(reference, DType::kBF16);
  for (const Profile& prof : AllProfiles()) {
    const Layout l = LayoutOf(p, "o");
    auto m = Compare("o", permuted, reference, Format::kBF16, l);
    auto b = Compare("o", base, reference, Format::kBF16, l);
    ASSERT_TRUE(m.ok() && b.ok());
    EXPECT_DOUBLE_EQ(m->obs_l2, m->ref_l2);
    bool failed = false;
    for (const Verdict& v : EvaluateProfile(prof, *m, &*b)) {
      if (!v.pass) {
        failed = true;
        EXPECT_EQ(v.worst.b, 0);
        EXPECT_EQ(v.worst.i, 7);
        EXPECT_EQ(v.worst.h, 1);
      }
    }
    EXPECT_TRUE(failed) << "profile " << prof.name << " passed a permuted row";
    // ... while the baseline itself (correct rounding) passes against itself.
    for (const Verdict& v : EvaluateProfile(prof, *b, &*b)) {
      EXPECT_TRUE(v.pass) << prof.name << ": " << v.message;
    }
  }
}

TEST(Evaluate, UlpsAreCountedInThePromisedFormat) {
  // Stored as f32 (metrics in f32 ULPs), promised as bf16: the floor and the budget are in
  // bf16 ULPs, so a wider stored format neither tightens nor loosens the bound ...
  const TensorMetrics exact = Metrics(kRef, Format::kF32);
  std::vector<double> obs = kRef;
  obs[1] += 0.0625;  // one bf16 ULP at the row scale 8, 2^19 f32 ULPs
  const TensorMetrics m = Metrics(obs, Format::kF32);
  EXPECT_TRUE(Evaluate(BaselineRatio(2, 2, FloorScale::kRow, Format::kBF16), m, &exact).pass);
  EXPECT_FALSE(Evaluate(BaselineRatio(2, 2), m, &exact).pass);
  const Verdict u = Evaluate(UlpBudget(3, Format::kBF16), m, nullptr);
  EXPECT_FALSE(u.pass);
  EXPECT_DOUBLE_EQ(u.observed, 4.0);  // 0.0625 at 2 is 4 bf16 ULPs (spacing 2^-6 in [2, 4))
  EXPECT_EQ(u.worst.Coordinates(), "(i=0, d=1)");
  // ... and a narrower stored format (lse delivered in bf16 where fp32 is promised) does not
  // earn a looser floor.
  const TensorMetrics narrow = Metrics(obs, Format::kBF16);
  EXPECT_FALSE(Evaluate(BaselineRatio(4, 4, FloorScale::kRow, Format::kF32), narrow, &exact).pass);
}

TEST(Evaluate, FormatBoundIsTheElementsBoundPlusTheUlpFloor) {
  // Element 1 (ref 2) may move by its format bound 0.25 plus 2 bf16 ULPs of the row's 8
  // (0.125); without bounds only the floor remains.
  std::vector<double> obs = kRef;
  obs[1] += 0.3;
  TensorMetrics m = Metrics(obs);
  const Verdict floor_only = Evaluate(FormatBound(2), m, nullptr);
  EXPECT_FALSE(floor_only.pass);
  EXPECT_NE(floor_only.message.find("format bounds unknown"), std::string::npos);
  std::vector<double> bound(8, 0.0);
  bound[1] = 0.25;
  ASSERT_TRUE(SetRoundingFloor(m, Tensor::FromF64({2, 4}, bound)).ok());
  const Verdict v = Evaluate(FormatBound(2), m, nullptr);
  EXPECT_TRUE(v.pass) << v.message;
  EXPECT_DOUBLE_EQ(v.allowed, 0.375);
  EXPECT_DOUBLE_EQ(v.margin, 0.3 / 0.375);
  EXPECT_EQ(FormatBound(2, FloorScale::kRow, Format::kBF16).Describe(),
            "err <= format bound + 2 bf16 ulp(row)");
  EXPECT_FALSE(FormatBound(2).needs_baseline());
}

TEST(Profiles, FamilyRowsAreFormatBounds) {
  // verify/tolerance/tolerance.cc: E4M3 under OCP FLOOR E8M0 saturates by up to 1/8, E2M1 rounds by 2^-2.
  EXPECT_DOUBLE_EQ(FindProfile("mxfp8")->format_errors->qk_rel, 0.125);
  EXPECT_DOUBLE_EQ(FindProfile("nvfp4")->format_errors->qk_rel, 0.25);
  EXPECT_DOUBLE_EQ(FindProfile("fp8")->format_errors->qk_rel, 0.0625);
  for (const char* name : {"fp8", "mxfp8", "nvfp4"}) {
    const Profile* p = FindProfile(name);
    EXPECT_TRUE(p->needs_format_bound()) << name;
    EXPECT_FALSE(p->needs_baseline()) << name;
    for (const char* t : {"o", "lse", "dq", "dk", "dv"}) {
      EXPECT_EQ(p->For(t)->front().kind, PolicyKind::kFormatBound) << name << " " << t;
    }
  }
  EXPECT_FALSE(FindProfile("bf16")->needs_format_bound());
  EXPECT_FALSE(FindProfile("mxfp8-pvbf16")->needs_format_bound());
}

TEST(Profiles, TableHasTheRequiredRows) {
  for (const char* name : {"f32", "bf16", "f16", "fp8", "mxfp8", "nvfp4", "mxfp8-cudnn",
                           "mxfp8-pvbf16", "nvfp4-mixed", "fp8-e4m3-tensor"}) {
    const Profile* p = FindProfile(name);
    ASSERT_NE(p, nullptr) << name;
    for (const char* t : {"o", "lse", "dq", "dk", "dv"}) {
      ASSERT_NE(p->For(t), nullptr) << name << " " << t;
      EXPECT_FALSE(p->For(t)->empty());
    }
    EXPECT_FALSE(p->evidence.empty());
    const nlohmann::json j = ProfileToJson(*p);
    EXPECT_EQ(j["name"], name);
    EXPECT_TRUE(j["tensors"].contains("dq"));
  }
  // The H200 measurements: bf16 dq reached 3.7x pt, so the bf16 gradient ratio exceeds it.
  EXPECT_GE(FindProfile("bf16")->For("dq")->front().ratio, 3.7);
  EXPECT_GE(FindProfile("bf16")->For("o")->front().ratio, 1.14);
}

TEST(Profiles, ProfileForCapabilities) {
  Capabilities caps;
  caps.dtypes = {DType::kF16};
  EXPECT_EQ((*ProfileFor(caps))->name, "f16");
  caps.recipe = "mxfp8-cudnn";
  EXPECT_EQ((*ProfileFor(caps))->name, "mxfp8-cudnn");
  caps.profile = "bf16";
  EXPECT_EQ((*ProfileFor(caps))->name, "bf16");
  caps.profile = "nope";
  auto bad = ProfileFor(caps);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("capabilities.profile"), std::string::npos);
  EXPECT_EQ(ProfileForDType(DType::kE4M3FN)->name, "fp8");
}

// The recipe rows judge a low-precision kernel against the reference implementation of its
// own recipe with the bf16 row's numbers, unchanged (docs/tolerances.md has the measured
// headroom); the same-precision rows keep PyTorch's math path.
TEST(Profiles, RecipeRowsUseTheirRecipeReferenceWithTheBf16Rule) {
  const Profile* bf16 = FindProfile("bf16");
  ASSERT_NE(bf16, nullptr);
  EXPECT_TRUE(bf16->baseline_recipe.empty());
  for (const char* name : {"mxfp8-cudnn", "mxfp8-pvbf16", "nvfp4-mixed", "fp8-e4m3-tensor"}) {
    const Profile* p = FindProfile(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->baseline_recipe, name);
    EXPECT_NE(FindRecipe(p->baseline_recipe), nullptr) << name;
    EXPECT_TRUE(p->needs_baseline());
    for (const char* t : {"o", "lse", "dq", "dk", "dv"}) {
      ASSERT_EQ(p->For(t)->size(), bf16->For(t)->size()) << name << " " << t;
      const Policy& a = p->For(t)->front();
      const Policy& b = bf16->For(t)->front();
      EXPECT_EQ(a.kind, PolicyKind::kBaselineRatio) << name << " " << t;
      EXPECT_EQ(a.ratio, b.ratio) << name << " " << t;
      EXPECT_EQ(a.floor_ulps, b.floor_ulps) << name << " " << t;
      EXPECT_EQ(a.format, b.format) << name << " " << t;
    }
  }
}

}  // namespace
}  // namespace attest
