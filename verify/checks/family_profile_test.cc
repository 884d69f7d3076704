// Kernels that declare only a low-precision family profile ("fp8", "mxfp8", "nvfp4";
// verify/tolerance.cc) and no recipe: correct CPU models (kernels/models/lowp_models.h, and
// MXFP8 models of declared FLOOR / RCEIL recipes as in declared_recipe_test.cc) wrapped to
// report the family profile alone must pass; seeded bugs (kernels/mutants/) wrapped the same
// way must still fail accuracy. The survey (disabled by default; run with
// --gtest_also_run_disabled_tests) prints every failing verdict of the gate with its margin
// and the worst margin per (kernel, check, tensor): the numbers of docs/tolerances.md
// "The family rows".
#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/kernel.h"
#include "kernels/models/lowp_models.h"
#include "kernels/mutants/mutants.h"
#include "reference/recipes/recipe.h"
#include "reference/recipes/recipe_json.h"
#include "verify/report.h"
#include "verify/run.h"
#include "verify/suite.h"

namespace attest {
namespace {

// mxfp8-pvbf16's recipe under another name, every MX scale mode set to `mode` (the same edit
// as declared_recipe_test.cc).
nlohmann::json Mxfp8Recipe(const std::string& name, const std::string& mode) {
  nlohmann::json r = RecipeToJson(*FindRecipe("mxfp8-pvbf16"));
  r["name"] = name;
  r["description"] = "MXFP8 E4M3, " + mode + " E8M0 scales per 32 along D for Q.K^T and dO.V^T";
  for (auto& [gemm, operands] : r["gemms"].items()) {
    for (auto& [side, op] : operands.items()) {
      if (op.contains("scale_mode")) op["scale_mode"] = mode;
    }
  }
  return r;
}

// Registers `recipe` (as a kernel's capabilities JSON does) and returns a model running it
// with cpu/mxfp8-pvbf16's head dims, GQA and varlen claims.
std::unique_ptr<Kernel> DeclaredMxfp8Model(const std::string& name, const std::string& mode) {
  static std::vector<std::unique_ptr<LowpModelSpec>> specs;  // models keep a pointer
  static std::vector<std::unique_ptr<std::string>> names;
  const std::string recipe = "test-family-mxfp8-" + mode;
  nlohmann::json j = CapabilitiesToJson(LowpModel(LowpModelSpecs()[1]).capabilities());
  j.erase("profile");
  j["recipe"] = Mxfp8Recipe(recipe, mode);
  auto caps = CapabilitiesFromJson(j);  // registers the recipe
  EXPECT_TRUE(caps.ok()) << caps.error().message;
  names.push_back(std::make_unique<std::string>(name));
  names.push_back(std::make_unique<std::string>(recipe));
  auto spec = std::make_unique<LowpModelSpec>(LowpModelSpecs()[1]);
  spec->name = *names[names.size() - 2];
  spec->recipe = *names.back();
  specs.push_back(std::move(spec));
  return std::make_unique<LowpModel>(*specs.back());
}

// A kernel that reports the family profile `profile` and no recipe; answers are `inner`'s.
class FamilyOnly final : public Kernel {
 public:
  FamilyOnly(std::unique_ptr<Kernel> inner, std::string profile)
      : inner_(std::move(inner)), profile_(std::move(profile)) {}
  std::string name() const override { return inner_->name() + "@" + profile_; }
  Capabilities capabilities() const override {
    Capabilities caps = inner_->capabilities();
    caps.recipe.clear();
    caps.profile = profile_;
    return caps;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return inner_->Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }
  std::optional<Format> BackwardDpFormat(const Problem& p) const override {
    return inner_->BackwardDpFormat(p);
  }

 private:
  std::unique_ptr<Kernel> inner_;
  std::string profile_;
};

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

// The family a mutant's parent would declare: its recipe's family, mxfp8 for bf16 / f16
// parents (a bf16 kernel is within every family bound; only its bug is not).
std::string FamilyOf(const MutantSpec& spec) {
  const std::string_view r = spec.parent_recipe;
  if (r.starts_with("nvfp4")) return "nvfp4";
  if (r.starts_with("fp8")) return "fp8";
  return "mxfp8";
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
