// Tests of the rounding floors in use (verify/tolerance/term_scale.h): FlashAttention-2's recipe
// reference bounded by them on tiny cases (and reaching most of them), the profile wiring and
// Evaluate's max(k x pt, R_e).
#include "verify/tolerance/term_scale.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <tuple>

#include "reference/case/inputs.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/recipes/recipe.h"
#include "verify/metrics/metrics.h"
#include "verify/tolerance/baseline.h"
#include "verify/tolerance/tolerance.h"

namespace attest {
namespace {

// The floor bounds what it claims to bound: FlashAttention-2's recipe reference
// (baseline.h RecipeReferenceBackward: P and dS rounded to the input dtype, D from the rounded
// O, everything else float64, outputs rounded once) differs from the oracle by at most the
// rounding floor plus its own output rounding, on the tiny cases where the SDPA-math "pt"
// collapses (Sq, Sk <= 6: every row within the floor's exact worst-case range of 16 terms).
// And the floor is not vacuous: the largest ratio is reported and must exceed 0.2.
TEST(RoundingFloors, BoundFlashAttention2RoundingOnTinyCases) {
  double worst = 0;
  int64_t cases = 0;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const Recipe& recipe = *FindRecipe(dtype == DType::kBF16 ? "bf16" : "f16");
    const Format f = *FormatOf(dtype);
    const RoundingPoints pts = RoundingPointsOf(recipe, dtype);
    for (uint64_t seed = 1; seed <= 60; ++seed) {
      Problem p;
      p.batch = 1;
      p.heads_q = 2;
      p.heads_kv = seed % 2 ? 1 : 2;
      p.seqlen_q = 1 + static_cast<int64_t>(seed % 3) * 2;
      p.seqlen_k = 1 + static_cast<int64_t>(seed % 6);
      p.head_dim = 16;
      p.head_dim_v = seed % 4 ? 16 : 32;
      p.causal = seed % 5 == 0;
      p.softcap = seed % 7 == 0 ? 1.0 : 0.0;
      p.dtype = dtype;
      Case c;
      c.problem = p;
      c.generator = seed % 2 ? GeneratorSpec{"outlier-channels", seed,
                                             nlohmann::json{{"count", 1}, {"scale", 8.0}}}
                             : GeneratorSpec{"gaussian", seed, nlohmann::json{{"std", 3.0}}};
      auto in = MakeCaseInputs(c);
      ASSERT_TRUE(in.ok()) << in.error().message;
      const BackwardOut ref = Backward<double>(p, in->q, in->k, in->v, in->dout);
      auto rr = RecipeReferenceBackward(p, recipe, in->q, in->k, in->v, in->dout);
      ASSERT_TRUE(rr.ok()) << rr.error().message;
      auto fl = ComputeRoundingFloors(p, pts, in->q, in->k, in->v, in->dout, ref.lse, ref.o,
                                      ref.delta);
      ASSERT_TRUE(fl.ok()) << fl.error().message;
      ++cases;
      for (const auto& [got_t, ref_t, fl_t, name] :
           {std::tuple{&rr->o, &ref.o, &fl->o, "o"}, std::tuple{&rr->dq, &ref.dq, &fl->dq, "dq"},
            std::tuple{&rr->dk, &ref.dk, &fl->dk, "dk"},
            std::tuple{&rr->dv, &ref.dv, &fl->dv, "dv"}}) {
        const auto g = got_t->span<const double>();
        const auto r = ref_t->span<const double>();
        const auto b = fl_t->span<const double>();
        for (size_t e = 0; e < g.size(); ++e) {
          // The reference's own output rounding (<= 1/2 ulp at the rounded value; one ulp
          // at the exact one covers a binade change), plus second-order terms (u^2).
          const double out_round = Quantum(std::max(std::fabs(r[e]), std::fabs(g[e])), f);
          const double err = std::fabs(g[e] - r[e]);
          EXPECT_LE(err, 1.01 * b[e] + out_round)
              << Name(dtype) << " seed " << seed << " " << name << "[" << e << "]";
          if (b[e] > out_round) worst = std::max(worst, (err - 0.5 * out_round) / b[e]);
        }
      }
    }
  }
  std::printf("recipe reference vs oracle: largest (err - ulp/2) / floor over %lld cases: %.3g\n",
              static_cast<long long>(cases), worst);
  EXPECT_GT(worst, 0.2) << "a floor this far above the rounding it bounds proves nothing";
}

TEST(RoundingFloors, OnlyTheBf16AndF16ProfilesUseThem) {
  for (const Profile& pr : AllProfiles()) {
    const bool want = pr.name == "bf16" || pr.name == "f16";
    EXPECT_EQ(pr.needs_rounding_floor(), want) << pr.name;
    if (want) {
      EXPECT_EQ(pr.rounding_recipe, pr.name);
      for (const char* t : {"o", "dq", "dk", "dv"}) {
        EXPECT_TRUE(pr.For(t)->front().rounding_floor) << pr.name << " " << t;
      }
      EXPECT_FALSE(pr.For("lse")->front().rounding_floor) << pr.name;
    }
  }
  // Recipe rounding points: block-scaled and fp32 operands have none.
  const RoundingPoints mx = RoundingPointsOf(*FindRecipe("mxfp8-cudnn"), DType::kBF16);
  EXPECT_FALSE(mx.ds_dq || mx.ds_dk);
  EXPECT_TRUE(mx.p_pv && mx.p_pv->format == Format::kE4M3FN && mx.p_pv->pre_scale == 16);
}

// max(k B, R): the floor replaces k x pt only where it is larger; elsewhere the bound is the
// old one to the bit.
TEST(RoundingFloors, EvaluateTakesTheLargerOfRatioAndFloor) {
  Tensor obs = Tensor::Zeros(DType::kF64, {1, 1, 1, 4});
  Tensor ref = Tensor::Zeros(DType::kF64, {1, 1, 1, 4});
  Tensor base = Tensor::Zeros(DType::kF64, {1, 1, 1, 4});
  for (int e = 0; e < 4; ++e) {
    ref.data<double>()[e] = 1.0;
    base.data<double>()[e] = 1.0;
    obs.data<double>()[e] = 1.0 + 0.01 * (e + 1);
  }
  base.data<double>()[0] = 1.0 + 1e-3;
  Problem p;
  p.batch = p.heads_q = p.heads_kv = p.seqlen_q = 1;
  p.seqlen_k = 1;
  p.head_dim = p.head_dim_v = 4;
  auto m = Compare("o", obs, ref, Format::kBF16, LayoutOf(p, "o"));
  auto bm = Compare("o", base, ref, Format::kBF16, LayoutOf(p, "o"));
  ASSERT_TRUE(m.ok() && bm.ok());
  Policy pol = BaselineRatio(2, 0, FloorScale::kRow, Format::kBF16);
  pol.rounding_floor = true;
  const Verdict without = Evaluate(pol, *m, &*bm);  // no floors set: 2 x 1e-3
  EXPECT_NEAR(without.allowed, 2e-3, 1e-12);
  Tensor fl = Tensor::Zeros(DType::kF64, {1, 1, 1, 4});
  for (int e = 0; e < 4; ++e) fl.data<double>()[e] = e < 2 ? 1e-4 : 0.05;
  ASSERT_TRUE(SetRoundingFloor(*m, fl).ok());
  const Verdict with = Evaluate(pol, *m, &*bm);
  // Elements 0, 1: 2e-3 (floor smaller) -> margins 5, 10; elements 2, 3: 0.05 -> 0.6, 0.8.
  EXPECT_FALSE(with.pass);
  EXPECT_NEAR(with.allowed, 2e-3, 1e-12);
  EXPECT_NEAR(with.margin, 10, 1e-9);
  EXPECT_EQ(with.worst.flat, 1);
  pol.rounding_floor = false;  // the policy decides, not the metrics
  EXPECT_NEAR(Evaluate(pol, *m, &*bm).allowed, 2e-3, 1e-12);
  EXPECT_FALSE(SetRoundingFloor(*m, Tensor::Zeros(DType::kF64, {3})).ok());
}

}  // namespace
}  // namespace attest
