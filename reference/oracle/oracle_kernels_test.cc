// Tests of the float64 oracle's row kernels (oracle_exp.h; docs/design.md "Oracle"): the exp
// against MPFR over millions of arguments and every range-reduction and scaling boundary,
// its short in-range path bitwise against the full one, and the fused forward/backward row
// passes and row statistics against plain loops that call ExpInPlace (the kernel tested
// above): bitwise where the operations are the same, within Sum2's bound for the
// lane-compensated sums.
#include "reference/oracle/oracle_exp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "reference/oracle/oracle_mp.h"

#if ATTEST_ORACLE_HAVE_MPFR
#include <mpfr.h>
#endif

namespace attest::oracle_internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kU = 0x1p-53;

// Arguments where exp is hardest or its implementation switches: every range-reduction
// boundary x = (k + 1/2) ln 2 (where round(x / ln 2) flips) and x = k ln 2 for all k with a
// finite nonzero result, +-8 ulps around each; the subnormal and overflow thresholds; zero.
std::vector<double> BoundaryArguments() {
  std::vector<double> x;
  const double ln2 = 0.6931471805599453;
  for (int k = -1080; k <= 1025; ++k) {
    for (double c : {k * ln2, (k + 0.5) * ln2}) {
      double lo = c, hi = c;
      for (int s = 0; s < 8; ++s) {
        lo = std::nextafter(lo, -kInf);
        hi = std::nextafter(hi, kInf);
        x.push_back(lo);
        x.push_back(hi);
      }
      x.push_back(c);
    }
  }
  for (double c : {-708.3964185322641, -708.39641853226408, -744.4400719213812,
                   -745.1332191019411, -745.2, 709.782712893384, 709.7827128933840, 0.0}) {
    double lo = c, hi = c;
    for (int s = 0; s < 64; ++s) {
      lo = std::nextafter(lo, -kInf);
      hi = std::nextafter(hi, kInf);
      x.push_back(lo);
      x.push_back(hi);
    }
    x.push_back(c);
  }
  return x;
}

#if ATTEST_ORACLE_HAVE_MPFR
// |y - exp(x)| in units of the last place of exp(x) (binary64 spacing at |exp(x)|, with
// the subnormal spacing 2^-1074 below 2^-1022), exp(x) from MPFR at 160 bits: its own
// relative error 2^-160 cannot move the ulp count at the precision the test reads.
class UlpError {
 public:
  UlpError() {
    mpfr_inits2(160, x_, e_, d_, static_cast<mpfr_ptr>(nullptr));
  }
  ~UlpError() { mpfr_clears(x_, e_, d_, static_cast<mpfr_ptr>(nullptr)); }
  UlpError(const UlpError&) = delete;
  UlpError& operator=(const UlpError&) = delete;

  double operator()(double x, double y) {
    mpfr_set_d(x_, x, MPFR_RNDN);
    mpfr_exp(e_, x_, MPFR_RNDN);
    const double exact = mpfr_get_d(e_, MPFR_RNDN);  // correctly rounded exp(x)
    last_exact_ = exact;
    if (std::isinf(exact) && std::isinf(y)) return 0;  // rounds to +inf, and does
    mpfr_set_d(d_, y, MPFR_RNDN);
    mpfr_sub(d_, d_, e_, MPFR_RNDN);
    mpfr_abs(d_, d_, MPFR_RNDN);
    const double mag = std::abs(exact);
    // Above the largest double, the spacing of the top binade (2^971).
    const double ulp = mag < 0x1p-1022           ? 0x1p-1074
                       : std::isinf(mag)         ? 0x1p971
                                                 : std::nextafter(mag, kInf) - mag;
    mpfr_div_d(d_, d_, ulp, MPFR_RNDN);  // in MPFR: near 2^-1022 |y - exp(x)| is below 2^-1074
    return mpfr_get_d(d_, MPFR_RNDN);
  }
  double last_exact() const { return last_exact_; }  // of the last call, rounded to double

 private:
  mpfr_t x_, e_, d_;
  double last_exact_ = 0;
};
#endif

TEST(OracleKernelsTest, ExpIsWithinOneUlpOverMillionsOfArgumentsAndEveryBoundary) {
#if !ATTEST_ORACLE_HAVE_MPFR
  GTEST_SKIP() << "needs MPFR";
#else
  // 2^21 random arguments: the whole finite-result range [-745.13, 709.78] uniformly, the
  // softmax range [-40, 0] (where the oracle's arguments s - m lie) densely, and [-1, 1];
  // plus the boundaries.
  std::mt19937_64 rng(20261202);
  std::uniform_real_distribution<double> whole(-745.13, 709.78), softmax(-40.0, 0.0),
      near_zero(-1.0, 1.0);
  std::vector<double> x = BoundaryArguments();
  const size_t boundaries = x.size();
  for (int n = 0; n < (1 << 21); ++n) {
    const int which = n % 4;
    x.push_back(which == 0 ? whole(rng) : which == 3 ? near_zero(rng) : softmax(rng));
  }
  std::vector<double> y = x;
  ExpInPlace(y.data(), static_cast<int64_t>(y.size()));
  UlpError ulp_error;
  double worst = 0, worst_x = 0, worst_normal = 0, worst_normal_x = 0;
  size_t over_half = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    const double err = ulp_error(x[e], y[e]);
    if (err > worst) worst = err, worst_x = x[e];
    const double mag = ulp_error.last_exact();
    if (mag >= 0x1p-1022 && mag <= 0x1.fffffffffffffp1023 && err > worst_normal) {
      worst_normal = err, worst_normal_x = x[e];
    }
    over_half += err > 0.5;
    ASSERT_LE(err, 1.0) << "exp(" << x[e] << ") = " << y[e];
  }
  std::printf("  exp kernel over %zu arguments (%zu at boundaries): max error %.6f ulp (at "
              "%.17g), %.6f ulp for normal results (at %.17g); %.2f%% not correctly rounded\n",
              x.size(), boundaries, worst, worst_x, worst_normal, worst_normal_x,
              100.0 * double(over_half) / double(x.size()));
#endif
}

// The kernels take blocks of eight arguments that all lie in [-708, 709] through a shorter
// path (no range handling) and everything else through the full one: both must give the
// same bits, which the full path alone (a block of one) shows. Blocks mix in-range
// arguments with every out-of-range kind (-inf, NaN, underflow, overflow, the edges).
TEST(OracleKernelsTest, InRangeBlocksGiveTheBitsOfTheFullPath) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> in_range(-708.0, 709.0), softmax(-40.0, 0.0);
  const double specials[] = {-kInf, std::nan(""), -745.0, -708.5, 709.5, 710.0, -708.0, 709.0,
                             std::nextafter(-708.0, -kInf), std::nextafter(709.0, kInf)};
  std::vector<double> x;
  for (int n = 0; n < (1 << 18); ++n) {
    x.push_back(n % 2 == 0 ? in_range(rng) : softmax(rng));
    if (rng() % 64 == 0) x.push_back(specials[rng() % std::size(specials)]);
  }
  std::vector<double> blocked = x;
  ExpInPlace(blocked.data(), static_cast<int64_t>(blocked.size()));
  for (size_t e = 0; e < x.size(); ++e) {
    double one = x[e];
    ExpInPlace(&one, 1);
    if (std::isnan(one)) {
      ASSERT_TRUE(std::isnan(blocked[e])) << x[e];
    } else {
      ASSERT_EQ(blocked[e], one) << "exp(" << x[e] << ")";
    }
  }
}

// Forward row kernel: the same values as subtracting the shift and calling ExpInPlace, and
// a sum within Sum2's bound of the exact sum, for every length across the lane structure.
TEST(OracleKernelsTest, ExpShiftSumMatchesExpInPlaceAndSumsWithinSum2Bound) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 6.0);
  for (int64_t n = 0; n <= 70; ++n) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<double> x(static_cast<size_t>(n));
      for (double& v : x) v = rng() % 5 == 0 ? -kInf : normal(rng);
      const double shift = n > 0 ? *std::max_element(x.begin(), x.end()) : 0.0;
      const double m = std::isinf(shift) ? 0.0 : shift;
      std::vector<double> want = x;
      for (double& v : want) v -= m;
      ExpInPlace(want.data(), n);
      std::vector<double> src = x, got(x.size(), -1.0);
      const CompensatedSum s = ExpShiftSum(src.data(), got.data(), n, m);
      for (int64_t e = 0; e < n; ++e) {
        ASSERT_EQ(got[static_cast<size_t>(e)], want[static_cast<size_t>(e)]) << n << " " << e;
      }
      ASSERT_TRUE(std::equal(src.begin(), src.end(), x.begin(), [](double a, double b) {
        return a == b || (std::isnan(a) && std::isnan(b));
      })) << "the scores are kept for the backward";
      Mp256 exact = 0;
      double abs_sum = 0;
      for (double v : want) exact += Mp256(v), abs_sum += v;
      const double err = std::abs(static_cast<double>(Mp256(s.sum) + Mp256(s.comp) - exact));
      // Sum2 (terms >= 0): u |sum| + gamma_{n-1}^2 sum |x|, plus the final addition.
      const double g = double(n) * kU / (1 - double(n) * kU);
      EXPECT_LE(err, 2 * kU * abs_sum + g * g * abs_sum) << n;
    }
  }
  // Sums of huge cancellation-free dynamic range: the compensation must carry what plain
  // summation loses (1 + many terms below half an ulp of 1).
  std::vector<double> x(1001, std::log(0x1p-60));
  x[0] = 0.0;
  std::vector<double> p(x.size());
  const CompensatedSum s = ExpShiftSum(x.data(), p.data(), 1001, 0.0);
  const Mp256 exact = Mp256(1) + 1000 * Mp256(p[1]);
  EXPECT_LE(std::abs(static_cast<double>(Mp256(s.sum) + Mp256(s.comp) - exact)), 2 * kU);
  EXPECT_GT(s.comp, 0.0);  // plain summation would have returned exactly 1
}

// Backward row kernel: bitwise the plain sequence of the same operations.
TEST(OracleKernelsTest, BackwardRowMatchesPlainLoops) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (int64_t n = 0; n <= 40; ++n) {
    std::vector<double> s(static_cast<size_t>(n)), dp(s.size()), mass(s.size());
    std::vector<int64_t> seen(s.size());
    for (size_t e = 0; e < s.size(); ++e) {
      s[e] = rng() % 4 == 0 ? -kInf : normal(rng);
      dp[e] = normal(rng);
      mass[e] = std::abs(normal(rng));
      seen[e] = static_cast<int64_t>(rng() % 3);
    }
    const double lse = 2.5, delta = 0.375;
    auto ws = s, wdp = dp, wmass = mass;
    auto wseen = seen;
    for (size_t e = 0; e < s.size(); ++e) {
      wseen[e] += ws[e] != -kInf;
      ws[e] -= lse;
    }
    ExpInPlace(ws.data(), n);
    for (size_t e = 0; e < s.size(); ++e) {
      wdp[e] = ws[e] * (wdp[e] - delta);
      wmass[e] += ws[e];
    }
    const std::vector<double> s_in = s;
    std::vector<double> p(s.size(), -1.0);
    BackwardRow(s.data(), p.data(), dp.data(), n, lse, delta, mass.data(), seen.data());
    ASSERT_TRUE(s == s_in) << "the scores are kept";
    for (size_t e = 0; e < s.size(); ++e) {
      ASSERT_EQ(p[e], ws[e]) << n << " " << e;
      ASSERT_EQ(dp[e], wdp[e]) << n << " " << e;
      ASSERT_EQ(mass[e], wmass[e]) << n << " " << e;
      ASSERT_EQ(seen[e], wseen[e]) << n << " " << e;
    }
  }
}

// Row statistics: count, max and norm max over the visible entries, NaN ignored by the max
// as std::max does, every length across the lane structure.
TEST(OracleKernelsTest, RowStatsMatchesAPlainLoop) {
  std::mt19937_64 rng(13);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (int64_t n = 0; n <= 40; ++n) {
    for (int rep = 0; rep < 10; ++rep) {
      std::vector<double> x(static_cast<size_t>(n)), w(x.size());
      for (size_t e = 0; e < x.size(); ++e) {
        const uint64_t r = rng() % 10;
        x[e] = r < 3 ? -kInf : r == 3 && rep == 9 ? std::nan("") : normal(rng);
        w[e] = std::abs(normal(rng));
      }
      int64_t want_n = 0;
      double want_max = -kInf, want_w = 0;
      for (size_t e = 0; e < x.size(); ++e) {
        if (x[e] == -kInf) continue;
        ++want_n;
        want_max = std::max(want_max, x[e]);
        want_w = std::max(want_w, w[e]);
      }
      double got_max = 0, got_w = -1;
      EXPECT_EQ(RowStats(x.data(), w.data(), n, &got_max, &got_w), want_n) << n;
      EXPECT_EQ(got_max, want_max) << n;
      EXPECT_EQ(got_w, want_w) << n;
    }
  }
}

}  // namespace
}  // namespace attest::oracle_internal
