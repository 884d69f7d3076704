// Tests of run/compare.h (`attest compare` as a library): outputs equal to the oracle's
// rounded to bf16 pass the bf16 profile; one perturbed element fails naming its (b, h, i, d);
// NaN fails; missing or misshapen outputs are errors naming the tensor.
#include "run/compare.h"

#include <gtest/gtest.h>

#include <cmath>

#include "reference/case/inputs.h"

namespace attest {
namespace {

Case MakeCase(DType dtype = DType::kBF16) {
  Case c;
  Problem& p = c.problem;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 40;
  p.seqlen_k = 56;
  p.head_dim = 32;
  p.head_dim_v = 32;
  p.dtype = dtype;
  p.causal = true;
  c.generator = GeneratorSpec{"gaussian", 2026, nlohmann::json::object()};
  return c;
}

// The oracle's outputs rounded as a correct kernel would deliver them: o and gradients in
// bf16 codes, lse in f32 codes.
NamedTensors RoundedOracle(const Case& c, bool grads) {
  auto in = MakeCaseInputs(c);
  EXPECT_TRUE(in.ok());
  const BackwardOut r = Backward<double>(c.problem, in->q, in->k, in->v, in->dout);
  NamedTensors out;
  out.Add("o", *FromF64(r.o, c.problem.dtype));
  out.Add("lse", *FromF64(r.lse, DType::kF32));
  if (grads) {
    out.Add("dq", *FromF64(r.dq, c.problem.dtype));
    out.Add("dk", *FromF64(r.dk, c.problem.dtype));
    out.Add("dv", *FromF64(r.dv, c.problem.dtype));
  }
  return out;
}

Tensor* Mutable(NamedTensors& nt, std::string_view name) {
  for (auto& [n, t] : nt.tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

TEST(CompareOutputs, RoundedOracleOutputsPass) {
  const Case c = MakeCase();
  CompareOutputsOptions opt;
  opt.repro = "attest compare --case x --outputs y";
  auto r = CompareOutputs(c, RoundedOracle(c, true), opt);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->report.verdicts.size(), 5u);  // one baseline-ratio policy per tensor
  for (const Verdict& v : r->report.verdicts) {
    EXPECT_TRUE(v.pass) << v.message;
    EXPECT_LT(v.margin, 1.0);
    EXPECT_TRUE(v.repro.empty());
    std::printf("%-4s margin %.3f  %s\n", v.tensor.c_str(), v.margin, v.policy.c_str());
  }
  EXPECT_TRUE(r->report.passed());
  // Forward only: o and lse.
  auto f = CompareOutputs(c, RoundedOracle(c, false), opt);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->report.verdicts.size(), 2u);
  EXPECT_TRUE(f->report.passed());
}

TEST(CompareOutputs, PerturbedElementFailsNamingIt) {
  const Case c = MakeCase();
  NamedTensors out = RoundedOracle(c, true);
  // dq[b=1, i=33, h=3, d=5] moved by 5% of max|dq|: a wrong element that keeps every other
  // element correctly rounded. (The baseline-ratio bound is absolute, k x the baseline's
  // largest error plus the row floor, about 2% of max|dq| here, as in FlashAttention's
  // tests; a few ULPs of a small element are within it.)
  Tensor* dq = Mutable(out, "dq");
  const Tensor wide = ToF64(*dq);
  double max_abs = 0;
  for (double x : wide.span<const double>()) max_abs = std::max(max_abs, std::fabs(x));
  const double moved = wide.at<double>({1, 33, 3, 5}) + 0.05 * max_abs;
  dq->at<uint16_t>({1, 33, 3, 5}) = static_cast<uint16_t>(Encode(moved, Format::kBF16).code);
  CompareOutputsOptions opt;
  opt.repro = "attest compare --case x --outputs y";
  auto r = CompareOutputs(c, out, opt);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->report.passed());
  int failures = 0;
  for (const Verdict& v : r->report.verdicts) {
    if (v.pass) continue;
    ++failures;
    EXPECT_EQ(v.tensor, "dq");
    EXPECT_EQ(v.worst.Coordinates(), "(b=1, h=3, i=33, d=5)") << v.message;
    EXPECT_GT(v.margin, 1.0);
    EXPECT_EQ(v.repro, opt.repro);
    EXPECT_NE(v.message.find("(b=1, h=3, i=33, d=5)"), std::string::npos) << v.message;
  }
  EXPECT_EQ(failures, 1);
}

TEST(CompareOutputs, NanFailsAndOutputsAreValidated) {
  const Case c = MakeCase();
  NamedTensors out = RoundedOracle(c, false);
  Tensor* o = Mutable(out, "o");
  o->at<uint16_t>({0, 20, 1, 7}) = 0x7FC0;  // bf16 NaN
  auto r = CompareOutputs(c, out);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->report.passed());
  EXPECT_EQ(r->report.verdicts[0].tensor, "o");
  EXPECT_EQ(r->report.verdicts[0].worst.Coordinates(), "(b=0, h=1, i=20, d=7)");
  EXPECT_TRUE(std::isinf(r->report.verdicts[0].margin));

  NamedTensors no_lse;
  no_lse.Add("o", out.Find("o")->Clone());
  auto missing = CompareOutputs(c, no_lse);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("'lse'"), std::string::npos);

  NamedTensors wrong;
  wrong.Add("o", Tensor::Zeros(DType::kBF16, {2, 40, 4, 16}));
  wrong.Add("lse", out.Find("lse")->Clone());
  auto shape = CompareOutputs(c, wrong);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.error().message.find("'o' has shape [2, 40, 4, 16]"), std::string::npos)
      << shape.error().message;
}

TEST(CompareOutputs, AProducerWithoutLseIsJudgedOnTheRest) {
  // options.lse = false (`attest compare --no-lse`): lse is neither required nor judged,
  // even a wrong one; o and the gradients still are.
  const Case c = MakeCase();
  NamedTensors out = RoundedOracle(c, true);
  NamedTensors without;
  for (const char* n : {"o", "dq", "dk", "dv"}) without.Add(n, out.Find(n)->Clone());
  CompareOutputsOptions opt;
  opt.lse = false;
  auto r = CompareOutputs(c, without, opt);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->report.passed());
  for (const Verdict& v : r->report.verdicts) EXPECT_NE(v.tensor, "lse");
  EXPECT_EQ(r->metrics.size(), 4u);
  Mutable(out, "lse")->at<float>({0, 1, 3}) = 1e9f;  // ignored
  Mutable(out, "dq")->at<uint16_t>({1, 5, 2, 3}) ^= 0x4000;  // not ignored
  auto bad = CompareOutputs(c, out, opt);
  ASSERT_TRUE(bad.ok()) << bad.error().message;
  EXPECT_FALSE(bad->report.passed());
  for (const Verdict& v : bad->report.verdicts) {
    EXPECT_NE(v.tensor, "lse");
    if (!v.pass) EXPECT_EQ(v.tensor, "dq");
  }
}

TEST(CompareOutputs, PermutedHeadsFail) {
  // A layout bug: o written as [B, H, S, D] but labelled [B, S, H, D] (same values, same
  // norm). Here: two query heads swapped.
  const Case c = MakeCase();
  NamedTensors out = RoundedOracle(c, false);
  Tensor* o = Mutable(out, "o");
  const Tensor copy = o->Clone();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 40; ++i)
      for (int64_t d = 0; d < 32; ++d) {
        o->at<uint16_t>({b, i, 0, d}) = copy.at<uint16_t>({b, i, 1, d});
        o->at<uint16_t>({b, i, 1, d}) = copy.at<uint16_t>({b, i, 0, d});
      }
  auto r = CompareOutputs(c, out);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->report.verdicts[0].pass);
  EXPECT_GT(r->report.verdicts[0].margin, 10.0);
}

TEST(CompareOutputs, LowPrecisionProfileWithoutBaseline) {
  // The fp8 profile needs no baseline, so an e4m3fn problem compares (bf16 outputs).
  Case c = MakeCase(DType::kE4M3FN);
  auto in = MakeCaseInputs(c);
  ASSERT_TRUE(in.ok()) << in.error().message;
  const ForwardOut f = Forward<double>(c.problem, in->q, in->k, in->v);
  NamedTensors out;
  out.Add("o", *FromF64(f.o, DType::kBF16));
  out.Add("lse", *FromF64(f.lse, DType::kF32));
  auto r = CompareOutputs(c, out);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->report.passed());
  EXPECT_TRUE(r->baseline_metrics.empty());
  // Asking for a baseline-ratio profile on e4m3fn inputs is an error naming the dtype.
  CompareOutputsOptions opt;
  opt.profile = FindProfile("bf16");
  auto bad = CompareOutputs(c, out, opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("e4m3fn"), std::string::npos);
}

}  // namespace
}  // namespace attest
