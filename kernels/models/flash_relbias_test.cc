// The learnable relative bias in the CPU engine and its models (flash_engine.h
// EngineOptions::rel_bias, Flash2Model::ForwardRelBias / BackwardRelBias) and in the kernel
// contract (kernel.h Capabilities::rel_bias): the bf16 model against the float64 oracle with a
// bias (GQA, causal empty rows, softcap, a packed ALiBi batch, with a sink), drel_bias
// included; a zero bias gives bitwise the model's answer without one; the plain calls refuse a
// bias problem; a kernel that does not claim it is not covered; the capability's JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/builtin.h"
#include "kernels/models/flash_engine.h"
#include "kernels/models/flash_models.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"

namespace attest {
namespace {

using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;

oracle_test::Inputs DtypeInputs(const Problem& p, uint64_t seed) {
  oracle_test::Inputs in = oracle_test::RandomInputs(p, seed);
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

// A float32 bias table of the problem's shape: normal(0, sigma), seeded.
Tensor Bias(const Problem& p, uint64_t seed, double sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(static_cast<size_t>(p.heads_q * p.RelBiasWidth()));
  for (double& e : x) e = static_cast<double>(static_cast<float>(dist(rng)));
  return Tensor::FromF64(p.RelBiasShape(), x);
}

struct BiasProblem {
  std::string name;
  Problem p;
  std::vector<double> sink;  // with p.sink
};

std::vector<BiasProblem> Problems() {
  std::vector<BiasProblem> out;
  {
    Problem p = oracle_test::Base(2, 4, 1, 70, 40, 64, 64);  // Sq > Sk: 30 empty rows per head
    p.causal = true;
    p.softcap = 10.0;
    out.push_back({"gqa4_causal_softcap", p, {}});
  }
  {
    Problem p = oracle_test::Base(3, 2, 2, 50, 60, 64, 64);
    p.cu_seqlens_q = std::vector<int32_t>{0, 50, 50, 90};
    p.cu_seqlens_k = std::vector<int32_t>{0, 60, 90, 90};  // sequence 2: no keys
    p.alibi_slopes = std::vector<double>{0.125, 0.03125};
    p.sink = true;
    out.push_back({"varlen_alibi_sink", p, {0.25, 3.0}});
  }
  for (BiasProblem& c : out) {
    c.p.rel_bias = true;
    c.p.dtype = DType::kBF16;
  }
  return out;
}

TEST(FlashRelBias, Bf16ModelAgreesWithTheOracleIncludingDrelBias) {
  Flash2Model model("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  ASSERT_TRUE(model.capabilities().rel_bias);
  uint64_t seed = 80;
  for (const BiasProblem& c : Problems()) {
    SCOPED_TRACE(c.name);
    const auto in = DtypeInputs(c.p, ++seed);
    const Tensor bias = Bias(c.p, seed, 1.0);
    const Tensor sink = c.p.sink ? Tensor::FromF64({c.p.heads_q}, c.sink) : Tensor();
    auto f = Take(model.ForwardRelBias(c.p, in.q, in.k, in.v, bias, sink), "forward");
    auto b = Take(
        model.BackwardRelBias(c.p, in.q, in.k, in.v, f.o, f.lse, in.dout, bias, sink), "bwd");
    ASSERT_TRUE(b.drel_bias.defined());
    EXPECT_EQ(b.dsink.defined(), c.p.sink);
    OracleOptions opt;
    opt.rel_bias = &bias;
    if (c.p.sink) opt.sink = &sink;
    const BackwardOut ref = Backward<double>(c.p, in.q, in.k, in.v, in.dout, opt);
    // bf16 outputs over fp32 arithmetic: within 2^-7 of each tensor's magnitude (the sink
    // test's bounds, flash_sink_test.cc); lse in fp32.
    EXPECT_LT(MaxAbsDiff(ToF64(f.o), ref.o), 0x1p-7 * MaxAbs(ref.o));
    EXPECT_LT(MaxAbsDiff(ToF64(f.lse), ref.lse), 1e-5 * (1 + MaxAbs(ref.lse)));
    EXPECT_LT(MaxAbsDiff(ToF64(b.dq), ref.dq), 0x1p-6 * MaxAbs(ref.dq));
    EXPECT_LT(MaxAbsDiff(ToF64(b.dk), ref.dk), 0x1p-6 * MaxAbs(ref.dk));
    EXPECT_LT(MaxAbsDiff(ToF64(b.dv), ref.dv), 0x1p-6 * MaxAbs(ref.dv));
    // drel_bias from the bf16 o's delta and fp32 sums: within 2^-7 of its magnitude, like o
    // (the diagonal sums here hold up to 80 terms and do not cancel to ~0).
    const double err = MaxAbsDiff(ToF64(b.drel_bias), ref.drel_bias);
    std::printf("  %-22s drel_bias max|err| %.3e, max|drel_bias| %.3e\n", c.name.c_str(), err,
                MaxAbs(ref.drel_bias));
    EXPECT_LT(err, 0x1p-7 * MaxAbs(ref.drel_bias));
    EXPECT_GT(MaxAbs(ref.drel_bias), 1.0) << "a test whose drel_bias is ~0 cannot fail";
  }
}

TEST(FlashRelBias, ZeroBiasIsBitwiseNoBiasAndPlainCallsRefuseABias) {
  Flash2Model model("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  const BiasProblem c = Problems()[0];
  Problem none = c.p;
  none.rel_bias = false;
  const auto in = DtypeInputs(none, 3);
  const Tensor zero = Tensor::Zeros(DType::kF64, c.p.RelBiasShape());
  auto f0 = Take(model.Forward(none, in.q, in.k, in.v), "plain forward");
  auto f1 = Take(model.ForwardRelBias(c.p, in.q, in.k, in.v, zero, Tensor()), "bias forward");
  EXPECT_TRUE(f0.o.BitwiseEqual(f1.o) && f0.lse.BitwiseEqual(f1.lse));
  auto b0 = Take(model.Backward(none, in.q, in.k, in.v, f0.o, f0.lse, in.dout), "plain bwd");
  auto b1 = Take(model.BackwardRelBias(c.p, in.q, in.k, in.v, f1.o, f1.lse, in.dout, zero,
                                       Tensor()),
                 "bias bwd");
  EXPECT_TRUE(b0.dq.BitwiseEqual(b1.dq) && b0.dk.BitwiseEqual(b1.dk) && b0.dv.BitwiseEqual(b1.dv));
  EXPECT_GT(MaxAbs(ToF64(b1.drel_bias)), 0.0);
  // The plain calls never run a bias problem (its tensor is missing).
  EXPECT_TRUE(std::holds_alternative<Unsupported>(model.Forward(c.p, in.q, in.k, in.v)));
}

TEST(FlashRelBias, KernelsThatDoNotClaimItAreNotCoveredAndRefuseIt) {
  Problem p = oracle_test::Base(1, 1, 1, 64, 64, 64, 64);
  p.rel_bias = true;
  const Tensor bias = Tensor::Zeros(DType::kF64, p.RelBiasShape());
  Tile64Model tile64;  // a one-loop model without a relative bias
  std::string why;
  EXPECT_FALSE(tile64.capabilities().rel_bias);
  EXPECT_FALSE(tile64.capabilities().Covers(p, &why));
  EXPECT_EQ(why, "rel_bias");
  const auto in = DtypeInputs(p, 1);
  EXPECT_TRUE(std::holds_alternative<Unsupported>(
      tile64.ForwardRelBias(p, in.q, in.k, in.v, bias, Tensor())));
  // The capability's JSON: written only when claimed, read back.
  Capabilities caps = tile64.capabilities();
  EXPECT_FALSE(CapabilitiesToJson(caps).contains("rel_bias"));
  caps.rel_bias = true;
  const nlohmann::json j = CapabilitiesToJson(caps);
  EXPECT_EQ(j.at("rel_bias"), true);
  auto back = CapabilitiesFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->rel_bias);
}

}  // namespace
}  // namespace attest
