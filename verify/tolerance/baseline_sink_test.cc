// The learnable sink in the baselines (verify/tolerance/baseline.h; docs/semantics.md "Learnable
// sink"): the fp32 same-precision path and the unrounded recipe reference agree with the float64
// oracle's o, lse, dq, dk, dv and dsink on GQA with softcap, ALiBi and causal empty rows (sinks
// ordinary, 1e30 and -inf); a sink of -inf in every head is bitwise the no-sink baseline with
// dsink 0; an empty row has o = 0 and lse = sink; a missing sink is an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "reference/case/inputs.h"
#include "reference/oracle/oracle.h"
#include "verify/tolerance/baseline.h"

namespace attest {
namespace {

double MaxAbs(const Tensor& t) {
  double m = 0;
  const Tensor w = ToF64(t);  // alive while its span is read
  for (double x : w.span<const double>()) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

double MaxDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  const Tensor wa = ToF64(a), wb = ToF64(b);
  const auto x = wa.span<const double>(), y = wb.span<const double>();
  for (size_t k = 0; k < x.size(); ++k) {
    if (!std::isfinite(x[k]) || !std::isfinite(y[k])) {
      EXPECT_EQ(x[k], y[k]) << "element " << k;
      continue;
    }
    m = std::max(m, std::fabs(x[k] - y[k]));
  }
  return m;
}

// GQA 4:2, bottom-right causal with Sq > Sk (rows 0..7 see no key), softcap and ALiBi.
Problem SinkProblem(DType dtype) {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 20;
  p.seqlen_k = 12;
  p.head_dim = 16;
  p.head_dim_v = 24;
  p.dtype = dtype;
  p.causal = true;
  p.softcap = 5.0;
  p.alibi_slopes = std::vector<double>{0.5, 0.25, 0.125, 0.0625};
  p.sink = true;
  return p;
}

CaseInputs Inputs(const Problem& p, nlohmann::json sink_values) {
  Case c;
  c.problem = p;
  c.generator = GeneratorSpec{"gaussian", 7, {{"sink", {{"values", std::move(sink_values)}}}}};
  auto in = MakeCaseInputs(c);
  EXPECT_TRUE(in.ok()) << (in.ok() ? "" : in.error().message);
  return std::move(in).value();
}

BackwardOut Oracle(const Problem& p, const CaseInputs& in) {
  OracleOptions o;
  o.sink = &in.sink;
  return Backward<double>(p, in.q, in.k, in.v, in.dout, o);
}

void ExpectClose(const BaselineOut& b, const BackwardOut& r, double rel) {
  EXPECT_LE(MaxDiff(b.o, r.o), rel * MaxAbs(r.o));
  EXPECT_LE(MaxDiff(b.lse, r.lse), rel * MaxAbs(r.lse));
  EXPECT_LE(MaxDiff(b.dq, r.dq), rel * MaxAbs(r.dq));
  EXPECT_LE(MaxDiff(b.dk, r.dk), rel * MaxAbs(r.dk));
  EXPECT_LE(MaxDiff(b.dv, r.dv), rel * MaxAbs(r.dv));
  ASSERT_TRUE(b.dsink.defined());
  EXPECT_LE(MaxDiff(b.dsink, r.dsink), rel * MaxAbs(r.dsink));
}

TEST(BaselineSink, Fp32AndUnroundedRecipeAgreeWithTheOracle) {
  const Problem p = SinkProblem(DType::kF32);
  // Ordinary, large, huge and no sink among the heads; the lse of huge-sink rows is 1e30.
  const CaseInputs in = Inputs(p, {1.5, 6.0, 1e30, "-inf"});
  const BackwardOut r = Oracle(p, in);
  for (BaselineMode m : {BaselineMode::kSdpaMath, BaselineMode::kEveryOp}) {
    auto b = BaselineBackward(p, in.q, in.k, in.v, in.dout, m, 1, &in.sink);
    ASSERT_TRUE(b.ok()) << b.error().message;
    ExpectClose(*b, r, 1e-5);
    EXPECT_EQ(b->dsink.at<double>({3}), 0.0);  // the -inf head
  }
  Recipe exact;
  exact.name = "test-exact";
  exact.output = Format::kF64;
  exact.gradients = Format::kF64;
  exact.lse = Format::kF64;
  exact.input_dtypes = {DType::kF32};
  auto rr = RecipeReferenceBackward(p, exact, in.q, in.k, in.v, in.dout, &in.sink);
  ASSERT_TRUE(rr.ok()) << rr.error().message;
  // dsink is rounded to fp32 (its output format): 2^-24 relative.
  ExpectClose(*rr, r, 1e-7);
}

TEST(BaselineSink, EmptyRowsHaveLseSinkAndNoOutput) {
  const Problem p = SinkProblem(DType::kBF16);
  const CaseInputs in = Inputs(p, {1.5, -2.0, 1e30, "-inf"});
  auto b = BaselineForward(p, in.q, in.k, in.v, BaselineMode::kSdpaMath, 1, &in.sink);
  ASSERT_TRUE(b.ok()) << b.error().message;
  for (int64_t h = 0; h < 4; ++h) {
    const double sink = in.sink.at<double>({h});
    for (int64_t i = 0; i < 8; ++i) {  // empty rows
      EXPECT_EQ(b->lse.at<double>({0, h, i}), static_cast<double>(static_cast<float>(sink)));
      for (int64_t e = 0; e < 24; ++e) EXPECT_EQ(b->o.at<double>({1, i, h, e}), 0.0);
    }
    if (h == 2) {  // a huge sink takes every row: o = 0, lse = sink
      for (int64_t i = 8; i < 20; ++i) {
        EXPECT_EQ(b->lse.at<double>({1, h, i}), static_cast<double>(static_cast<float>(sink)));
        EXPECT_EQ(b->o.at<double>({0, i, h, 5}), 0.0);
      }
    }
  }
}

TEST(BaselineSink, MinusInfinityInEveryHeadIsBitwiseNoSink) {
  const Problem p = SinkProblem(DType::kBF16);
  const CaseInputs in = Inputs(p, {"-inf", "-inf", "-inf", "-inf"});
  Problem plain = p;
  plain.sink = false;
  for (BaselineMode m : {BaselineMode::kSdpaMath, BaselineMode::kEveryOp}) {
    auto with = BaselineBackward(p, in.q, in.k, in.v, in.dout, m, 2, &in.sink);
    auto without = BaselineBackward(plain, in.q, in.k, in.v, in.dout, m, 2);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_TRUE(with->o.BitwiseEqual(without->o));
    EXPECT_TRUE(with->lse.BitwiseEqual(without->lse));
    EXPECT_TRUE(with->dq.BitwiseEqual(without->dq));
    EXPECT_TRUE(with->dk.BitwiseEqual(without->dk));
    EXPECT_TRUE(with->dv.BitwiseEqual(without->dv));
    EXPECT_EQ(MaxAbs(with->dsink), 0.0);
    EXPECT_FALSE(without->dsink.defined());
  }
}

TEST(BaselineSink, AMissingOrUnwantedSinkIsAnErrorNamingIt) {
  const Problem p = SinkProblem(DType::kBF16);
  const CaseInputs in = Inputs(p, {1.0, 1.0, 1.0, 1.0});
  auto missing = BaselineForward(p, in.q, in.k, in.v);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("problem.sink"), std::string::npos);
  Problem plain = p;
  plain.sink = false;
  auto unwanted = BaselineForward(plain, in.q, in.k, in.v, BaselineMode::kSdpaMath, 1, &in.sink);
  ASSERT_FALSE(unwanted.ok());
  EXPECT_NE(unwanted.error().message.find("sink"), std::string::npos);
}

}  // namespace
}  // namespace attest
