// Deterministic generators (generate.h): Philox known answers from Random123, the libm-free
// log against std::log, pinned output values (a change in the stream must be deliberate),
// distribution checks with CLT-derived bounds, independence between tensors and seeds.
#include "reference/data/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/data/element_stream.h"
#include "reference/formats/format.h"

namespace attest {
namespace {

using nlohmann::json;

TEST(Philox, MatchesRandom123KnownAnswers) {
  // Random123 examples/kat_vectors: "philox4x32 10 <ctr[4]> <key[2]> <expected[4]>".
  using A4 = std::array<uint32_t, 4>;
  using A2 = std::array<uint32_t, 2>;
  EXPECT_EQ(Philox4x32(A4{0, 0, 0, 0}, A2{0, 0}),
            (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      Philox4x32(A4{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, A2{0xffffffff, 0xffffffff}),
      (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      Philox4x32(A4{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, A2{0xa4093822, 0x299f31d0}),
      (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

int64_t UlpDistance(double a, double b) {
  // Map doubles to a monotone integer line (sign-magnitude to two's complement).
  auto key = [](double x) {
    int64_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? std::numeric_limits<int64_t>::min() - i : i;
  };
  const int64_t d = key(a) - key(b);
  return d < 0 ? -d : d;
}

TEST(DeterministicLog, WithinOneUlpOfLibmOverTheWholeRange) {
  std::mt19937_64 rng(1);
  int64_t worst = 0;
  double worst_x = 0;
  for (int n = 0; n < 1'000'000; ++n) {
    // Random bit patterns of positive finite doubles (subnormals included), and values near 1
    // where log is smallest and cancellation would show.
    double x;
    if (n % 2) {
      const uint64_t bits = rng() & 0x7fef'ffff'ffff'ffffULL;
      std::memcpy(&x, &bits, sizeof x);
    } else {
      x = 1.0 + std::ldexp(static_cast<double>(rng() >> 11), -53) * (n % 4 ? 0.5 : -0.3);
    }
    if (!(x > 0)) continue;
    const int64_t u = UlpDistance(DeterministicLog(x), std::log(x));
    if (u > worst) worst = u, worst_x = x;
  }
  std::printf("DeterministicLog: max distance to libm log = %lld ulp (at x = %a)\n",
              static_cast<long long>(worst), worst_x);
  EXPECT_LE(worst, 1);
}

TEST(DeterministicLog, PinnedValues) {
  // Recorded from this implementation (x, log x); any change moves every gaussian input.
  const double pins[][2] = {
      {0x0.0000000000001p-1022, -0x1.74385446d71c3p+9},
      {0x1.56e1fc2f8f359p-997, -0x1.5963447f87fb5p+9},
      {0x1.999999999999ap-4, -0x1.26bb1bbb55515p+1},
      {0x1.6a0902de00d1bp-1, -0x1.62e6b3842a25ep-2},
      {0x1.fffffca501acbp-1, -0x1.ad7f2b1049b9fp-24},
      {0x1.000001ad7f29bp+0, 0x1.ad7f2847b6492p-24},
      {0x1.8p+0, 0x1.9f323ecbf984cp-2},
      {0x1.2a05f2p+33, 0x1.7069e2aa2aa5bp+4},
      {0x1.3aa3d3467ee82p+0, 0x1.a6672fdeee06ap-3},
  };
  for (const auto& [x, y] : pins) EXPECT_EQ(DeterministicLog(x), y) << std::hexfloat << x;
}

TEST(DeterministicLog, SpecialValues) {
  EXPECT_EQ(DeterministicLog(1.0), 0.0);
  EXPECT_EQ(DeterministicLog(2.0), std::log(2.0));
  EXPECT_EQ(DeterministicLog(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(DeterministicLog(-1.0)));
  EXPECT_TRUE(std::isnan(DeterministicLog(std::nan(""))));
  EXPECT_EQ(DeterministicLog(std::numeric_limits<double>::infinity()),
            std::numeric_limits<double>::infinity());
  EXPECT_NEAR(DeterministicLog(std::numeric_limits<double>::denorm_min()), -744.44007192138126,
              1e-12);
}

Problem Small() {
  Problem p;
  p.heads_q = 2;
  p.seqlen_q = 3;
  p.seqlen_k = 5;
  p.head_dim = 4;
  p.head_dim_v = 4;
  return p;
}

std::array<double, 4> Probe(const Tensor& t) {
  const auto s = t.span<double>();
  return {s[0], s[1], s[2], s[s.size() - 1]};
}

TEST(Generators, PinnedValuesForSeed12345) {
  // Recorded from this implementation; identical on any IEEE-754 machine. If these change,
  // every stored case file's inputs change: bump a generator name instead.
  using A = std::array<double, 4>;
  const auto g = GenerateInputs(Small(), {"gaussian", 12345, json::object()});
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(Probe(g->q), (A{0x1.b9e8fd224fc87p-2, -0x1.0aa9e98af6cddp+0, -0x1.41ec33773c328p+1,
                            0x1.7543b1651c333p-2}));
  EXPECT_EQ(Probe(g->k), (A{-0x1.39e6c3dbaded1p-1, 0x1.21f976a0d2a3bp+1, 0x1.100269f1c353dp+0,
                            0x1.8bb962e321bap-1}));
  EXPECT_EQ(Probe(g->v), (A{0x1.2d5b0f4d2008ep-2, -0x1.bdc659fec0138p-1, -0x1.d05768f5e230bp-3,
                            -0x1.c91645a6cc598p+0}));
  EXPECT_EQ(Probe(g->dout), (A{-0x1.dd730a1b3d546p-2, -0x1.4dce7619398d9p+0, 0x1.8caeb50fa48e7p+0,
                               0x1.31c235b88ea3cp+0}));
  const auto u = GenerateInputs(Small(), {"uniform", 12345, json::object()});
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_EQ(Probe(u->q), (A{0x1.47e8fa04bdffap-1, -0x1.fd265b5b6c3dcp-1, -0x1.3d32b6aabfb4p-3,
                            0x1.8c93924183a42p-1}));
  EXPECT_EQ(Probe(u->dout), (A{0x1.4f1573fdfc4a8p-1, -0x1.08b158d948e04p-1, 0x1.ffcb40460e644p-2,
                               0x1.1965106ba1748p-3}));
}

TEST(Generators, ShapesFollowTheProblemIncludingVarlen) {
  Problem p = Small();
  p.heads_kv = 2;
  p.head_dim_v = 3;
  auto g = GenerateInputs(p, {"gaussian", 1, json::object()});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->q.shape(), p.QShape());
  EXPECT_EQ(g->k.shape(), p.KShape());
  EXPECT_EQ(g->v.shape(), p.VShape());
  EXPECT_EQ(g->dout.shape(), p.OShape());
  EXPECT_EQ(g->q.dtype(), DType::kF64);
  p.batch = 2;
  p.cu_seqlens_q = std::vector<int32_t>{0, 3, 3};
  p.cu_seqlens_k = std::vector<int32_t>{0, 0, 5};
  g = GenerateInputs(p, {"uniform", 1, json::object()});
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->q.shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(g->v.shape(), (Shape{5, 2, 3}));
  // Zero-size tensors are fine.
  p.cu_seqlens_k = std::vector<int32_t>{0, 0, 0};
  g = GenerateInputs(p, {"gaussian", 1, json::object()});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->k.numel(), 0);
}

TEST(Generators, ElementsDependOnlyOnSeedTensorAndIndex) {
  // This is what makes any parallel fill order give the same bits.
  const Problem p = Small();
  const auto g = GenerateInputs(p, {"gaussian", 77, json{{"std", 0.5}, {"mean", 2}}});
  ASSERT_TRUE(g.ok());
  const auto k = g->k.span<double>();
  for (size_t n = 0; n < k.size(); ++n) {
    ElementStream s(77, kStreamK, n);
    EXPECT_EQ(k[n], 2.0 + 0.5 * s.NextNormal());
  }
  const auto again = GenerateInputs(p, {"gaussian", 77, json{{"std", 0.5}, {"mean", 2}}});
  EXPECT_TRUE(again->q.BitwiseEqual(g->q));
  EXPECT_TRUE(again->dout.BitwiseEqual(g->dout));
}

TEST(Generators, ThreadedFillMatchesSingleStreams) {
  // 2^18 elements per tensor: large enough for the multi-threaded path.
  Problem p;
  p.heads_q = p.heads_kv = 4;
  p.seqlen_q = p.seqlen_k = 1024;
  p.head_dim = p.head_dim_v = 64;
  const auto g = GenerateInputs(p, {"gaussian", 4242, json::object()});
  ASSERT_TRUE(g.ok());
  const auto v = g->v.span<double>();
  ASSERT_EQ(v.size(), size_t{1} << 18);
  for (size_t n = 0; n < v.size(); n += 97) {
    ElementStream s(4242, kStreamV, n);
    ASSERT_EQ(v[n], s.NextNormal()) << n;
  }
  ElementStream last(4242, kStreamV, v.size() - 1);
  EXPECT_EQ(v.back(), last.NextNormal());
}

TEST(Generators, BatchedNormalsAreTheSingleStreamsBitForBit) {
  // The gaussian row draws sixteen elements at a time (AVX2 where the CPU has it) in pieces
  // of 1024, retrying rejected ones together: odd sizes exercise the short groups, and about
  // a fifth of all elements need a second attempt, some a third or more.
  Problem p;
  p.heads_q = p.heads_kv = 3;
  p.seqlen_q = p.seqlen_k = 347;
  p.head_dim = p.head_dim_v = 5;
  const auto g = GenerateInputs(p, {"gaussian", 0x0123456789abcdefULL,
                                    json{{"mean", -0.375}, {"std", 3.1}}});
  ASSERT_TRUE(g.ok());
  const Tensor* tensors[] = {&g->q, &g->k, &g->v, &g->dout};
  for (uint32_t t = 0; t < 4; ++t) {
    const auto x = tensors[t]->span<double>();
    for (size_t n = 0; n < x.size(); ++n) {
      ElementStream s(0x0123456789abcdefULL, t, n);
      const double want = -0.375 + 3.1 * s.NextNormal();
      ASSERT_EQ(std::memcmp(&want, &x[n], sizeof want), 0) << t << " " << n;
    }
  }
}

// Attempts ElementStream(seed, stream, n).NextNormal() makes: one per pair of uniforms drawn
// until s = u^2 + v^2 is in (0, 1), as in NextNormal.
int PolarAttemptsOf(uint64_t seed, uint32_t stream, uint64_t n) {
  ElementStream e(seed, stream, n);
  for (int attempts = 1;; ++attempts) {
    const double u = 2.0 * e.NextUniform() - 1.0;
    const double v = 2.0 * e.NextUniform() - 1.0;
    const double s = u * u + v * v;
    if (s < 1.0 && s != 0.0) return attempts;
  }
}

class NormalsOfEachIsa : public testing::TestWithParam<internal::NormalsIsa> {};

TEST_P(NormalsOfEachIsa, IsTheSingleStreamsBitForBit) {
  // Each instruction set of NormalsOf, forced whatever the dispatch would pick, against the
  // scalar stream over about 1e6 elements: offsets `first` that are not multiples of the
  // groups (16 for AVX2, 24 for AVX-512) or of the pieces of 1024, an index range that crosses
  // 2^32 (the counter's two index words), every short last group, and elements that need
  // seven attempts or more.
  if (!internal::HaveNormalsIsa(GetParam())) GTEST_SKIP() << "this CPU lacks that instruction set";
  struct Case {
    uint64_t seed;
    uint32_t stream;
    uint64_t first;
    size_t size;
  };
  std::vector<Case> cases = {
      {0x0123456789abcdefULL, 0, 0, 400'009},
      {1, 3, 13, 300'007},
      {0xfeedfacecafebeefULL, 7, (uint64_t{1} << 40) + 3, 300'001},
      {~uint64_t{0}, ~uint32_t{0}, (uint64_t{1} << 32) - 1'001, 2'003},
      {2026, 1, 1'021, 1'029},
  };
  for (size_t size = 1; size <= 49; ++size) cases.push_back({42, 2, 5 + 3 * size, size});
  size_t elements = 0;
  int most_attempts = 0;
  for (const Case& c : cases) {
    std::vector<double> got(c.size);
    internal::NormalsOfIsa(GetParam(), c.seed, c.stream, c.first, got);
    for (size_t i = 0; i < got.size(); ++i) {
      const double want = ElementStream(c.seed, c.stream, c.first + i).NextNormal();
      ASSERT_EQ(std::memcmp(&want, &got[i], sizeof want), 0)
          << "seed " << c.seed << " stream " << c.stream << " element " << c.first + i << ": "
          << got[i] << " instead of " << want;
      most_attempts = std::max(most_attempts, PolarAttemptsOf(c.seed, c.stream, c.first + i));
    }
    elements += c.size;
  }
  EXPECT_GE(elements, size_t{1'000'000});
  EXPECT_GE(most_attempts, 7);
}

INSTANTIATE_TEST_SUITE_P(Generators, NormalsOfEachIsa,
                         testing::Values(internal::NormalsIsa::kScalar,
                                         internal::NormalsIsa::kAvx2,
                                         internal::NormalsIsa::kAvx512),
                         [](const testing::TestParamInfo<internal::NormalsIsa>& info) {
                           switch (info.param) {
                             case internal::NormalsIsa::kScalar:
                               return std::string("Scalar");
                             case internal::NormalsIsa::kAvx2:
                               return std::string("Avx2");
                             case internal::NormalsIsa::kAvx512:
                               return std::string("Avx512");
                           }
                           return std::string("Unknown");
                         });

// Kolmogorov-Smirnov statistic of `xs` against `cdf`.
template <class Cdf>
double KsStatistic(std::vector<double> xs, Cdf cdf) {
  std::sort(xs.begin(), xs.end());
  double d = 0;
  const double n = static_cast<double>(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double f = cdf(xs[i]);
    d = std::max({d, f - static_cast<double>(i) / n, static_cast<double>(i + 1) / n - f});
  }
  return d;
}

Problem Big() {
  Problem p;
  p.heads_q = 4;
  p.heads_kv = 4;
  p.seqlen_q = 256;
  p.seqlen_k = 256;
  p.head_dim = 64;
  p.head_dim_v = 64;
  return p;  // 65536 elements per tensor
}

std::vector<double> Values(const Tensor& t) {
  const auto s = t.span<double>();
  return {s.begin(), s.end()};
}

TEST(Generators, GaussianMomentsAndShapeWithinClTBounds) {
  const auto g = GenerateInputs(Big(), {"gaussian", 2026, json{{"std", 3.0}, {"mean", -1.0}}});
  ASSERT_TRUE(g.ok());
  for (const Tensor* t : {&g->q, &g->k, &g->v, &g->dout}) {
    const std::vector<double> x = Values(*t);
    const double n = static_cast<double>(x.size());
    double m1 = 0, m2 = 0, m4 = 0;
    for (double v : x) {
      const double z = (v + 1.0) / 3.0;
      m1 += z, m2 += z * z, m4 += z * z * z * z;
    }
    m1 /= n, m2 /= n, m4 /= n;
    // Standard errors of the sample moments of N(0, 1): sqrt(1/n), sqrt(2/n), sqrt(96/n)
    // (Var z^2 = 3 - 1, Var z^4 = 105 - 9). Five of them: a false alarm is < 1e-6 likely.
    EXPECT_LT(std::abs(m1), 5 * std::sqrt(1 / n));
    EXPECT_LT(std::abs(m2 - 1), 5 * std::sqrt(2 / n));
    EXPECT_LT(std::abs(m4 - 3), 5 * std::sqrt(96 / n));
    // The whole distribution: KS at the 0.1% level is 1.95 / sqrt(n).
    const double d = KsStatistic(
        x, [](double v) { return 0.5 * std::erfc(-((v + 1.0) / 3.0) / std::sqrt(2.0)); });
    std::printf("gaussian KS D*sqrt(n) = %.3f (0.1%% critical value 1.95)\n", d * std::sqrt(n));
    EXPECT_LT(d * std::sqrt(n), 1.95);
  }
}

TEST(Generators, UniformMomentsRangeAndShape) {
  const auto g = GenerateInputs(Big(), {"uniform", 5, json{{"low", -2.0}, {"high", 6.0}}});
  ASSERT_TRUE(g.ok());
  const std::vector<double> x = Values(g->v);
  const double n = static_cast<double>(x.size());
  double m1 = 0, m2 = 0;
  for (double v : x) {
    ASSERT_GE(v, -2.0);
    ASSERT_LT(v, 6.0);
    m1 += v, m2 += v * v;
  }
  m1 /= n, m2 /= n;
  const double var = m2 - m1 * m1;
  // U(-2, 6): mean 2, variance 64/12; Var of (u - 2)^2 is 4^4/5 - (16/3)^2.
  EXPECT_LT(std::abs(m1 - 2.0), 5 * std::sqrt(64.0 / 12.0 / n));
  EXPECT_LT(std::abs(var - 64.0 / 12.0), 5 * std::sqrt((256.0 / 5 - 256.0 / 9) / n));
  const double d = KsStatistic(x, [](double v) { return (v + 2.0) / 8.0; });
  EXPECT_LT(d * std::sqrt(n), 1.95);
}

double Correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) ma += a[i], mb += b[i];
  ma /= static_cast<double>(n), mb /= static_cast<double>(n);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

TEST(Generators, TensorsSeedsAndNeighboursAreIndependent) {
  const auto g = GenerateInputs(Big(), {"gaussian", 9, json::object()});
  const auto h = GenerateInputs(Big(), {"gaussian", 10, json::object()});
  ASSERT_TRUE(g.ok() && h.ok());
  const auto q = Values(g->q), k = Values(g->k), v = Values(g->v), d = Values(g->dout);
  const double bound = 5 / std::sqrt(static_cast<double>(q.size()));  // 5 sigma of r under H0
  EXPECT_LT(std::abs(Correlation(q, k)), bound);
  EXPECT_LT(std::abs(Correlation(q, v)), bound);
  EXPECT_LT(std::abs(Correlation(k, v)), bound);
  EXPECT_LT(std::abs(Correlation(v, d)), bound);
  EXPECT_LT(std::abs(Correlation(q, Values(h->q))), bound);  // adjacent seeds
  // Neighbouring elements of one tensor.
  const std::vector<double> shifted(q.begin() + 1, q.end());
  EXPECT_LT(std::abs(Correlation(q, shifted)), bound);
  // Squares too: a dependence in magnitude (e.g. a shared polar radius) shows here.
  std::vector<double> q2(q.size()), s2(shifted.size());
  for (size_t i = 0; i < q.size(); ++i) q2[i] = q[i] * q[i];
  for (size_t i = 0; i < shifted.size(); ++i) s2[i] = shifted[i] * shifted[i];
  EXPECT_LT(std::abs(Correlation(q2, s2)), bound);
}

TEST(Generators, PerTensorOverridesApplyToThatTensorOnly) {
  const json params = {{"std", 2.0}, {"k", {{"std", 0.0}, {"mean", 5.0}}}};
  const auto g = GenerateInputs(Small(), {"gaussian", 3, params});
  const auto base = GenerateInputs(Small(), {"gaussian", 3, json{{"std", 2.0}}});
  ASSERT_TRUE(g.ok()) << g.error().message;
  for (double x : g->k.span<double>()) EXPECT_EQ(x, 5.0);
  EXPECT_TRUE(g->q.BitwiseEqual(base->q));
  EXPECT_TRUE(g->v.BitwiseEqual(base->v));
}

TEST(Generators, RejectsBadSpecsNamingTheField) {
  const Problem p = Small();
  auto message = [&](const GeneratorSpec& s) {
    const auto g = GenerateInputs(p, s);
    return g.ok() ? std::string("(accepted)") : g.error().message;
  };
  EXPECT_EQ(message({"gausian", 1, json::object()}),
            "generator.name: unknown generator \"gausian\" (known: gaussian, uniform, "
            "outlier-channels, heavy-tail, token-scale-spread, peaked-logits, "
            "near-fp8-subnormal, near-max, constant-rows, ties)");
  EXPECT_EQ(message({"gaussian", 1, json{{"sdt", 1}}}),
            "generator.params: unknown parameter \"sdt\" for generator gaussian (parameters: "
            "mean, std; per-tensor overrides: q, k, v, do)");
  EXPECT_EQ(message({"gaussian", 1, json{{"std", -1}}}), "generator.params.q.std: -1 must be >= 0");
  EXPECT_EQ(message({"gaussian", 1, json{{"std", "1"}}}),
            "generator.params.std: expected a finite number, got \"1\"");
  EXPECT_EQ(message({"gaussian", 1, json{{"v", {{"low", 0}}}}}),
            "generator.params.v: unknown parameter \"low\" for generator gaussian (parameters: "
            "mean, std)");
  EXPECT_EQ(message({"gaussian", 1, json{{"do", 3}}}),
            "generator.params.do: expected an object, got 3");
  EXPECT_EQ(message({"uniform", 1, json{{"low", 1}, {"high", 1}}}),
            "generator.params.q: low = 1 must be below high = 1 (and high - low finite)");
  EXPECT_EQ(message({"uniform", 1, json{{"do", {{"high", -2}}}}}),
            "generator.params.do: low = -1 must be below high = -2 (and high - low finite)");
  EXPECT_EQ(message({"uniform", 1, json::array()}).substr(0, 30), "generator.params: expected an ");
  EXPECT_EQ(GeneratorNames(),
            (std::vector<std::string>{"gaussian", "uniform", "outlier-channels", "heavy-tail",
                                      "token-scale-spread", "peaked-logits", "near-fp8-subnormal",
                                      "near-max", "constant-rows", "ties"}));
  EXPECT_EQ(message({"near-max", 1, json{{"format", 3}}}),
            "generator.params.format: expected a string, got 3");
  EXPECT_EQ(message({"near-max", 1, json{{"format", "e9m9"}}}),
            "generator.params.q.format: unknown format \"e9m9\"");
  EXPECT_EQ(message({"near-fp8-subnormal", 1, json{{"format", "e8m0fnu"}}}),
            "generator.params.q.format: e8m0fnu has no subnormals");
  EXPECT_EQ(message({"heavy-tail", 1, json{{"k", {{"dof", 2.5}}}}}),
            "generator.params.k.dof: 2.5 must be an integer in [1, 64]");
  EXPECT_EQ(message({"ties", 1, json{{"group", 0}}}),
            "generator.params.q.group: 0 must be an integer in [1, 1048576]");
}

// --- Rows for real workloads --------------------------------------------------------------

Problem Mid() {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 9;
  p.seqlen_k = 12;
  p.head_dim = 16;
  p.head_dim_v = 8;
  return p;
}

Problem Packed() {
  Problem p = Mid();
  p.batch = 3;
  p.cu_seqlens_q = std::vector<int32_t>{0, 4, 4, 9};
  p.cu_seqlens_k = std::vector<int32_t>{0, 5, 5, 12};
  return p;
}

GeneratedInputs Gen(const Problem& p, const std::string& name, uint64_t seed,
                    const json& params = json::object()) {
  auto g = GenerateInputs(p, {name, seed, params});
  EXPECT_TRUE(g.ok()) << name << ": " << g.error().message;
  return g.ok() ? std::move(*g) : GeneratedInputs{};
}

TEST(Generators, EveryRowIsDeterministicAndSeedSensitiveOnPaddedAndPackedProblems) {
  for (const auto& name : GeneratorNames()) {
    for (const Problem& p : {Mid(), Packed()}) {
      const auto a = Gen(p, name, 7), b = Gen(p, name, 7), c = Gen(p, name, 8);
      EXPECT_TRUE(a.q.BitwiseEqual(b.q) && a.k.BitwiseEqual(b.k) && a.v.BitwiseEqual(b.v) &&
                  a.dout.BitwiseEqual(b.dout))
          << name;
      EXPECT_FALSE(a.q.BitwiseEqual(c.q)) << name;
      EXPECT_EQ(a.q.shape(), p.QShape()) << name;
      EXPECT_EQ(a.v.shape(), p.VShape()) << name;
      for (const Tensor* t : {&a.q, &a.k, &a.v, &a.dout}) {
        for (double x : t->span<double>()) ASSERT_TRUE(std::isfinite(x)) << name;
      }
    }
  }
}

TEST(Generators, OutlierChannelsScaleAFewSharedChannels) {
  Problem p = Mid();
  p.seqlen_q = p.seqlen_k = 256;
  const auto g = Gen(p, "outlier-channels", 3, json{{"scale", 50.0}, {"count", 3}});
  // Channel mean squares: the outliers sit near 2500, the rest near 1.
  auto channel_ms = [&](const Tensor& t) {
    const int64_t d = t.shape().back();
    std::vector<double> ms(static_cast<size_t>(d), 0.0);
    const auto s = t.span<double>();
    for (size_t n = 0; n < s.size(); ++n) ms[n % static_cast<size_t>(d)] += s[n] * s[n];
    std::vector<int> big;
    for (int64_t c = 0; c < d; ++c) {
      if (ms[static_cast<size_t>(c)] / static_cast<double>(s.size() / d) > 100) big.push_back(c);
    }
    return big;
  };
  EXPECT_EQ(channel_ms(g.q).size(), 3u);
  EXPECT_EQ(channel_ms(g.q), channel_ms(g.k));
  EXPECT_EQ(channel_ms(g.v).size(), 3u);
  const auto own = Gen(p, "outlier-channels", 3, json{{"count", 3}, {"shared_qk", 0}});
  EXPECT_EQ(channel_ms(own.q), channel_ms(g.q));  // q keeps its draw either way
}

TEST(Generators, HeavyTailHasTheStudentTTail) {
  Problem p = Mid();
  p.seqlen_q = 2048;
  const auto g = Gen(p, "heavy-tail", 5, json{{"dof", 3}});
  // P(|t_3| > 10) = 0.00212, versus 1.5e-23 for a normal: count exceedances in 262144 draws.
  const auto s = g.q.span<double>();
  const double n = static_cast<double>(s.size());
  const double hits = static_cast<double>(
      std::count_if(s.begin(), s.end(), [](double x) { return std::abs(x) > 10; }));
  const double expected = 0.00212 * n;
  EXPECT_NEAR(hits, expected, 6 * std::sqrt(expected)) << hits;
}

TEST(Generators, TokenScaleSpreadSharesOneScalePerTokenAcrossDecades) {
  Problem p = Mid();
  p.seqlen_q = 512;
  const auto g = Gen(p, "token-scale-spread", 9, json{{"decades", 6}});
  const auto base = Gen(p, "gaussian", 9);
  const auto s = g.q.span<double>(), b = base.q.span<double>();
  const size_t per_token = static_cast<size_t>(p.heads_q * p.head_dim);
  double lo = 1e300, hi = 0;
  for (size_t t = 0; t < s.size() / per_token; ++t) {
    // The same gaussian draw times one factor: the ratio is constant within the token.
    const double r = s[t * per_token] / b[t * per_token];
    for (size_t n = t * per_token; n < (t + 1) * per_token; ++n) {
      ASSERT_NEAR(s[n] / b[n], r, 1e-15 * r) << t;
    }
    lo = std::min(lo, r), hi = std::max(hi, r);
  }
  // 6 decades: e in [-10, 10) so scales in [2^-10, 2^10): the spread reaches > 5 decades.
  EXPECT_GE(lo, 0x1p-10);
  EXPECT_LT(hi, 0x1p10);
  EXPECT_GT(hi / lo, 1e5);
}

TEST(Generators, PeakedLogitsMakeNearOneHotRowsIncludingPackedSequences) {
  for (const Problem& base : {Mid(), Packed()}) {
    Problem p = base;
    p.head_dim = 64;
    const auto g = Gen(p, "peaked-logits", 11);
    const auto q = g.q.span<double>(), k = g.k.span<double>();
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence seq = SequenceOf(p, b);
      for (int64_t i = seq.q_begin; i < seq.q_begin + seq.q_len; ++i) {
        for (int64_t h = 0; h < p.heads_q; ++h) {
          std::vector<double> s;
          for (int64_t j = seq.k_begin; j < seq.k_begin + seq.k_len; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < 64; ++d) {
              dot += q[static_cast<size_t>((i * p.heads_q + h) * 64 + d)] *
                     k[static_cast<size_t>((j * p.heads_kv + p.KvHead(h)) * 64 + d)];
            }
            s.push_back(dot / 8);
          }
          if (s.empty()) continue;
          std::sort(s.begin(), s.end());
          // The copied key's logit leads the runner-up by a wide margin.
          if (s.size() > 1) EXPECT_GT(s.back() - s[s.size() - 2], 6.0) << b << " " << i;
        }
      }
    }
  }
}

TEST(Generators, NearFp8SubnormalSpansTheSubnormalBinadesWithGridValues) {
  Problem p = Mid();
  p.seqlen_q = 512;
  const auto g = Gen(p, "near-fp8-subnormal", 2, json{{"format", "e4m3fn"}});
  int subnormal = 0, on_grid = 0, zeros = 0;
  for (double x : g.q.span<double>()) {
    if (x == 0) {
      ++zeros;
      continue;
    }
    EXPECT_GE(std::abs(x), 0x1p-10);  // half the smallest subnormal 2^-9
    EXPECT_LE(std::abs(x), 0x1p-4);   // up to 4 * the smallest normal 2^-6 (rounded)
    subnormal += std::abs(x) < 0x1p-6;
    on_grid += RoundTo(x, Format::kE4M3FN) == x;
  }
  const int n = static_cast<int>(g.q.numel());
  EXPECT_GT(subnormal, n / 3);
  EXPECT_GT(on_grid, n / 3);
  EXPECT_NEAR(zeros, n / 16, 5 * std::sqrt(n / 16.0));
  const auto e5 = Gen(p, "near-fp8-subnormal", 2, json{{"format", "e5m2"}, {"zero_fraction", 0}});
  for (double x : e5.q.span<double>()) EXPECT_LE(std::abs(x), 0x1p-12);
}

TEST(Generators, NearMaxReachesTheTopCodesOfTheFormatOrTheDtype) {
  Problem p = Mid();
  const auto g = Gen(p, "near-max", 4, json{{"format", "e4m3fn"}});
  int top = 0;
  for (double x : g.q.span<double>()) {
    EXPECT_GE(std::abs(x), 224.0);
    EXPECT_LE(std::abs(x), 448.0);
    top += std::abs(x) == 448.0;
  }
  EXPECT_GT(top, 0);
  // Default format: the problem's dtype (bf16 max = 0x1.fep127).
  const auto d = Gen(p, "near-max", 4);
  double hi = 0;
  for (double x : d.k.span<double>()) hi = std::max(hi, std::abs(x));
  EXPECT_EQ(hi, 0x1.fep127);
  // high > 1 goes past the maximum (overflow of the format).
  const auto over = Gen(p, "near-max", 4,
                        json{{"format", "e5m2"}, {"low", 1.0}, {"high", 1.5}, {"on_grid", 0.0}});
  for (double x : over.v.span<double>()) EXPECT_GE(std::abs(x), 57344.0);
}

TEST(Generators, ConstantRowsRepeatTheFirstKeyOfEachSequence) {
  for (const Problem& p : {Mid(), Packed()}) {
    const auto g = Gen(p, "constant-rows", 6);
    for (const Tensor* t : {&g.k, &g.v}) {
      const auto s = t->span<double>();
      const int64_t row = p.heads_kv * t->shape().back();
      for (int64_t b = 0; b < p.batch; ++b) {
        const Sequence seq = SequenceOf(p, b);
        for (int64_t j = seq.k_begin; j < seq.k_begin + seq.k_len; ++j) {
          for (int64_t e = 0; e < row; ++e) {
            ASSERT_EQ(s[static_cast<size_t>(j * row + e)],
                      s[static_cast<size_t>(seq.k_begin * row + e)]);
          }
        }
      }
    }
    EXPECT_FALSE(g.q.BitwiseEqual(g.k));
  }
}

TEST(Generators, TiesAreExactGridValuesInRunsOfIdenticalKeys) {
  const Problem p = Packed();
  const auto g = Gen(p, "ties", 12, json{{"group", 3}});
  for (const Tensor* t : {&g.q, &g.k, &g.v, &g.dout}) {
    for (double x : t->span<double>()) {
      EXPECT_EQ(x * 2, std::round(x * 2));
      EXPECT_LE(std::abs(x), 1.0);
    }
  }
  const auto k = g.k.span<double>();
  const int64_t row = p.heads_kv * p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = SequenceOf(p, b);
    for (int64_t j = 0; j < seq.k_len; ++j) {
      const int64_t first = seq.k_begin + j - j % 3;
      for (int64_t e = 0; e < row; ++e) {
        ASSERT_EQ(k[static_cast<size_t>((seq.k_begin + j) * row + e)],
                  k[static_cast<size_t>(first * row + e)]);
      }
    }
  }
}

TEST(Generators, NewRowsPinnedValuesForSeed12345) {
  // Recorded from this implementation; a change moves every stored case of these rows.
  const Problem p = Small();
  for (const auto& name : GeneratorNames()) {
    const auto g = Gen(p, name, 12345);
    std::printf("%-20s q %a %a k %a v %a\n", name.c_str(), g.q.span<double>()[0],
                g.q.span<double>()[1], g.k.span<double>()[0], g.v.span<double>()[0]);
  }
}

}  // namespace
}  // namespace attest
