// Split-KV in the CPU engine (flash_engine.h CombineKvSplits, Problem::num_splits) and its model
// cpu/flash2-splitkv-bf16: every declared count against the float64 oracle and against the
// one-pass forward (count 1 is bitwise the one-pass model; counts above one change the
// arithmetic, and more splits than key tiles leave splits empty); the backward ignores the
// split; the learnable sink enters the combine once (the model against the oracle), while a
// combine that folds it into every split (deviations.h SplitKvSinkPerSplitHooks) is off by the
// extra exp(sink) terms; the split mutants' hooks move the answer beyond rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/models/flash_engine.h"
#include "kernels/models/flash_models.h"
#include "kernels/mutants/deviations.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"

namespace attest {
namespace {

using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;

oracle_test::Inputs DtypeInputs(const Problem& p, uint64_t seed, double q_sigma = 1.0) {
  oracle_test::Inputs in = oracle_test::RandomInputs(p, seed, q_sigma);
  return {RoundTensor(in.q, p.dtype), RoundTensor(in.k, p.dtype), RoundTensor(in.v, p.dtype),
          RoundTensor(in.dout, p.dtype)};
}

template <class T>
T Take(KernelAnswer<T> answer, const std::string& what) {
  if (auto* u = std::get_if<Unsupported>(&answer)) ADD_FAILURE() << what << ": " << u->reason;
  if (auto* e = std::get_if<Error>(&answer)) ADD_FAILURE() << what << ": " << e->message;
  if (!std::holds_alternative<T>(answer)) return T{};
  return std::get<T>(std::move(answer));
}

Problem Decode() {
  Problem p = oracle_test::Base(2, 4, 2, 3, 300, 64, 64);  // GQA, 5 key tiles of 64
  p.causal = true;
  p.dtype = DType::kBF16;
  return p;
}

TEST(FlashSplitKv, EveryDeclaredCountAgreesWithTheOracleAndTheOnePassForward) {
  const auto model = MakeSplitKvModel();
  const Capabilities caps = model->capabilities();
  ASSERT_EQ(caps.num_splits, (std::vector<int64_t>{1, 2, 3, 8}));
  Flash2Model plain("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  Problem p = Decode();
  const auto in = DtypeInputs(p, 21, 2.0);
  const BackwardOut ref = Backward<double>(p, in.q, in.k, in.v, in.dout);
  auto one = Take(plain.Forward(p, in.q, in.k, in.v), "one pass");
  auto choice = Take(model->Forward(p, in.q, in.k, in.v), "kernel's choice");
  EXPECT_TRUE(one.o.BitwiseEqual(choice.o) && one.lse.BitwiseEqual(choice.lse));
  for (int64_t n : caps.num_splits) {
    SCOPED_TRACE("num_splits " + std::to_string(n));
    p.num_splits = n;
    auto f = Take(model->Forward(p, in.q, in.k, in.v), "split forward");
    EXPECT_LT(MaxAbsDiff(ToF64(f.o), ref.o), 0x1p-7 * MaxAbs(ref.o));
    EXPECT_LT(MaxAbsDiff(ToF64(f.lse), ref.lse), 1e-5 * (1 + MaxAbs(ref.lse)));
    if (n == 1) {
      EXPECT_TRUE(f.o.BitwiseEqual(one.o) && f.lse.BitwiseEqual(one.lse));
    } else {
      EXPECT_FALSE(f.o.BitwiseEqual(one.o)) << "the split must change the arithmetic";
    }
    // FlashAttention's backward does not split: the same gradients whatever the count.
    auto b = Take(model->Backward(p, in.q, in.k, in.v, one.o, one.lse, in.dout), "backward");
    Problem p0 = p;
    p0.num_splits = 0;
    auto b0 = Take(model->Backward(p0, in.q, in.k, in.v, one.o, one.lse, in.dout), "backward");
    EXPECT_TRUE(b.dq.BitwiseEqual(b0.dq) && b.dk.BitwiseEqual(b0.dk) && b.dv.BitwiseEqual(b0.dv));
  }
  // An undeclared count is outside the capabilities, and the plain model declares none.
  p.num_splits = 4;
  EXPECT_TRUE(std::holds_alternative<Unsupported>(model->Forward(p, in.q, in.k, in.v)));
  p.num_splits = 2;
  EXPECT_TRUE(std::holds_alternative<Unsupported>(plain.Forward(p, in.q, in.k, in.v)));
}

// The sink joins the combine once: the split model with a sink agrees with the oracle at every
// count; folding it into every split's sum moves lse by about log(1 + (n−1) e^sink / Σ).
TEST(FlashSplitKv, TheSinkEntersTheCombineOnce) {
  const auto model = MakeSplitKvModel();
  Problem p = Decode();
  p.sink = true;
  const auto in = DtypeInputs(p, 22);
  const Tensor sink = Tensor::FromF64({p.heads_q}, {2.0, -1.0, 4.0, 0.5});
  OracleOptions opt;
  opt.sink = &sink;
  const BackwardOut ref = Backward<double>(p, in.q, in.k, in.v, in.dout, opt);
  for (int64_t n : {1, 2, 3, 8}) {
    SCOPED_TRACE("num_splits " + std::to_string(n));
    p.num_splits = n;
    auto f = Take(model->ForwardSink(p, in.q, in.k, in.v, sink), "split forward, sink");
    EXPECT_LT(MaxAbsDiff(ToF64(f.o), ref.o), 0x1p-7 * MaxAbs(ref.o));
    EXPECT_LT(MaxAbsDiff(ToF64(f.lse), ref.lse), 1e-5 * (1 + MaxAbs(ref.lse)));
    EngineOptions bad;
    bad.hooks = &SplitKvSinkPerSplitHooks();
    bad.sink = &sink;
    auto g = Take(FlashForward(p, *FindRecipe("bf16"), in.q, in.k, in.v, bad), "per split");
    const double lse_err = MaxAbsDiff(ToF64(g.lse), ref.lse);
    if (n == 1) {
      EXPECT_TRUE(g.o.BitwiseEqual(f.o) && g.lse.BitwiseEqual(f.lse)) << "one split: one sink";
    } else {
      EXPECT_GT(lse_err, 0.05) << "a sink counted per split must move lse";
      EXPECT_GT(MaxAbsDiff(ToF64(g.o), ref.o), 0x1p-5 * MaxAbs(ref.o));
    }
  }
}

// The catalogue's split hooks move the answer beyond rounding at a count above one and leave
// count 1 (no combine, no boundary) bitwise alone.
TEST(FlashSplitKv, MutantHooksMoveTheAnswerOnlyWhenSplit) {
  Problem p = Decode();
  const auto in = DtypeInputs(p, 23, 2.0);
  const BackwardOut ref = Backward<double>(p, in.q, in.k, in.v, in.dout);
  const Recipe& recipe = *FindRecipe("bf16");
  for (const EngineHooks* hooks :
       {&SplitKvUnnormalisedCombineHooks(), &SplitKvBoundaryOffByOneHooks()}) {
    EngineOptions options;
    options.hooks = hooks;
    p.num_splits = 1;
    auto base = Take(FlashForward(p, recipe, in.q, in.k, in.v), "correct");
    auto same = Take(FlashForward(p, recipe, in.q, in.k, in.v, options), "one split");
    EXPECT_TRUE(base.o.BitwiseEqual(same.o) && base.lse.BitwiseEqual(same.lse));
    p.num_splits = 3;
    auto f = Take(FlashForward(p, recipe, in.q, in.k, in.v, options), "three splits");
    EXPECT_GT(MaxAbsDiff(ToF64(f.o), ref.o), 0x1p-5 * MaxAbs(ref.o));
  }
}

}  // namespace
}  // namespace attest
