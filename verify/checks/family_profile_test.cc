// Kernels that declare only a low-precision family profile ("fp8", "mxfp8", "nvfp4";
// verify/tolerance/tolerance.cc) and no recipe: correct CPU models (kernels/models/lowp_models.h, and
// MXFP8 models of declared FLOOR / RCEIL recipes as in declared_recipe_test.cc) wrapped to
// report the family profile alone must pass; seeded bugs (kernels/mutants/) wrapped the same
// way must still fail accuracy. The survey (disabled by default; run with
// --gtest_also_run_disabled_tests) prints every failing verdict of the gate with its margin
// and the worst margin per (kernel, check, tensor): the numbers of docs/tolerances.md
// "The family rows".
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/kernel.h"
#include "kernels/models/lowp_models.h"
#include "kernels/mutants/mutants.h"
#include "reference/formats/quantize.h"
#include "reference/recipes/recipe.h"
#include "reference/recipes/recipe_json.h"
#include "verify/checks/check.h"
#include "verify/checks/recipe_test_kernels.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"
#include "verify/tolerance/term_scale.h"
#include "verify/tolerance/tolerance.h"

namespace attest {
namespace {

using recipe_test::Declare;
using recipe_test::FamilyOnly;
using recipe_test::Mxfp8Recipe;
using recipe_test::SpecFor;

// Registers `recipe` (as a kernel's capabilities JSON does) and returns a model running it
// with cpu/mxfp8-pvbf16's head dims, GQA and varlen claims.
std::unique_ptr<Kernel> DeclaredMxfp8Model(const std::string& name, const std::string& mode) {
  static std::deque<LowpModelSpec> specs;  // models keep a reference
  static std::deque<std::string> names;    // specs keep views
  const std::string recipe = "test-family-mxfp8-" + mode;
  Declare(Mxfp8Recipe(recipe, mode));
  names.push_back(name);
  const std::string& model_name = names.back();
  names.push_back(recipe);
  specs.push_back(SpecFor(model_name, names.back()));
  return std::make_unique<LowpModel>(specs.back());
}

std::unique_ptr<Kernel> BuiltinLowp(std::string_view name) {
  for (const LowpModelSpec& s : LowpModelSpecs()) {
    if (s.name == name) return std::make_unique<LowpModel>(s);
  }
  ADD_FAILURE() << "no model " << name;
  return nullptr;
}

std::unique_ptr<Kernel> Mutant(std::string_view name) {
  const MutantSpec* spec = FindMutant(name);
  EXPECT_NE(spec, nullptr) << name;
  return std::make_unique<MutantKernel>(*spec);
}

RunResult RunSuiteOn(Kernel& k, const char* suite, uint64_t seed = 0) {
  RunOptions o;
  o.kernel_spec = k.name();
  o.seed = seed;
  auto r = RunSuite(k, *FindSuite(suite), o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return std::move(r).value();
}

// Prints the failing verdicts and the worst margin per (check, tensor); returns the worst
// margin over the accuracy verdicts.
double Summarise(const std::string& kernel, const RunResult& r) {
  std::map<std::string, double> worst;
  double acc = 0;
  int failed = 0;
  for (const Verdict& v : r.report.verdicts) {
    const std::string key = v.check + " " + v.tensor + " [" + v.policy + "]";
    worst[key] = std::max(worst[key], v.margin);
    if (v.check == "accuracy") acc = std::max(acc, v.margin);
    if (!v.pass) {
      ++failed;
      std::printf("  FAIL %s | %s | %s %s margin %.3g | %s\n", kernel.c_str(),
                  v.case_label.c_str(), v.check.c_str(), v.tensor.c_str(), v.margin,
                  v.message.c_str());
    }
  }
  std::printf("%s: %d of %zu verdicts failed\n", kernel.c_str(), failed,
              r.report.verdicts.size());
  for (const auto& [key, m] : worst) std::printf("    worst %-70s %.3g\n", key.c_str(), m);
  return acc;
}

// The family a mutant's parent would declare: its recipe's family, mxfp8 for bf16 / f16
// parents (a bf16 kernel is within every family bound; only its bug is not).
std::string FamilyOf(const MutantSpec& spec) {
  const std::string_view r = spec.parent_recipe;
  if (r.starts_with("nvfp4")) return "nvfp4";
  if (r.starts_with("fp8")) return "fp8";
  return "mxfp8";
}

// The element errors of the mxfp8 row (verify/tolerance/tolerance.cc): a block whose amax is just below
// a power of two saturates under OCP FLOOR scales by almost 1/8 of the value, above E4M3's RNE
// 2^-4 (so 2^-4 alone would be too small) and never beyond 1/8; RCEIL stays within 2^-4.
TEST(FamilyProfile, MxFloorSaturationIsTheEighthOfTheMxfp8Row) {
  std::vector<double> x(32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01 + 0.05 * static_cast<double>(i);
  x[7] = 1.999;  // amax: FLOOR X = 2^-8, 1.999 / X = 511.7 > 448
  const Tensor t = Tensor::FromF64({1, 32}, x);
  const FormatErrors& mx = *FindProfile("mxfp8")->format_errors;
  for (const ScaleMode mode : {ScaleMode::kFloor, ScaleMode::kRceil, ScaleMode::kCeil,
                               ScaleMode::kEven}) {
    SchemeOptions o;
    o.scheme = "mxfp8-e4m3";
    o.scale_mode = mode;
    auto q = Quantize(t, o);
    ASSERT_TRUE(q.ok()) << q.error().message;
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, std::fabs(q->dequant.data<double>()[i] - x[i]) / x[i]);
    }
    std::printf("  %s: worst relative element error %.4f\n", std::string(Name(mode)).c_str(),
                worst);
    EXPECT_LE(worst, mx.qk_rel) << Name(mode);
    if (mode == ScaleMode::kFloor) EXPECT_GT(worst, 0x1p-4);
    if (mode == ScaleMode::kRceil) EXPECT_LE(worst, 0x1p-4);
  }
}

// With one key the lse bound is the score bound itself: |scale| (2 rel + rel^2) sum_d |q||k|
// plus the underflow part (term_scale.h QuantisedScoreModel).
TEST(FamilyProfile, LseBoundAtOneKeyIsTheScoreBound) {
  Problem p;
  p.head_dim = p.head_dim_v = 2;
  p.seqlen_q = p.seqlen_k = 1;
  p.scale = 0.5;
  const Tensor q = Tensor::FromF64(p.QShape(), {3.0, -1.0});
  const Tensor k = Tensor::FromF64(p.KShape(), {2.0, 4.0});
  const Tensor v = Tensor::FromF64(p.VShape(), {1.0, -2.0});
  const Tensor lse = Tensor::FromF64(p.LseShape(), {0.5 * (6.0 - 4.0)});
  const FormatErrors e{.qk_rel = 0.125, .qk_abs = 0.01};
  auto f = ComputeFormatBounds(p, e, q, k, v, Tensor(), lse);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const double rel2 = 2 * 0.125 + 0.125 * 0.125;
  // m_q 3, |q|_1 4, m_k 4, |k|_1 6; sum_d |q||k| = 6 + 4 = 10.
  const double want = 0.5 * (rel2 * 10 + 0.01 * 1.125 * (3 * 6 + 4 * 4) + 0.01 * 0.01 * 2 * 3 * 4);
  EXPECT_NEAR(f->lse.data<double>()[0], want, 1e-12);
  EXPECT_FALSE(f->dq.defined());
}

// The gate for the FLOOR kernel (~20-25 s on two cores; the kernel of the original false
// alarms), its quick subset under the sanitizers (declared_recipe_test.cc does the same); the
// quick suite for the others (the disabled survey below runs all of them on the gate).
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* kGate = "quick";
#else
constexpr const char* kGate = "gate";
#endif

// The false alarms this file was written for: correct FLOOR and RCEIL MXFP8 kernels and the
// NVFP4 model declaring only "mxfp8" / "nvfp4" failed accuracy (lse by up to 2.6x at Sk = 1,
// o by 1.5x, the row cosines by up to 90x on cancelled gradient rows) under the estimated
// atol / rtol / cosine rows; the format bounds pass them.
TEST(FamilyProfile, CorrectKernelsDeclaringOnlyTheFamilyPass) {
  struct Row {
    std::unique_ptr<Kernel> inner;
    const char* profile;
    const char* suite;
  };
  std::vector<Row> rows;
  rows.push_back({DeclaredMxfp8Model("test/mxfp8-floor", "floor"), "mxfp8", kGate});
  rows.push_back({DeclaredMxfp8Model("test/mxfp8-rceil", "rceil"), "mxfp8", "quick"});
  rows.push_back({BuiltinLowp("cpu/nvfp4-mixed"), "nvfp4", "quick"});
  for (Row& row : rows) {
    FamilyOnly k(std::move(row.inner), row.profile);
    ASSERT_TRUE(k.capabilities().recipe.empty());
    const RunResult r = RunSuiteOn(k, row.suite);
    EXPECT_TRUE(r.report.passed()) << ToConsole(r.report);
    double lse = 0;
    for (const Verdict& v : r.report.verdicts) {
      if (v.check == "accuracy" && v.tensor == "lse") lse = std::max(lse, v.margin);
    }
    std::printf("  %s (%s): worst accuracy lse margin %.3g\n", k.name().c_str(), row.suite, lse);
  }
}

// Bugs that the format bounds and the structural checks still name under a family profile: lse
// off by ln 2 and lse scaled twice (accuracy: lse keeps ~8x headroom over a correct MXFP8
// kernel), a GQA head mapping (gqa-mha) and a top-left causal alignment (window-causal).
// Each wraps a mutant of kernels/mutants/ to report only the family profile.
TEST(FamilyProfile, SeededBugsDeclaringTheFamilyFailWithTheirBugClass) {
  for (const char* name : {"lse-log2", "lse-scaled-twice", "gqa-h-mod-hkv", "causal-top-left"}) {
    const MutantSpec& spec = *FindMutant(name);
    FamilyOnly k(Mutant(name), FamilyOf(spec));
    const RunResult r = RunSuiteOn(k, "quick");
    const Verdict* first = FirstFailure(r.report);
    ASSERT_NE(first, nullptr) << name << " passes under profile " << FamilyOf(spec);
    EXPECT_EQ(first->check, spec.bug_class) << name << ": " << first->message;
    std::printf("  mutant/%s@%s: first failure %s %s margin %.3g\n", name,
                FamilyOf(spec).c_str(), first->check.c_str(), first->tensor.c_str(),
                first->margin);
  }
}

// Correct models declaring only their family profile, on the gate: every failing verdict.
TEST(FamilyProfile, DISABLED_SurveyCorrectModelsOnTheGate) {
  std::vector<std::pair<std::unique_ptr<Kernel>, std::string>> ks;
  ks.emplace_back(DeclaredMxfp8Model("test/mxfp8-floor", "floor"), "mxfp8");
  ks.emplace_back(DeclaredMxfp8Model("test/mxfp8-rceil", "rceil"), "mxfp8");
  ks.emplace_back(BuiltinLowp("cpu/mxfp8-pvbf16"), "mxfp8");
  ks.emplace_back(BuiltinLowp("cpu/mxfp8-cudnn"), "mxfp8");
  ks.emplace_back(BuiltinLowp("cpu/nvfp4-mixed"), "nvfp4");
  ks.emplace_back(BuiltinLowp("cpu/fp8-e4m3-tensor"), "fp8");
  const char* suite = std::getenv("ATTEST_FAMILY_SUITE");
  for (auto& [inner, profile] : ks) {
    FamilyOnly k(std::move(inner), profile);
    const RunResult r = RunSuiteOn(k, suite != nullptr ? suite : "gate");
    Summarise(k.name(), r);
  }
}

// A random problem inside `caps` (the draw of run/tolerance_sweep.cc RandomCase: bf16, B
// 1-2, Hkv 1-2 with GQA up to 4:1, Sq, Sk 1-200, D from the head dims up to 128, none / causal
// / window / softcap / ALiBi), with its data drawn from one of five generators: N(0, 1),
// outlier channels x20, Student-t 3, per-token scales over 4 decades, peaked logits.
Case RandomCase(std::mt19937_64& rng, const Capabilities& caps, uint64_t seed) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  Problem& p = c.problem;
  p.dtype = DType::kBF16;
  std::vector<int64_t> dims;
  for (int64_t d : caps.head_dims) {
    if (d <= 128) dims.push_back(d);
  }
  const auto any_dim = [&] {
    return dims[static_cast<size_t>(pick(0, static_cast<int64_t>(dims.size()) - 1))];
  };
  p.head_dim = any_dim();
  p.head_dim_v = pick(0, 3) == 0 ? any_dim() : p.head_dim;
  p.batch = pick(1, 2);
  p.heads_kv = pick(1, 2);
  p.heads_q = p.heads_kv * (caps.gqa && pick(0, 1) ? pick(1, 4) : 1);
  p.seqlen_q = pick(1, 200);
  p.seqlen_k = pick(1, 200);
  switch (pick(0, 4)) {
    case 0:
      break;
    case 1:
      p.causal = true;
      break;
    case 2:
      p.window_left = pick(0, 64);
      p.window_right = pick(0, 1) ? pick(0, 64) : 0;
      break;
    case 3:
      p.softcap = std::vector<double>{5, 20, 30}[static_cast<size_t>(pick(0, 2))];
      break;
    default: {
      std::vector<double> slopes;
      for (int64_t h = 0; h < p.heads_q; ++h) {
        slopes.push_back(std::exp2(-1.0 - static_cast<double>(h)));
      }
      p.alibi_slopes = slopes;
      p.causal = pick(0, 1) == 1;
      break;
    }
  }
  const char* gens[] = {"gaussian", "outlier-channels", "heavy-tail", "token-scale-spread",
                        "peaked-logits"};
  c.generator = GeneratorSpec{gens[pick(0, 4)], seed, nlohmann::json::object()};
  return c;
}

// Correct models declaring only their family on random cases: the worst accuracy margin per
// tensor (ATTEST_FAMILY_CASES cases per model, default 200).
TEST(FamilyProfile, DISABLED_SurveyRandomCases) {
  const char* n_env = std::getenv("ATTEST_FAMILY_CASES");
  const int n = n_env != nullptr ? std::atoi(n_env) : 200;
  std::vector<std::pair<std::unique_ptr<Kernel>, std::string>> ks;
  ks.emplace_back(DeclaredMxfp8Model("test/mxfp8-floor", "floor"), "mxfp8");
  ks.emplace_back(BuiltinLowp("cpu/mxfp8-pvbf16"), "mxfp8");
  ks.emplace_back(BuiltinLowp("cpu/mxfp8-cudnn"), "mxfp8");
  ks.emplace_back(BuiltinLowp("cpu/nvfp4-mixed"), "nvfp4");
  ks.emplace_back(BuiltinLowp("cpu/fp8-e4m3-tensor"), "fp8");
  const CheckInfo* acc = FindCheck("accuracy");
  ASSERT_NE(acc, nullptr);
  const CheckInfo* const checks[] = {acc};
  for (auto& [inner, profile] : ks) {
    FamilyOnly k(std::move(inner), profile);
    const Capabilities caps = k.capabilities();
    std::mt19937_64 rng(7);
    std::map<std::string, double> worst;
    std::map<std::string, std::string> where;
    int cases = 0, failed = 0;
    for (int i = 0; i < n; ++i) {
      const Case c = RandomCase(rng, caps, 1000 + static_cast<uint64_t>(i));
      if (!caps.Covers(c.problem)) continue;
      RunOptions o;
      o.kernel_spec = k.name();
      auto r = RunCase(k, c, checks, o, "random " + std::to_string(i));
      ASSERT_TRUE(r.ok()) << r.error().message;
      ++cases;
      for (const Verdict& v : r->report.verdicts) {
        failed += !v.pass;
        if (v.margin > worst[v.tensor]) {
          worst[v.tensor] = v.margin;
          where[v.tensor] = c.generator->name + " " + v.message;
        }
      }
    }
    std::printf("%s: %d random cases, %d failing verdicts\n", k.name().c_str(), cases, failed);
    for (const auto& [t, m] : worst) {
      std::printf("    worst %-4s %.3g  (%s)\n", t.c_str(), m, where[t].substr(0, 160).c_str());
    }
  }
}

// Every mutant declaring only its family profile: the first failing check (report.h
// FirstFailure) against its bug_class, and the worst accuracy margin.
TEST(FamilyProfile, DISABLED_SurveyMutants) {
  const char* suite = std::getenv("ATTEST_FAMILY_SUITE");
  for (const MutantSpec& spec : MutantCatalogue()) {
    FamilyOnly k(Mutant(spec.name), FamilyOf(spec));
    const RunResult r = RunSuiteOn(k, suite != nullptr ? suite : "quick");
    const Verdict* first = FirstFailure(r.report);
    double acc = 0;
    std::string acc_tensor;
    for (const Verdict& v : r.report.verdicts) {
      if (v.check == "accuracy" && v.margin > acc) {
        acc = v.margin;
        acc_tensor = v.tensor;
      }
    }
    std::printf("%-34s %-6s bug_class %-17s first failure %-17s accuracy worst %s %.3g\n",
                std::string(spec.name).c_str(), FamilyOf(spec).c_str(),
                std::string(spec.bug_class).c_str(),
                first != nullptr ? first->check.c_str() : "(none)", acc_tensor.c_str(), acc);
  }
}

}  // namespace
}  // namespace attest
