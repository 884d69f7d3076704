// Tests of the low-precision CPU models (lowp_models.h, recipes of reference/recipes/recipe.cc)
// against the float64 oracle (reference/oracle/oracle.h): evaluated on the recipe's quantised
// operands (what is left is the model's own P rounding and fp32 arithmetic) and on the plain
// inputs (the intended quantisation error, measured and printed); the causal leak that
// cuDNN's sequence-blocked V scales cause (docs/references.md "Which products can leak": perturb V
// only after position t inside one 32-block and O[:t] changes) and its absence in the
// leak-free variant; bitwise determinism; fp8-e4m3-tensor's honest Unsupported backward.
#include "kernels/models/lowp_models.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"
#include "reference/recipes/recipe_json.h"

namespace attest {
namespace {

template <class T>
T Take(KernelAnswer<T> answer, const std::string& what) {
  if (auto* u = std::get_if<Unsupported>(&answer)) ADD_FAILURE() << what << ": " << u->reason;
  if (auto* e = std::get_if<Error>(&answer)) ADD_FAILURE() << what << ": " << e->message;
  if (!std::holds_alternative<T>(answer)) return T{};
  return std::get<T>(std::move(answer));
}

oracle_test::Inputs Bf16Inputs(const Problem& p, uint64_t seed) {
  oracle_test::Inputs in = oracle_test::RandomInputs(p, seed);
  return {RoundTensor(in.q, DType::kBF16), RoundTensor(in.k, DType::kBF16),
          RoundTensor(in.v, DType::kBF16), RoundTensor(in.dout, DType::kBF16)};
}

// `t` ([B, S, H, W], dense problems only) as the recipe operand `quant` represents it: the
// same QuantizeOperand call, shape and axis as the engine's whole-tensor operand preparation.
Tensor Quantised(const Tensor& t, const OperandQuant& quant) {
  const Tensor wide = ToF64(t);
  std::span<const double> d = wide.span<const double>();
  std::vector<float> values(d.begin(), d.end());
  const int64_t axis = quant.axis == QuantAxis::kSequence ? 1 : 3;
  Expected<std::vector<float>> q = QuantizeOperand(values, t.shape(), axis, quant.scheme);
  EXPECT_TRUE(q.ok()) << (q.ok() ? "" : q.error().message);
  if (!q.ok()) return wide;
  return Tensor::FromF64(t.shape(), std::vector<double>(q->begin(), q->end()));
}

// ||a − b||₂ / ||b||₂ over every element (b the reference).
double RelL2(const Tensor& a, const Tensor& b) {
  const Tensor wa = ToF64(a), wb = ToF64(b);
  std::span<const double> x = wa.span<const double>(), y = wb.span<const double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  return oracle_test::MaxAbsDiff(ToF64(a), ToF64(b));
}

std::unique_ptr<Kernel> Make(const std::string& name) {
  Expected<std::unique_ptr<Kernel>> k = Kernels().Create(name);
  EXPECT_TRUE(k.ok()) << name;
  return k.ok() ? std::move(*k) : nullptr;
}

// Relative-L2 bounds per model, each about twice the largest value measured over the cases
// below (printed by the test; docs/kernels.md records them). `fwd_q`: o against the oracle
// on the recipe's quantised q, k, v (only the model's P rounding and fp32 arithmetic remain);
// `fwd`: o against the plain oracle; `bwd`: dq, dk, dv against the plain oracle's backward;
// `dq_q`, `dk_q`, `dv_q`: each against the oracle's backward at the forward's quantised q, k,
// v (nvfp4-mixed's straight-through backward is tight there; mxfp8-pvbf16's dv is, its dq
// and dk are not because dP = dO·Vᵀ reads MX copies of dO and V that its forward never used).
struct Bounds {
  const char* name;
  double fwd_q, fwd, bwd, dq_q, dk_q, dv_q;
};
constexpr Bounds kBounds[] = {
    {"cpu/mxfp8-cudnn", 0.04, 0.1, 0.14, 0.085, 0.085, 0.075},
    {"cpu/mxfp8-pvbf16", 0.005, 0.08, 0.11, 0.1, 0.1, 0.006},
    {"cpu/nvfp4-mixed", 0.04, 0.27, 0.34, 0.013, 0.012, 0.055},
    {"cpu/fp8-e4m3-tensor", 0.04, 0.1, 0, 0, 0, 0},
};

TEST(LowpModels, AgreeWithTheOracleOnQuantisedOperandsAndExplainTheirError) {
  struct Case {
    const char* name;
    Problem p;
  };
  std::vector<Case> cases;
  {
    Problem p = oracle_test::Base(1, 2, 2, 160, 160, 64, 64);
    p.causal = true;
    cases.push_back({"causal 160x160 D64", p});
    cases.push_back({"non-causal 96x200 D128", oracle_test::Base(2, 2, 2, 96, 200, 128, 128)});
    cases.push_back({"gqa 4/2 130x130 D64", oracle_test::Base(1, 4, 2, 130, 130, 64, 64)});
  }
  for (const Bounds& bound : kBounds) {
    auto kernel = Make(bound.name);
    ASSERT_NE(kernel, nullptr);
    const Recipe& recipe = *FindRecipe(kernel->capabilities().recipe);
    double worst_q = 0, worst = 0, worst_b = 0;
    for (const Case& c : cases) {
      if (!kernel->capabilities().Covers(c.p)) continue;  // fp8-e4m3-tensor: no GQA
      const auto in = Bf16Inputs(c.p, 11);
      auto f = Take(kernel->Forward(c.p, in.q, in.k, in.v), bound.name);
      if (!f.o.defined()) continue;
      const ForwardOut exact = Forward<double>(c.p, in.q, in.k, in.v);
      const ForwardOut quant =
          Forward<double>(c.p, Quantised(in.q, recipe.qk.a), Quantised(in.k, recipe.qk.b),
                          Quantised(in.v, recipe.pv.b));
      const double rq = RelL2(f.o, quant.o), r = RelL2(f.o, exact.o);
      const double rlse = MaxAbsDiff(f.lse, quant.lse);
      std::printf(
          "%-20s %-24s o: relL2 %.3e (quantised oracle) %.3e (plain), max|d| %.3e / "
          "%.3e; lse max|d| vs quantised %.3e\n",
          bound.name, c.name, rq, r, MaxAbsDiff(f.o, quant.o), MaxAbsDiff(f.o, exact.o), rlse);
      worst_q = std::max(worst_q, rq);
      worst = std::max(worst, r);
      // The lse sees the quantised scores only: it must match the quantised oracle to fp32
      // rounding of a D-long dot product and a log (P's rounding does not enter the row sum).
      EXPECT_LT(rlse, 1e-4) << bound.name << " " << c.name;
      if (!kernel->capabilities().backward) continue;
      auto g = Take(kernel->Backward(c.p, in.q, in.k, in.v, f.o, f.lse, in.dout), bound.name);
      if (!g.dq.defined()) continue;
      const BackwardOut gb = Backward<double>(c.p, in.q, in.k, in.v, in.dout);
      const double rdq = RelL2(g.dq, gb.dq), rdk = RelL2(g.dk, gb.dk), rdv = RelL2(g.dv, gb.dv);
      // The exact gradient at the forward's quantised operands (Attn-QAT's reference): what
      // is left is the backward's own roundings (P, dS, dO and the backward operand copies).
      const BackwardOut gq =
          Backward<double>(c.p, Quantised(in.q, recipe.qk.a), Quantised(in.k, recipe.qk.b),
                           Quantised(in.v, recipe.pv.b), in.dout);
      std::printf(
          "%-20s %-24s relL2 vs plain oracle: dq %.3e dk %.3e dv %.3e; vs oracle at "
          "the forward's quantised operands: dq %.3e dk %.3e dv %.3e\n",
          bound.name, c.name, rdq, rdk, rdv, RelL2(g.dq, gq.dq), RelL2(g.dk, gq.dk),
          RelL2(g.dv, gq.dv));
      EXPECT_LT(RelL2(g.dq, gq.dq), bound.dq_q) << bound.name << " " << c.name;
      EXPECT_LT(RelL2(g.dk, gq.dk), bound.dk_q) << bound.name << " " << c.name;
      EXPECT_LT(RelL2(g.dv, gq.dv), bound.dv_q) << bound.name << " " << c.name;
      worst_b = std::max({worst_b, rdq, rdk, rdv});
    }
    std::printf("%-20s worst relL2: o vs quantised %.3e, o vs plain %.3e, grads %.3e\n", bound.name,
                worst_q, worst, worst_b);
    EXPECT_LT(worst_q, bound.fwd_q) << bound.name;
    EXPECT_LT(worst, bound.fwd) << bound.name;
    if (bound.bwd > 0) EXPECT_LT(worst_b, bound.bwd) << bound.name;
  }
}

TEST(LowpModels, WithoutPRoundingTheRecipeIsTheOracleOnItsQuantisedOperands) {
  // The same recipe rows with P left in fp32 and an fp32 output: every remaining difference
  // from the float64 oracle on QuantizeOperand(q, k, v) is fp32 arithmetic, so the operand
  // quantisation the engine applies is exactly the one the test applies (same blocks, axes,
  // scales). Bound: 2^-17 relative L2 (fp32 GEMMs and exp2 over <= 130 keys; measured 2-3e-7).
  Problem p = oracle_test::Base(2, 2, 2, 96, 130, 64, 64);
  p.causal = true;
  const auto in = Bf16Inputs(p, 21);
  for (const LowpModelSpec& spec : LowpModelSpecs()) {
    Recipe r = *FindRecipe(spec.recipe);
    r.pv.a = OperandQuant{};
    r.output = Format::kF32;
    auto f = Take(FlashForward(p, r, in.q, in.k, in.v), std::string(spec.name));
    ASSERT_TRUE(f.o.defined()) << spec.name;
    const ForwardOut quant = Forward<double>(p, Quantised(in.q, r.qk.a), Quantised(in.k, r.qk.b),
                                             Quantised(in.v, r.pv.b));
    const double rel = RelL2(f.o, quant.o);
    std::printf("%-20s fp32-P variant vs quantised oracle: o relL2 %.3e\n",
                std::string(spec.name).c_str(), rel);
    EXPECT_LT(rel, 0x1p-17) << spec.name;
  }
}

// Perturbs V at key `t` (inside the 32-block [32, 64)) and reports whether causal rows [0, t)
// of o (and, with a backward, of dq) stayed bitwise equal.
struct LeakResult {
  bool o_rows_before_block_same = false;  // rows [0, 32): their keys share no V block with t
  bool o_past_rows_same = false;          // rows [0, t)
  bool lse_past_rows_same = false;
  bool dq_past_rows_same = true;
};

LeakResult PerturbFutureV(Kernel& kernel, int64_t t) {
  Problem p = oracle_test::Base(1, 2, 2, 64, 64, 64, 64);
  p.causal = true;
  const auto in = Bf16Inputs(p, 5);
  Tensor v2 = in.v.Clone();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t c = 0; c < 64; ++c) v2.at<double>({0, t, h, c}) = 4096.0;
  }
  auto a = Take(kernel.Forward(p, in.q, in.k, in.v), "a");
  auto b = Take(kernel.Forward(p, in.q, in.k, v2), "b");
  LeakResult r;
  if (!a.o.defined() || !b.o.defined()) return r;
  r.o_rows_before_block_same = a.o.Narrow(1, 0, 32).BitwiseEqual(b.o.Narrow(1, 0, 32));
  r.o_past_rows_same = a.o.Narrow(1, 0, t).BitwiseEqual(b.o.Narrow(1, 0, t));
  r.lse_past_rows_same = a.lse.Narrow(2, 0, t).BitwiseEqual(b.lse.Narrow(2, 0, t));
  if (kernel.capabilities().backward) {
    auto ga = Take(kernel.Backward(p, in.q, in.k, in.v, a.o, a.lse, in.dout), "ga");
    auto gb = Take(kernel.Backward(p, in.q, in.k, v2, b.o, b.lse, in.dout), "gb");
    if (ga.dq.defined() && gb.dq.defined()) {
      r.dq_past_rows_same = ga.dq.Narrow(1, 0, t).BitwiseEqual(gb.dq.Narrow(1, 0, t));
    }
  }
  return r;
}

TEST(LowpModels, CudnnMxfp8LeaksAcrossTheCausalDiagonalThroughSequenceBlockedV) {
  auto kernel = Make("cpu/mxfp8-cudnn");
  ASSERT_NE(kernel, nullptr);
  const LeakResult r = PerturbFutureV(*kernel, 40);
  // Rows 32..39 read keys 32..39, whose MX block along S_kv also holds key 40: its scale moved.
  EXPECT_FALSE(r.o_past_rows_same);
  EXPECT_TRUE(r.o_rows_before_block_same);  // keys 0..31 form their own block
  EXPECT_TRUE(r.lse_past_rows_same);        // scores use Q, K only
  EXPECT_FALSE(r.dq_past_rows_same);        // dO·Vᵀ reads the same sequence-blocked V
}

TEST(LowpModels, Mxfp8PvBf16IsLeakFree) {
  auto kernel = Make("cpu/mxfp8-pvbf16");
  ASSERT_NE(kernel, nullptr);
  const LeakResult r = PerturbFutureV(*kernel, 40);
  EXPECT_TRUE(r.o_past_rows_same);
  EXPECT_TRUE(r.lse_past_rows_same);
  EXPECT_TRUE(r.dq_past_rows_same);
  // Future K too: Q·Kᵀ's blocks run along D, so a huge future key moves no past scale.
  Problem p = oracle_test::Base(1, 2, 2, 64, 64, 64, 64);
  p.causal = true;
  const auto in = Bf16Inputs(p, 6);
  Tensor k2 = in.k.Clone();
  for (int64_t c = 0; c < 64; ++c) k2.at<double>({0, 40, 0, c}) = -3000.0;
  auto a = Take(kernel->Forward(p, in.q, in.k, in.v), "a");
  auto b = Take(kernel->Forward(p, in.q, k2, in.v), "b");
  ASSERT_TRUE(a.o.defined() && b.o.defined());
  EXPECT_TRUE(a.o.Narrow(1, 0, 40).BitwiseEqual(b.o.Narrow(1, 0, 40)));
  EXPECT_TRUE(a.lse.Narrow(2, 0, 40).BitwiseEqual(b.lse.Narrow(2, 0, 40)));
}

TEST(LowpModels, SequenceBlocksOfAPackedBatchSpanTwoDocuments) {
  // Packed varlen, documents of 20 and 44 tokens: packed tokens 0..31 form V's first MX block
  // along the token axis, so document 1's token 25 (packed 25) shares a scale with all of
  // document 0. Making it huge changes document 0's o under mxfp8-cudnn (no mask at all
  // between them: the packing alone leaks), and nothing under mxfp8-pvbf16.
  Problem p = oracle_test::Base(2, 2, 2, 44, 44, 64, 64);
  p.cu_seqlens_q = std::vector<int32_t>{0, 20, 64};
  p.cu_seqlens_k = std::vector<int32_t>{0, 20, 64};
  const auto in = Bf16Inputs(p, 9);
  Tensor v2 = in.v.Clone();
  for (int64_t c = 0; c < 64; ++c) v2.at<double>({25, 1, c}) = 4096.0;
  for (const char* name : {"cpu/mxfp8-cudnn", "cpu/mxfp8-pvbf16"}) {
    auto kernel = Make(name);
    ASSERT_NE(kernel, nullptr);
    auto a = Take(kernel->Forward(p, in.q, in.k, in.v), name);
    auto b = Take(kernel->Forward(p, in.q, in.k, v2), name);
    ASSERT_TRUE(a.o.defined() && b.o.defined()) << name;
    const bool doc0_same = a.o.Narrow(0, 0, 20).BitwiseEqual(b.o.Narrow(0, 0, 20));
    EXPECT_EQ(doc0_same, std::string(name) == "cpu/mxfp8-pvbf16") << name;
  }
}

TEST(LowpModels, PerTokenAndStaticScalesAreLeakFree) {
  // nvfp4-mixed scales Q, K per token (NVFP4's fp32 second level) and V per token and head;
  // fp8-e4m3-tensor uses static descales. No scale spans two positions, so a huge future V
  // or K moves nothing before it: o, lse and dq of the past rows stay bitwise equal.
  // (mutant/v-tensor-current-scale and mutant/fp8-current-descale are the leaking forms.)
  for (const char* name : {"cpu/nvfp4-mixed", "cpu/fp8-e4m3-tensor"}) {
    auto kernel = Make(name);
    ASSERT_NE(kernel, nullptr);
    const LeakResult r = PerturbFutureV(*kernel, 40);
    EXPECT_TRUE(r.o_past_rows_same) << name;
    EXPECT_TRUE(r.lse_past_rows_same) << name;
    EXPECT_TRUE(r.dq_past_rows_same) << name;
    Problem p = oracle_test::Base(1, 2, 2, 64, 64, 64, 64);
    p.causal = true;
    const auto in = Bf16Inputs(p, 6);
    Tensor k2 = in.k.Clone();
    for (int64_t c = 0; c < 64; ++c) k2.at<double>({0, 40, 0, c}) = -3000.0;
    auto a = Take(kernel->Forward(p, in.q, in.k, in.v), name);
    auto b = Take(kernel->Forward(p, in.q, k2, in.v), name);
    ASSERT_TRUE(a.o.defined() && b.o.defined()) << name;
    EXPECT_TRUE(a.o.Narrow(1, 0, 40).BitwiseEqual(b.o.Narrow(1, 0, 40))) << name;
    EXPECT_TRUE(a.lse.Narrow(2, 0, 40).BitwiseEqual(b.lse.Narrow(2, 0, 40))) << name;
    // ...while the perturbed key itself is seen by the rows after it (the test can fail).
    EXPECT_FALSE(a.o.Narrow(1, 40, 24).BitwiseEqual(b.o.Narrow(1, 40, 24))) << name;
  }
}

TEST(LowpModels, PerTokenScalesFollowTheirOwnToken) {
  // nvfp4-mixed's V scale is per (token, head): a huge V at (batch 1, token 7, head 1) moves
  // only o rows that read that key (batch 1, head 1 here: non-causal, every row); batch 0 and
  // head 0 of batch 1 are bitwise unchanged, as they are for fp8-e4m3-tensor's static scale.
  const Problem p = oracle_test::Base(2, 2, 2, 48, 48, 64, 64);
  const auto in = Bf16Inputs(p, 12);
  Tensor v2 = in.v.Clone();
  for (int64_t c = 0; c < 64; ++c) v2.at<double>({1, 7, 1, c}) = 4096.0;
  for (const char* name : {"cpu/fp8-e4m3-tensor", "cpu/nvfp4-mixed"}) {
    auto kernel = Make(name);
    ASSERT_NE(kernel, nullptr);
    auto a = Take(kernel->Forward(p, in.q, in.k, in.v), name);
    auto b = Take(kernel->Forward(p, in.q, in.k, v2), name);
    ASSERT_TRUE(a.o.defined() && b.o.defined()) << name;
    EXPECT_TRUE(a.o.Narrow(0, 0, 1).BitwiseEqual(b.o.Narrow(0, 0, 1))) << name;
    EXPECT_TRUE(
        a.o.Narrow(0, 1, 1).Narrow(2, 0, 1).BitwiseEqual(b.o.Narrow(0, 1, 1).Narrow(2, 0, 1)))
        << name;
    EXPECT_FALSE(
        a.o.Narrow(0, 1, 1).Narrow(2, 1, 1).BitwiseEqual(b.o.Narrow(0, 1, 1).Narrow(2, 1, 1)))
        << name;
  }
}

TEST(LowpModels, ForwardAndBackwardAreBitwiseDeterministicAcrossThreadCounts) {
  Problem p = oracle_test::Base(1, 2, 2, 100, 150, 64, 64);
  p.causal = true;
  const auto in = Bf16Inputs(p, 8);
  for (const LowpModelSpec& spec : LowpModelSpecs()) {
    EngineOptions one;
    one.threads = 1;
    EngineOptions three;
    three.threads = 3;
    LowpModel a(spec, one), b(spec, three);
    auto fa = Take(a.Forward(p, in.q, in.k, in.v), "fa");
    auto fb = Take(b.Forward(p, in.q, in.k, in.v), "fb");
    auto fc = Take(b.Forward(p, in.q, in.k, in.v), "fc");
    ASSERT_TRUE(fa.o.defined() && fb.o.defined() && fc.o.defined()) << spec.name;
    EXPECT_TRUE(fa.o.BitwiseEqual(fb.o) && fa.lse.BitwiseEqual(fb.lse)) << spec.name;
    EXPECT_TRUE(fb.o.BitwiseEqual(fc.o) && fb.lse.BitwiseEqual(fc.lse)) << spec.name;
    if (!a.capabilities().backward) continue;
    auto ga = Take(a.Backward(p, in.q, in.k, in.v, fa.o, fa.lse, in.dout), "ga");
    auto gb = Take(b.Backward(p, in.q, in.k, in.v, fa.o, fa.lse, in.dout), "gb");
    ASSERT_TRUE(ga.dq.defined() && gb.dq.defined()) << spec.name;
    EXPECT_TRUE(ga.dq.BitwiseEqual(gb.dq) && ga.dk.BitwiseEqual(gb.dk) && ga.dv.BitwiseEqual(gb.dv))
        << spec.name;
  }
}

TEST(LowpModels, Fp8TensorBackwardAnswersUnsupported) {
  auto kernel = Make("cpu/fp8-e4m3-tensor");
  ASSERT_NE(kernel, nullptr);
  EXPECT_FALSE(kernel->capabilities().backward);
  const Problem p = oracle_test::Base(1, 1, 1, 32, 32, 64, 64);
  const auto in = Bf16Inputs(p, 3);
  auto f = Take(kernel->Forward(p, in.q, in.k, in.v), "fwd");
  ASSERT_TRUE(f.o.defined());
  auto g = kernel->Backward(p, in.q, in.k, in.v, f.o, f.lse, in.dout);
  ASSERT_TRUE(std::holds_alternative<Unsupported>(g));
  EXPECT_NE(std::get<Unsupported>(g).reason.find("no FP8 backward"), std::string::npos);
}

TEST(LowpModels, RegisteredWithTruthfulCapabilities) {
  for (const LowpModelSpec& spec : LowpModelSpecs()) {
    auto kernel = Make(std::string(spec.name));
    ASSERT_NE(kernel, nullptr);
    const Capabilities caps = kernel->capabilities();
    const Recipe* recipe = FindRecipe(caps.recipe);
    ASSERT_NE(recipe, nullptr) << spec.name;
    EXPECT_TRUE(ValidateRecipe(*recipe).ok()) << spec.name;
    EXPECT_EQ(caps.profile, caps.recipe);
    EXPECT_TRUE(caps.deterministic);
    EXPECT_EQ(caps.dtypes, std::vector<DType>{DType::kBF16});
    // A head dim outside the list is refused, not run with a partial block.
    Problem p = oracle_test::Base(1, 1, 1, 32, 32, 36, 36);
    const auto in = Bf16Inputs(p, 2);
    EXPECT_TRUE(std::holds_alternative<Unsupported>(kernel->Forward(p, in.q, in.k, in.v)))
        << spec.name;
    // f16 inputs are outside every recipe.
    p = oracle_test::Base(1, 1, 1, 32, 32, 64, 64);
    p.dtype = DType::kF16;
    EXPECT_FALSE(caps.Covers(p)) << spec.name;
  }
  // MX along D needs D % 32 == 0; NVFP4 D % 16 == 0.
  Problem p48 = oracle_test::Base(1, 1, 1, 32, 32, 48, 48);
  EXPECT_FALSE(Make("cpu/mxfp8-cudnn")->capabilities().Covers(p48));
  EXPECT_TRUE(Make("cpu/nvfp4-mixed")->capabilities().Covers(p48));
  Problem gqa = oracle_test::Base(1, 4, 2, 32, 32, 64, 64);
  EXPECT_FALSE(Make("cpu/fp8-e4m3-tensor")->capabilities().Covers(gqa));
  {
    const auto in = Bf16Inputs(gqa, 4);
    auto answer = Make("cpu/fp8-e4m3-tensor")->Forward(gqa, in.q, in.k, in.v);
    ASSERT_TRUE(std::holds_alternative<Unsupported>(answer));
    EXPECT_NE(std::get<Unsupported>(answer).reason.find("q_descale"), std::string::npos);
  }
  EXPECT_TRUE(Make("cpu/mxfp8-cudnn")->capabilities().Covers(gqa));
}

// recipe:FILE builds the engine on a recipe declared as data: from the recipe object or from
// a describe reply holding it, bit for bit the built-in model when the recipe is a built-in
// row's; errors name the file and the field.
TEST(LowpModels, RecipeFileIsTheEngineOnTheDeclaredRecipe) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("attest-recipe-file-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const nlohmann::json& j) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << j.dump();
    return path;
  };
  nlohmann::json recipe = RecipeToJson(*FindRecipe("mxfp8-cudnn"));
  const std::string plain = write("plain.json", recipe);
  const std::string reply = write(
      "reply.json", {{"name", "w"}, {"capabilities", {{"recipe", recipe}, {"gqa", true}}}});
  const Problem p = oracle_test::Base(1, 2, 2, 40, 40, 64, 64);
  const auto in = Bf16Inputs(p, 5);
  auto builtin = Make("cpu/mxfp8-cudnn");
  const ForwardResult want = Take(builtin->Forward(p, in.q, in.k, in.v), "built-in");
  for (const std::string& path : {plain, reply}) {
    auto k = Kernels().Create("recipe:" + path);
    ASSERT_TRUE(k.ok()) << k.error().message;
    EXPECT_EQ((*k)->capabilities().recipe, "mxfp8-cudnn");
    const ForwardResult got = Take((*k)->Forward(p, in.q, in.k, in.v), path);
    EXPECT_TRUE(got.o.BitwiseEqual(want.o)) << path;
    EXPECT_TRUE(got.lse.BitwiseEqual(want.lse)) << path;
  }
  recipe["name"] = "test-recipe-file-bad";
  recipe["gemms"]["pv"]["b"]["scale_mode"] = "nearest";
  const std::string bad = write("bad.json", recipe);
  auto k = Kernels().Create("recipe:" + bad);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().message.find(bad + ".gemms.pv.b.scale_mode"), std::string::npos)
      << k.error().message;
  auto missing = Kernels().Create("recipe:" + (dir / "none.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("none.json: cannot open"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attest
