// The learnable relative bias in the baselines (verify/tolerance/baseline.h; docs/semantics.md
// "Learnable relative bias"): the fp32 same-precision path (both modes) and the unrounded
// recipe reference agree with the float64 oracle's o, lse, dq, dk, dv and drel_bias on GQA with
// softcap, ALiBi and causal empty rows, and on a packed batch with a sink (drel_bias indexed by
// sequence-local positions); a zero table with ALiBi (scores already fp32) is bitwise the no-bias
// baseline; a missing or misshapen table is an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"
#include "verify/tolerance/baseline.h"

namespace attest {
namespace {

using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;

Tensor Bias(const Problem& p, uint64_t seed, double sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(static_cast<size_t>(p.heads_q * p.RelBiasWidth()));
  for (double& e : x) e = static_cast<double>(static_cast<float>(dist(rng)));
  return Tensor::FromF64(p.RelBiasShape(), x);
}

std::vector<Problem> Problems(DType dtype) {
  Problem a = oracle_test::Base(2, 4, 2, 20, 12, 16, 24);  // Sq > Sk: 8 empty rows
  a.causal = true;
  a.softcap = 5.0;
  a.alibi_slopes = std::vector<double>{0.5, 0.25, 0.125, 0.0625};
  Problem b = oracle_test::Base(3, 2, 1, 30, 24, 16, 16);
  b.cu_seqlens_q = std::vector<int32_t>{0, 30, 40, 70};
  b.cu_seqlens_k = std::vector<int32_t>{0, 24, 44, 60};
  b.causal = true;
  b.sink = true;
  std::vector<Problem> out{a, b};
  for (Problem& p : out) {
    p.rel_bias = true;
    p.dtype = dtype;
  }
  return out;
}

TEST(BaselineRelBias, Fp32AndUnroundedRecipeAgreeWithTheOracle) {
  uint64_t seed = 30;
  for (const Problem& p : Problems(DType::kF32)) {
    const auto in = oracle_test::RandomInputs(p, ++seed);
    const Tensor bias = Bias(p, seed, 2.0);
    const Tensor sink = p.sink ? Tensor::FromF64({p.heads_q}, {0.5, 2.0}) : Tensor();
    OracleOptions o;
    o.rel_bias = &bias;
    if (p.sink) o.sink = &sink;
    const BackwardOut r = Backward<double>(p, in.q, in.k, in.v, in.dout, o);
    ASSERT_GT(MaxAbs(r.drel_bias), 0.5) << "a drel_bias near 0 cannot fail";
    const Tensor* sp = p.sink ? &sink : nullptr;
    auto check = [&](const BaselineOut& b, double rel) {
      EXPECT_LE(MaxAbsDiff(b.o, r.o), rel * MaxAbs(r.o));
      EXPECT_LE(MaxAbsDiff(b.lse, r.lse), rel * MaxAbs(r.lse));
      EXPECT_LE(MaxAbsDiff(b.dq, r.dq), rel * MaxAbs(r.dq));
      EXPECT_LE(MaxAbsDiff(b.dk, r.dk), rel * MaxAbs(r.dk));
      EXPECT_LE(MaxAbsDiff(b.dv, r.dv), rel * MaxAbs(r.dv));
      ASSERT_TRUE(b.drel_bias.defined());
      EXPECT_LE(MaxAbsDiff(b.drel_bias, r.drel_bias), rel * MaxAbs(r.drel_bias));
    };
    for (BaselineMode m : {BaselineMode::kSdpaMath, BaselineMode::kEveryOp}) {
      auto b = BaselineBackward(p, in.q, in.k, in.v, in.dout, m, 2, sp, &bias);
      ASSERT_TRUE(b.ok()) << b.error().message;
      check(*b, 1e-5);
    }
    Recipe exact;
    exact.name = "test-exact";
    exact.output = Format::kF64;
    exact.gradients = Format::kF64;
    exact.lse = Format::kF64;
    exact.input_dtypes = {DType::kF32};
    auto rr = RecipeReferenceBackward(p, exact, in.q, in.k, in.v, in.dout, sp, &bias);
    ASSERT_TRUE(rr.ok()) << rr.error().message;
    check(*rr, 1e-7);  // drel_bias is rounded to fp32: 2^-24 relative
  }
}

TEST(BaselineRelBias, AZeroTableWithAlibiIsBitwiseNoBias) {
  const Problem p = Problems(DType::kBF16)[0];
  const auto in = oracle_test::RandomInputs(p, 5);
  const Tensor zero = Bias(p, 1, 0.0);
  Problem plain = p;
  plain.rel_bias = false;
  for (BaselineMode m : {BaselineMode::kSdpaMath, BaselineMode::kEveryOp}) {
    auto with = BaselineBackward(p, in.q, in.k, in.v, in.dout, m, 2, nullptr, &zero);
    auto without = BaselineBackward(plain, in.q, in.k, in.v, in.dout, m, 1);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_TRUE(with->o.BitwiseEqual(without->o));
    EXPECT_TRUE(with->lse.BitwiseEqual(without->lse));
    EXPECT_TRUE(with->dq.BitwiseEqual(without->dq));
    EXPECT_TRUE(with->dk.BitwiseEqual(without->dk));
    EXPECT_TRUE(with->dv.BitwiseEqual(without->dv));
    EXPECT_GT(MaxAbs(with->drel_bias), 0.0);
    EXPECT_FALSE(without->drel_bias.defined());
  }
}

TEST(BaselineRelBias, AMissingOrMisshapenTableIsAnErrorNamingIt) {
  const Problem p = Problems(DType::kBF16)[0];
  const auto in = oracle_test::RandomInputs(p, 5);
  auto missing = BaselineForward(p, in.q, in.k, in.v);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("problem.rel_bias"), std::string::npos);
  const Tensor narrow = Tensor::FromF64({p.heads_q, 3}, std::vector<double>(12, 0.0));
  auto bad = BaselineForward(p, in.q, in.k, in.v, BaselineMode::kSdpaMath, 1, nullptr, &narrow);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("rel_bias: shape"), std::string::npos);
}

}  // namespace
}  // namespace attest
