// The bias check (verify/checks/bias.h) end to end through RunCase: the correct model passes
// and reports its mean error; each directed-rounding mutant fails; a recipe that declares its
// truncation is judged against the bias the recipe reference computes with it, so a kernel
// that truncates as declared passes and one that declares it without doing it fails; a
// family-profile kernel and a tiny case abstain as skipped rows, never as passes.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "kernels/models/flash_models.h"
#include "kernels/mutants/mutants.h"
#include "reference/recipes/recipe.h"
#include "reference/recipes/recipe_json.h"
#include "run/run.h"
#include "verify/checks/bias.h"
#include "verify/checks/check.h"

namespace attest {
namespace {

// The gate's "dense batch 2" shape (run/suite.cc) with a fixed generator seed.
Case Dense(uint64_t seed = 11, int64_t sq = 128) {
  Case c;
  c.problem.batch = 2;
  c.problem.heads_q = c.problem.heads_kv = 4;
  c.problem.seqlen_q = sq;
  c.problem.seqlen_k = 128;
  c.problem.head_dim = c.problem.head_dim_v = 64;
  c.problem.dtype = DType::kBF16;
  c.generator = GeneratorSpec{"gaussian", seed, nlohmann::json::object()};
  return c;
}

RunResult RunBiasOn(Kernel& k, const Case& c) {
  const CheckInfo* check = FindCheck(kBiasCheck);
  EXPECT_NE(check, nullptr);
  RunOptions o;
  auto r = RunCase(k, c, std::span<const CheckInfo* const>(&check, 1), o, "dense");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return std::move(r).value();
}

// The bias verdicts of a run, tensor -> verdict.
std::vector<Verdict> BiasVerdicts(const RunResult& r) {
  std::vector<Verdict> out;
  for (const Verdict& v : r.report.verdicts) {
    if (v.check == kBiasCheck) out.push_back(v);
  }
  return out;
}

bool Fails(const RunResult& r, std::string_view tensor) {
  for (const Verdict& v : BiasVerdicts(r)) {
    if (v.tensor == tensor && !v.pass) return true;
  }
  return false;
}

// A bf16 recipe that rounds o toward zero by design and declares it.
const Recipe& DeclaredTruncatingRecipe() {
  static const Recipe* r = [] {
    Recipe x = *FindRecipe("bf16");
    x.name = "test-bf16-o-rz";
    x.description = "bf16, o truncated by design";
    x.output_rounding = Rounding::kTowardZero;
    auto d = DeclareRecipe(x, "test");
    EXPECT_TRUE(d.ok());
    return *d;
  }();
  return *r;
}

// Runs `inner` and claims the bf16 profile with `recipe` declared.
class Declaring : public Kernel {
 public:
  Declaring(std::unique_ptr<Kernel> inner, std::string recipe)
      : inner_(std::move(inner)), recipe_(std::move(recipe)) {}
  std::string name() const override { return "test/declares-" + recipe_; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
    c.profile = "bf16";
    c.recipe = recipe_;
    return c;
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

 private:
  std::unique_ptr<Kernel> inner_;
  std::string recipe_;
};

TEST(BiasCheck, CorrectModelPassesAndReportsItsMeanError) {
  auto k = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(k.ok());
  const RunResult r = RunBiasOn(**k, Dense());
  const std::vector<Verdict> v = BiasVerdicts(r);
  ASSERT_EQ(v.size(), 5u);  // o, lse, dq, dk, dv
  for (const Verdict& x : v) {
    EXPECT_TRUE(x.pass) << x.tensor << ": " << x.message;
    EXPECT_NE(x.message.find("mean signed error"), std::string::npos) << x.message;
    EXPECT_LE(x.margin, 1.0);
  }
}

TEST(BiasCheck, EveryDirectedRoundingMutantFailsOnItsTensors) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> expect = {
      {"o-rounded-toward-zero", {"o"}},
      {"grads-rounded-toward-zero", {"dq", "dk", "dv"}},
      {"p-rounded-toward-zero", {"o"}},
      {"bwd-accumulator-truncated", {"dk", "dv"}},
  };
  ASSERT_EQ(MutantsByClass(kBiasCheck).size(), expect.size());
  for (const auto& [name, tensors] : expect) {
    const MutantSpec* spec = FindMutant(name);
    ASSERT_NE(spec, nullptr) << name;
    MutantKernel k(*spec);
    const RunResult r = RunBiasOn(k, Dense());
    for (const std::string& t : tensors) EXPECT_TRUE(Fails(r, t)) << name << " " << t;
  }
}

TEST(BiasCheck, DeclaredTruncationIsExpectedNotFlagged) {
  const Recipe& rz = DeclaredTruncatingRecipe();
  // Truncates as declared: the recipe reference truncates too, so the excess is ~0 while
  // the message still shows o's mean error of about -0.5 ulp toward zero.
  Declaring honest(std::make_unique<Flash2Model>("test/o-rz", rz, DType::kBF16),
                   std::string(rz.name));
  const RunResult ok = RunBiasOn(honest, Dense());
  ASSERT_EQ(BiasVerdicts(ok).size(), 5u);
  for (const Verdict& v : BiasVerdicts(ok)) {
    EXPECT_TRUE(v.pass) << v.tensor << ": " << v.message;
    if (v.tensor == "o") EXPECT_NE(v.message.find("radial -0.4"), std::string::npos) << v.message;
  }
  // Declares the truncation, rounds to nearest: its o is half an ulp above what it declared.
  auto rn = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(rn.ok());
  Declaring liar(std::move(rn).value(), std::string(rz.name));
  EXPECT_TRUE(Fails(RunBiasOn(liar, Dense()), "o"));
}

TEST(BiasCheck, AbstainsAsASkippedRow) {
  // Two query rows: o has 2 x 4 x 2 rows of 64 values, below the 32 blocks of the minimum.
  auto k = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(k.ok());
  const RunResult r = RunBiasOn(**k, Dense(11, 2));
  bool skipped = false;
  for (const SkippedRow& s : r.report.skipped) {
    if (s.check == kBiasCheck && s.reason.find("below the minimum sample") != std::string::npos)
      skipped = true;
  }
  // Some tensors (dk, dv: 128 key rows) still have a sample; the others' abstention is said.
  for (const Verdict& v : BiasVerdicts(r)) {
    EXPECT_NE(v.message.find("abstained: o:"), std::string::npos) << v.message;
  }
  EXPECT_TRUE(skipped || !BiasVerdicts(r).empty());
  // A family profile without a recipe: nothing says where it rounds.
  auto fp8 = Kernels().Create("cpu/fp8-e4m3-tensor");
  ASSERT_TRUE(fp8.ok());
  if ((*fp8)->capabilities().recipe.empty()) {
    const RunResult f = RunBiasOn(**fp8, Dense());
    EXPECT_TRUE(BiasVerdicts(f).empty());
  }
}

}  // namespace
}  // namespace attest
