// The bias statistic (verify/metrics/bias.h) on synthetic samples: rounding to nearest is
// unbiased, truncation and rounding up are not, a declared truncation is expected, ties and
// exact elements are counted, and too small a sample abstains.
#include "verify/metrics/bias.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "reference/formats/format.h"

namespace attest {
namespace {

constexpr int64_t kBlock = 64;

// `rows` blocks of kBlock oracle values (standard normal, not representable in bf16).
std::vector<double> Oracle(int64_t rows, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> r(static_cast<size_t>(rows * kBlock));
  for (double& x : r) x = n(gen);
  return r;
}

std::vector<double> Rounded(const std::vector<double>& r, Rounding mode) {
  EncodeOptions o;
  o.rounding = mode;
  std::vector<double> out;
  for (double x : r) out.push_back(RoundTo(x, Format::kBF16, o));
  return out;
}

TEST(StudentT, QuantilesMatchTables) {
  // Two-sided 95 % and 99 % points (any t table), and the normal limit 5.0263 at 2.5e-7.
  EXPECT_NEAR(StudentTUpperQuantile(0.025, 10), 2.228139, 1e-5);
  EXPECT_NEAR(StudentTUpperQuantile(0.005, 30), 2.749996, 1e-5);
  EXPECT_NEAR(StudentTUpperQuantile(0.05, 1), 6.313752, 1e-5);
  EXPECT_NEAR(StudentTUpperQuantile(2.5e-7, 1e7), 5.0263, 1e-3);
  EXPECT_NEAR(StudentTUpperTail(0, 5), 0.5, 1e-15);
}

TEST(Bias, RoundToNearestAgainstItselfIsAllTies) {
  const std::vector<double> r = Oracle(64, 1);
  const std::vector<double> x = Rounded(r, Rounding::kNearestEven);
  const BiasJudgement s = ComputeBias(x, r, x, Format::kBF16, kBlock);
  EXPECT_FALSE(s.abstained);
  EXPECT_TRUE(s.pass);
  EXPECT_EQ(s.margin, 0);
  EXPECT_EQ(s.signed_dir.ties, s.elements);
  EXPECT_EQ(s.signed_dir.positive + s.signed_dir.negative, 0);
  // The kernel's own mean error is reported even though it passes: about 0 for RNE.
  EXPECT_LT(std::fabs(s.signed_dir.mean_error), 0.02);
  EXPECT_LT(std::fabs(s.radial.mean_error), 0.02);
}

TEST(Bias, UnbiasedNoiseAroundTheExpectedValuesPasses) {
  // A kernel whose arithmetic differs (fp32 noise of 2^-10 relative before its RNE rounding)
  // from the reference: some elements round the other way, both ways alike.
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<double> r = Oracle(64, 100 + seed);
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> n(0.0, 0x1p-10);
    std::vector<double> noisy(r);
    for (double& v : noisy) v *= 1 + n(gen);
    const BiasJudgement s = ComputeBias(Rounded(noisy, Rounding::kNearestEven), r,
                                   Rounded(r, Rounding::kNearestEven), Format::kBF16, kBlock);
    ASSERT_FALSE(s.abstained);
    EXPECT_TRUE(s.pass) << "seed " << seed << " margin " << s.margin;
    EXPECT_GT(s.signed_dir.positive, 0);
    EXPECT_GT(s.signed_dir.negative, 0);
  }
}

TEST(Bias, TruncationFailsTowardZero) {
  const std::vector<double> r = Oracle(64, 2);
  const BiasJudgement s = ComputeBias(Rounded(r, Rounding::kTowardZero), r,
                                 Rounded(r, Rounding::kNearestEven), Format::kBF16, kBlock);
  EXPECT_FALSE(s.pass);
  EXPECT_GT(s.margin, 1.5);
  EXPECT_NEAR(s.radial.mean_error, -0.5, 0.05);  // uniform in (-1, 0] ulp
  EXPECT_NEAR(s.radial.mean_excess, -0.5, 0.05);
  EXPECT_LT(std::fabs(s.signed_dir.mean_excess), 0.1);  // symmetric data: signed mean ~0
  EXPECT_EQ(s.radial.positive, 0);
}

TEST(Bias, RoundingUpFailsSigned) {
  const std::vector<double> r = Oracle(64, 3);
  const BiasJudgement s = ComputeBias(Rounded(r, Rounding::kUp), r,
                                 Rounded(r, Rounding::kNearestEven), Format::kBF16, kBlock);
  EXPECT_FALSE(s.pass);
  EXPECT_NEAR(s.signed_dir.mean_excess, 0.5, 0.05);
  EXPECT_EQ(s.signed_dir.negative, 0);
}

TEST(Bias, DeclaredTruncationIsExpected) {
  // The recipe declares the truncation: the expected values truncate too, the excess is 0,
  // while the reported mean error still shows the -0.5 ulp.
  const std::vector<double> r = Oracle(64, 4);
  const std::vector<double> x = Rounded(r, Rounding::kTowardZero);
  const BiasJudgement s = ComputeBias(x, r, x, Format::kBF16, kBlock);
  EXPECT_TRUE(s.pass);
  EXPECT_NEAR(s.radial.mean_error, -0.5, 0.05);
  EXPECT_NEAR(s.radial.mean_expected, -0.5, 0.05);
  EXPECT_EQ(s.radial.mean_excess, 0);
}

TEST(Bias, ExactElementsAreLeftOutAndTiesCounted) {
  std::vector<double> r = Oracle(40, 5);
  // Every other block holds exactly representable values (a masked row's zeros, small
  // integers): the kernel returns them exactly; they carry no direction.
  for (size_t i = 0; i < r.size(); ++i) {
    if ((i / kBlock) % 2 == 1) r[i] = static_cast<double>(i % 7);
  }
  std::vector<double> x = Rounded(r, Rounding::kNearestEven);
  const BiasJudgement s = ComputeBias(x, r, x, Format::kBF16, kBlock);
  EXPECT_EQ(s.exact, 20 * kBlock);
  EXPECT_EQ(s.elements, 20 * kBlock);
  EXPECT_EQ(s.signed_dir.ties, s.elements);
  // 20 blocks with a rounding: below the minimum of 32, so the tensor abstains.
  EXPECT_TRUE(s.abstained);
  EXPECT_NE(s.abstain_reason.find("below the minimum sample"), std::string::npos);
  EXPECT_NE(s.abstain_reason.find("1280 exact"), std::string::npos) << s.abstain_reason;
}

TEST(Bias, TooSmallASampleAbstains) {
  const std::vector<double> r = Oracle(4, 6);  // 256 elements in 4 blocks
  const BiasJudgement s = ComputeBias(Rounded(r, Rounding::kTowardZero), r,
                                 Rounded(r, Rounding::kNearestEven), Format::kBF16, kBlock);
  EXPECT_TRUE(s.abstained);
  EXPECT_TRUE(s.pass);  // no verdict: the check issues none for an abstained tensor
  EXPECT_EQ(s.elements, 256);
}

TEST(Bias, RowSharedErrorsAreJudgedByRowMeans) {
  // Every row shifted by its own error (a row statistic's rounding), of either sign: element
  // by element the sample looks huge and biased per row, but the rows' means average out.
  const std::vector<double> r = Oracle(200, 7);
  std::mt19937_64 gen(7);
  std::uniform_int_distribution<int> coin(0, 1);
  std::vector<double> shifted(r);
  for (size_t b = 0; b < 200; ++b) {
    const double f = coin(gen) ? 1 + 0x1p-9 : 1 - 0x1p-9;
    for (size_t i = 0; i < kBlock; ++i) shifted[b * kBlock + i] *= f;
  }
  const BiasJudgement s = ComputeBias(Rounded(shifted, Rounding::kNearestEven), r,
                                 Rounded(r, Rounding::kNearestEven), Format::kBF16, kBlock);
  EXPECT_TRUE(s.pass) << s.margin;
  EXPECT_GT(s.radial.stderr_excess, 0.01);  // the rows' spread, not the elements'
}

TEST(Bias, NonFiniteElementsAreSkipped) {
  std::vector<double> r = Oracle(40, 8);
  std::vector<double> x = Rounded(r, Rounding::kNearestEven);
  r[3] = -INFINITY;
  x[3] = -INFINITY;
  x[5] = NAN;
  const BiasJudgement s = ComputeBias(x, r, x, Format::kBF16, kBlock);
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.elements, 40 * kBlock - 2);
}

}  // namespace
}  // namespace attest
