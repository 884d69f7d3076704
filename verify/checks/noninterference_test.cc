// Tests of the non-interference check (noninterference.h): a correct FlashAttention-2 model
// passes on causal, window, document and packed varlen cases; seeded leaks (MX scales shared
// along the sequence, a backward that ignores the diagonal mask, a claimed-deterministic
// jitter) fail with the right message; the published shared-scale repro reproduces.
#include "verify/checks/noninterference.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "verify/checks/check.h"
#include "kernels/mutants/mutants.h"
#include "verify/checks/check_test_kernels.h"

namespace attest {
namespace {

using check_test::Inputs;

const Verdict* Find(const std::vector<Verdict>& vs, std::string_view tensor) {
  for (const Verdict& v : vs) {
    if (v.tensor == tensor) return &v;
  }
  return nullptr;
}

void ExpectAllPass(const std::vector<Verdict>& vs, const char* what) {
  ASSERT_FALSE(vs.empty()) << what;
  for (const char* t : {"o", "lse", "dq", "dk", "dv"}) {
    const Verdict* v = Find(vs, t);
    ASSERT_NE(v, nullptr) << what << ": no verdict for " << t;
    EXPECT_TRUE(v->pass) << what << " " << t << ": " << v->message;
    EXPECT_EQ(v->margin, 0) << what << " " << t;
  }
}

TEST(NonInterference, Flash2PassesEveryMaskFamily) {
  auto kernel = check_test::MakeFlash2Bf16();
  const std::pair<const char*, Problem> cases[] = {
      {"causal", check_test::CausalProblem()},
      {"window", check_test::WindowProblem()},
      {"document", check_test::DocumentProblem()},
      {"varlen", check_test::VarlenProblem()}};
  for (const auto& [name, p] : cases) {
    NonInterferenceOptions options;
    options.seed = 7;
    ExpectAllPass(CheckNonInterference(*kernel, p, Inputs(p, 11), options), name);
  }
}

TEST(NonInterference, BatchEntriesDoNotSeeEachOther) {
  // No mask at all: only other batch entries are hidden, and they are protected.
  Problem p = check_test::BaseProblem(40, 40);
  p.batch = 2;
  auto kernel = check_test::MakeFlash2Bf16();
  ExpectAllPass(CheckNonInterference(*kernel, p, Inputs(p, 5)), "batch");
  // One dense sequence: nothing is hidden from anyone, the check does not apply.
  p.batch = 1;
  EXPECT_TRUE(CheckNonInterference(*kernel, p, Inputs(p, 5)).empty());
}

// A kernel whose sequences share a global V scale (per-tensor FP8 over the whole packed
// batch) leaks across packed sequences even without any mask.
class SharedTensorScaleV : public check_test::Wrapped {
 public:
  SharedTensorScaleV() : Wrapped("test/fp8-tensor-v") {}
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    OperandScheme s;
    s.kind = OperandKind::kBlock;
    s.block = "fp8-tensor-e4m3";
    const Tensor wide = ToF64(v);
    const auto span = wide.span<const double>();
    std::vector<float> f(span.begin(), span.end());
    auto r = QuantizeOperand(f, wide.shape(), wide.rank() - 1, s);
    EXPECT_TRUE(r.ok());
    return inner_->Forward(
        p, q, k, Tensor::FromF64(wide.shape(), std::vector<double>(r->begin(), r->end())));
  }
};

TEST(NonInterference, TensorScaleSharedAcrossPackedSequencesLeaks) {
  Problem p = check_test::VarlenProblem();
  p.causal = false;
  SharedTensorScaleV kernel;
  NonInterferenceOptions options;
  options.backward = false;
  const auto vs = CheckNonInterference(kernel, p, Inputs(p, 9), options);
  const Verdict* o = Find(vs, "o");
  ASSERT_NE(o, nullptr);
  EXPECT_FALSE(o->pass);
  EXPECT_NE(o->message.find("every key of sequence 0"), std::string::npos) << o->message;
  EXPECT_GE(o->worst.b, 1);
}

TEST(NonInterference, MxScalesAlongSequenceLeakUnderCausal) {
  check_test::MxVAlongSequence kernel;
  const Problem p = check_test::CausalProblem();
  const Recipe recipe = check_test::MxVAlongSequence::AsRecipe();
  NonInterferenceOptions options;
  options.seed = 7;
  options.repro = "repro-line";
  const auto vs = CheckNonInterference(kernel, p, Inputs(p, 11), options, &recipe);
  const Verdict* o = Find(vs, "o");
  ASSERT_NE(o, nullptr);
  EXPECT_FALSE(o->pass);
  EXPECT_TRUE(std::isinf(o->margin));
  EXPECT_GT(o->observed, 0);
  EXPECT_NE(o->message.find("leak through shared scales"), std::string::npos) << o->message;
  EXPECT_EQ(o->repro, "repro-line");
  // Without the recipe it is still a leak, reported as a mask leak.
  const auto plain = CheckNonInterference(kernel, p, Inputs(p, 11), options);
  ASSERT_NE(Find(plain, "o"), nullptr);
  EXPECT_NE(Find(plain, "o")->message.find("mask leak"), std::string::npos);
}

// The published repro: equal Q and K, V perturbed only at positions > t inside t's 32-block;
// with V quantised in 32-blocks along the sequence, O[:t+1] changes.
TEST(NonInterference, PublishedSharedScaleRepro) {
  Problem p = check_test::CausalProblem();
  p.heads_q = 1;
  CaseInputs in = Inputs(p, 21);
  in.k = in.q.Clone();
  const int64_t t = 40;  // inside the block [32, 64)
  NonInterferenceOptions options;
  options.pivot_rows = {t};
  options.same_block = 32;
  options.perturb_k = false;
  options.backward = false;
  const Recipe recipe = check_test::MxVAlongSequence::AsRecipe();
  check_test::MxVAlongSequence leaky;
  const auto bad = CheckNonInterference(leaky, p, in, options, &recipe);
  const Verdict* o = Find(bad, "o");
  ASSERT_NE(o, nullptr);
  EXPECT_FALSE(o->pass);
  EXPECT_LE(o->worst.i, t) << o->message;
  EXPECT_GE(o->worst.i, 32) << "rows of other blocks share no scale with the perturbed keys";
  EXPECT_NE(o->message.find("leak through shared scales"), std::string::npos);
  EXPECT_NE(o->message.find("{41,42,43,44,45,46,... (23)}"), std::string::npos) << o->message;
  // The correct model is bitwise clean on the same perturbations.
  auto good = check_test::MakeFlash2Bf16();
  const auto ok = CheckNonInterference(*good, p, in, options);
  ASSERT_NE(Find(ok, "o"), nullptr);
  EXPECT_TRUE(Find(ok, "o")->pass) << Find(ok, "o")->message;
  EXPECT_TRUE(Find(ok, "lse")->pass);
}

TEST(NonInterference, BackwardIgnoringDiagonalMaskLeaksIntoDkDv) {
  check_test::BackwardIgnoresDiagonalMask kernel;
  const Problem p = check_test::CausalProblem();
  NonInterferenceOptions options;
  options.seed = 7;
  const auto vs = CheckNonInterference(kernel, p, Inputs(p, 11), options);
  const Verdict* dk = Find(vs, "dk");
  const Verdict* dv = Find(vs, "dv");
  ASSERT_NE(dk, nullptr);
  ASSERT_NE(dv, nullptr);
  EXPECT_FALSE(dk->pass) << dk->message;
  EXPECT_FALSE(dv->pass) << dv->message;
  EXPECT_NE(dk->message.find("mask leak"), std::string::npos) << dk->message;
  EXPECT_NE(dk->message.find("cannot see key"), std::string::npos) << dk->message;
  // Its forward is the correct one.
  EXPECT_TRUE(Find(vs, "o")->pass);
}

// The catalogue's engine-hook mutant: partially masked backward tiles computed without the
// mask.
TEST(NonInterference, EngineFaultDiagonalTileUnmaskedLeaks) {
  MutantKernel bad(*FindMutant("bwd-diag-tile-unmasked"));
  for (const Problem& p : {check_test::CausalProblem(), check_test::WindowProblem()}) {
    const auto vs = CheckNonInterference(bad, p, Inputs(p, 11));
    bool failed = false;
    for (const Verdict& v : vs) failed = failed || !v.pass;
    EXPECT_TRUE(failed);
    EXPECT_TRUE(Find(vs, "o")->pass) << "its forward is correct";
  }
}

TEST(NonInterference, NondeterministicKernelJudgedAgainstItsSpread) {
  const Problem p = check_test::CausalProblem();
  const CaseInputs in = Inputs(p, 11);
  NonInterferenceOptions options;
  options.seed = 7;
  options.backward = false;
  check_test::Jittery honest(/*claim_deterministic=*/false);
  const auto ok = CheckNonInterference(honest, p, in, options);
  ASSERT_NE(Find(ok, "o"), nullptr);
  EXPECT_TRUE(Find(ok, "o")->pass) << Find(ok, "o")->message;
  EXPECT_EQ(Find(ok, "o")->policy, "change <= max(run-to-run spread, 2 ulp)");
  check_test::Jittery liar(/*claim_deterministic=*/true);
  const auto bad = CheckNonInterference(liar, p, in, options);
  ASSERT_NE(Find(bad, "o"), nullptr);
  EXPECT_FALSE(Find(bad, "o")->pass);
  // The jittered element is o[b=0, i=0, h=0, d=0].
  EXPECT_EQ(Find(bad, "o")->worst.i, 0);
  EXPECT_EQ(Find(bad, "o")->worst.d, 0);
}

// Flips the last bit of a different element of o on every call, as unordered accumulation
// does: two unperturbed runs cannot sample the spread of every element.
class RovingJitter : public check_test::Wrapped {
 public:
  RovingJitter() : Wrapped("test/roving-jitter") {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = false;  // forwards the plain entry points only
    c.deterministic = false;
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto r = inner_->Forward(p, q, k, v);
    if (auto* f = std::get_if<ForwardResult>(&r)) {
      f->o = f->o.Clone();
      auto codes = f->o.span<uint16_t>();
      codes[static_cast<size_t>(37 * ++calls_) % codes.size()] ^= 1u;
    }
    return r;
  }

 private:
  int calls_ = 0;
};

// A nondeterministic kernel that also leaks (its backward differentiates a wider mask).
class RovingJitterLeaky : public RovingJitter {
 public:
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return leaky_.Backward(p, q, k, v, o, lse, dout);
  }

 private:
  check_test::BackwardIgnoresDiagonalMask leaky_;
};

TEST(NonInterference, NondeterministicNoiseOfOneUlpAnywhereIsNotALeak) {
  const Problem p = check_test::CausalProblem();
  const CaseInputs in = Inputs(p, 11);
  NonInterferenceOptions options;
  options.seed = 7;
  options.backward = false;
  RovingJitter kernel;
  const auto vs = CheckNonInterference(kernel, p, in, options);
  ASSERT_NE(Find(vs, "o"), nullptr);
  EXPECT_TRUE(Find(vs, "o")->pass) << Find(vs, "o")->message;
  // The ulp allowance does not hide a real leak of a nondeterministic kernel.
  RovingJitterLeaky leaky;
  options.backward = true;
  const auto bad = CheckNonInterference(leaky, p, in, options);
  ASSERT_NE(Find(bad, "dk"), nullptr);
  EXPECT_FALSE(Find(bad, "dk")->pass);
}

}  // namespace
}  // namespace attest

namespace attest {
namespace {

// Both checks are rows of the registry and run from a CheckContext.
TEST(NonInterference, RegisteredAndRunsFromContext) {
  const CheckInfo* ni = FindCheck("non-interference");
  const CheckInfo* cons = FindCheck("consistency");
  ASSERT_NE(ni, nullptr);
  ASSERT_NE(cons, nullptr);
  auto kernel = check_test::MakeFlash2Bf16();
  CheckContext ctx;
  ctx.kernel = kernel.get();
  ctx.kernel_spec = "cpu/flash2-bf16";
  ctx.case_.problem = check_test::CausalProblem();
  ctx.case_.generator = GeneratorSpec{"gaussian", 11, nlohmann::json::object()};
  ctx.inputs = Inputs(ctx.case_.problem, 11);
  ctx.repro = "attest check ...";
  for (const CheckInfo* c : {ni, cons}) {
    const auto vs = c->run(ctx);
    ASSERT_FALSE(vs.empty()) << c->name;
    for (const Verdict& v : vs) EXPECT_TRUE(v.pass) << c->name << ": " << v.message;
  }
  check_test::DeltaFromOtherO bad;
  ctx.kernel = &bad;
  bool failed = false;
  for (const Verdict& v : cons->run(ctx)) failed = failed || !v.pass;
  EXPECT_TRUE(failed);
}

}  // namespace
}  // namespace attest
