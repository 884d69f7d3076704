// The learnable sink in the CPU engine and its models (flash_engine.h EngineOptions::sink,
// Flash2Model::ForwardSink / BackwardSink) and in the kernel contract (kernel.h
// Capabilities::sink): the bf16 model against the float64 oracle with sinks (GQA, causal empty
// rows, softcap, packed batches; ordinary, huge and -inf sinks), dsink included; a sink of -inf
// gives bitwise the model's answer without a sink; empty rows give lse = sink; a huge sink
// gives o = 0 and lse = sink; the plain calls refuse a sink problem; a kernel that does not
// claim sinks is not covered for them; the capability's JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
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

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

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

struct SinkProblem {
  std::string name;
  Problem p;
  std::vector<double> sink;
};

std::vector<SinkProblem> Problems() {
  std::vector<SinkProblem> out;
  {
    Problem p = oracle_test::Base(2, 4, 1, 70, 40, 64, 64);  // Sq > Sk: 30 empty rows per head
    p.causal = true;
    p.softcap = 10.0;
    out.push_back({"gqa4_causal_softcap", p, {1.5, kNegInf, -2.0, 6.0}});
  }
  {
    Problem p = oracle_test::Base(3, 2, 2, 50, 60, 64, 64);
    p.cu_seqlens_q = std::vector<int32_t>{0, 50, 50, 90};
    p.cu_seqlens_k = std::vector<int32_t>{0, 60, 90, 90};  // sequence 2: no keys
    p.alibi_slopes = std::vector<double>{0.125, 0.03125};
    out.push_back({"varlen_alibi", p, {0.25, 3.0}});
  }
  for (SinkProblem& c : out) {
    c.p.sink = true;
    c.p.dtype = DType::kBF16;
  }
  return out;
}

// max_h sum over rows of exp(sink_h - lse_i) |delta_i| (the oracle's lse and delta).
double SinkTerms(const Problem& p, const BackwardOut& ref, const std::vector<double>& sink) {
  std::vector<double> per_head(static_cast<size_t>(p.heads_q), 0.0);
  const auto lse = ref.lse.span<const double>();
  const auto delta = ref.delta.span<const double>();
  const int64_t inner = p.varlen() ? p.TotalQ() : p.seqlen_q;  // [Hq, T] or [B, Hq, Sq]
  for (size_t e = 0; e < lse.size(); ++e) {
    const auto h = static_cast<size_t>((static_cast<int64_t>(e) / inner) % p.heads_q);
    if (sink[h] == kNegInf) continue;
    per_head[h] += std::exp(sink[h] - lse[e]) * std::abs(delta[e]);
  }
  double m = 0;
  for (double x : per_head) m = std::max(m, x);
  return m;
}

TEST(FlashSink, Bf16ModelAgreesWithTheOracleIncludingDsink) {
  Flash2Model model("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  ASSERT_TRUE(model.capabilities().sink);
  uint64_t seed = 60;
  for (const SinkProblem& c : Problems()) {
    SCOPED_TRACE(c.name);
    const auto in = DtypeInputs(c.p, ++seed);
    const Tensor sink = Tensor::FromF64({c.p.heads_q}, c.sink);
    auto f = Take(model.ForwardSink(c.p, in.q, in.k, in.v, sink), "forward");
    auto b = Take(model.BackwardSink(c.p, in.q, in.k, in.v, f.o, f.lse, in.dout, sink), "bwd");
    ASSERT_TRUE(b.dsink.defined());
    OracleOptions opt;
    opt.sink = &sink;
    const BackwardOut ref = Backward<double>(c.p, in.q, in.k, in.v, in.dout, opt);
    // bf16 outputs (8 significant bits) over fp32 arithmetic: within 2^-7 of each tensor's
    // magnitude; lse in fp32.
    EXPECT_LT(MaxAbsDiff(ToF64(f.o), ref.o), 0x1p-7 * MaxAbs(ref.o));
    EXPECT_LT(MaxAbsDiff(ToF64(f.lse), ref.lse), 1e-5 * (1 + MaxAbs(ref.lse)));
    EXPECT_LT(MaxAbsDiff(ToF64(b.dq), ref.dq), 0x1p-6 * MaxAbs(ref.dq));
    EXPECT_LT(MaxAbsDiff(ToF64(b.dk), ref.dk), 0x1p-6 * MaxAbs(ref.dk));
    EXPECT_LT(MaxAbsDiff(ToF64(b.dv), ref.dv), 0x1p-6 * MaxAbs(ref.dv));
    // dsink from the bf16 o's delta: within 2^-7 of the sum of its terms' magnitudes,
    // max_h sum_i exp(sink_h - lse_i) |delta_i|.
    const double terms = SinkTerms(c.p, ref, c.sink);
    const double err = MaxAbsDiff(ToF64(b.dsink), ref.dsink);
    std::printf("  %-22s dsink max|err| %.3e, terms %.3e, max|dsink| %.3e\n", c.name.c_str(), err,
                terms, MaxAbs(ref.dsink));
    EXPECT_LT(err, 0x1p-7 * terms);
    EXPECT_GT(MaxAbs(ref.dsink), 0x1p-4 * terms) << "a test whose dsink is ~0 cannot fail";
    if (c.sink[1] == kNegInf) EXPECT_EQ(ToF64(b.dsink).at<double>({1}), 0.0);
  }
}

TEST(FlashSink, SinkOfMinusInfinityIsBitwiseNoSinkAndPlainCallsRefuseASink) {
  Flash2Model model("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  const SinkProblem c = Problems()[0];
  Problem none = c.p;
  none.sink = false;
  const auto in = DtypeInputs(none, 3);
  const Tensor minus_inf = Tensor::FromF64({4}, std::vector<double>(4, kNegInf));
  auto f0 = Take(model.Forward(none, in.q, in.k, in.v), "plain forward");
  auto f1 = Take(model.ForwardSink(c.p, in.q, in.k, in.v, minus_inf), "sink forward");
  EXPECT_TRUE(f0.o.BitwiseEqual(f1.o) && f0.lse.BitwiseEqual(f1.lse));
  auto b0 = Take(model.Backward(none, in.q, in.k, in.v, f0.o, f0.lse, in.dout), "plain bwd");
  auto b1 = Take(model.BackwardSink(c.p, in.q, in.k, in.v, f1.o, f1.lse, in.dout, minus_inf),
                 "sink bwd");
  EXPECT_TRUE(b0.dq.BitwiseEqual(b1.dq) && b0.dk.BitwiseEqual(b1.dk) && b0.dv.BitwiseEqual(b1.dv));
  EXPECT_EQ(MaxAbs(ToF64(b1.dsink)), 0.0);
  // The plain calls never run a sink problem (its tensor is missing).
  EXPECT_TRUE(std::holds_alternative<Unsupported>(model.Forward(c.p, in.q, in.k, in.v)));
}

TEST(FlashSink, EmptyRowsGiveTheSinkAndAHugeSinkTakesTheWholeRow) {
  Flash2Model model("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  Problem p = oracle_test::Base(1, 2, 1, 19, 11, 16, 16);  // causal, Sq > Sk: 8 empty rows
  p.causal = true;
  p.sink = true;
  const auto in = DtypeInputs(p, 5);
  const double huge = 3.4028234663852886e38;  // float32's largest finite value
  const Tensor sink = Tensor::FromF64({2}, {0.5, huge});
  auto f = Take(model.ForwardSink(p, in.q, in.k, in.v, sink), "forward");
  auto b = Take(model.BackwardSink(p, in.q, in.k, in.v, f.o, f.lse, in.dout, sink), "bwd");
  const Tensor o = ToF64(f.o), lse = ToF64(f.lse), dq = ToF64(b.dq);
  for (int64_t i = 0; i < 19; ++i) {
    for (int64_t h = 0; h < 2; ++h) {
      if (i >= 8 && h == 0) continue;
      EXPECT_EQ(lse.at<double>({0, h, i}), h == 0 ? 0.5 : huge) << i;
      for (int64_t c = 0; c < 16; ++c) {
        EXPECT_EQ(o.at<double>({0, i, h, c}), 0.0);
        EXPECT_EQ(dq.at<double>({0, i, h, c}), 0.0);
      }
    }
  }
  EXPECT_EQ(ToF64(b.dsink).at<double>({1}), 0.0);
}

TEST(FlashSink, KernelsThatDoNotClaimSinksAreNotCoveredAndRefuseThem) {
  Problem p = oracle_test::Base(1, 1, 1, 64, 64, 64, 64);
  p.sink = true;
  const Tensor sink = Tensor::FromF64({1}, {0.0});
  Tile64Model tile64;  // a one-loop model without sinks
  std::string why;
  EXPECT_FALSE(tile64.capabilities().sink);
  EXPECT_FALSE(tile64.capabilities().Covers(p, &why));
  EXPECT_EQ(why, "sink");
  const auto in = DtypeInputs(p, 1);
  EXPECT_TRUE(std::holds_alternative<Unsupported>(tile64.ForwardSink(p, in.q, in.k, in.v, sink)));
  // The capability's JSON: written only when claimed, read back.
  Capabilities caps = tile64.capabilities();
  EXPECT_FALSE(CapabilitiesToJson(caps).contains("sink"));
  caps.sink = true;
  const nlohmann::json j = CapabilitiesToJson(caps);
  EXPECT_EQ(j.at("sink"), true);
  auto back = CapabilitiesFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->sink);
  nlohmann::json bad = j;
  bad["sink"] = "yes";
  EXPECT_EQ(CapabilitiesFromJson(bad).error().message, "capabilities.sink: not a boolean");
}

}  // namespace
}  // namespace attest
