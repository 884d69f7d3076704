// Tests of the oracle's panel matrix product (oracle_gemm.h): every ISA version bitwise
// against the portable loop, the portable loop bitwise against an FMA chain written here
// (the rounding sequence the header promises), and all of them against an outside
// implementation (OpenBLAS dgemm) within the dot-product bound gamma_k sum |a_il b_lj|; on
// random shapes that cover every micro-kernel row count, partial panels, k blocks, strided
// and transposed A, overwrite with a scale, accumulation, and k = 0.
#include "reference/oracle/oracle_gemm.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace attest::oracle_internal {
namespace {

struct Case {
  int64_t m, n, k;
  bool trans_a, accumulate;
  double alpha;
};

struct Operands {
  std::vector<double> a, b, c0, panels;
  int64_t a_rs, a_cs;
};

Operands Make(const Case& t, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  Operands r;
  r.a.resize(static_cast<size_t>(std::max<int64_t>(1, t.m * t.k)));
  r.b.resize(static_cast<size_t>(std::max<int64_t>(1, t.k * t.n)));
  r.c0.resize(static_cast<size_t>(t.m * t.n));
  for (double& x : r.a) x = normal(rng);
  for (double& x : r.b) x = normal(rng);
  for (double& x : r.c0) x = normal(rng);
  // A (m x k) stored row-major, or as its transpose (k x m) read through the strides.
  r.a_rs = t.trans_a ? 1 : t.k;
  r.a_cs = t.trans_a ? t.m : 1;
  r.panels.assign(static_cast<size_t>(std::max<int64_t>(1, PanelCount(t.n) * t.k * kPanelWidth)),
                  -1.0);
  PackPanels(r.b.data(), t.k, t.n, t.n, 1, r.panels.data());
  return r;
}

std::vector<double> RunOn(const char* isa, const Case& t, const Operands& r, bool* ran) {
  std::vector<double> c = r.c0;
  *ran = GemmPanelsOn(isa, t.m, t.n, t.k, r.a.data(), r.a_rs, r.a_cs,
                      {r.panels.data(), t.k * kPanelWidth}, t.alpha, t.accumulate, c.data(), t.n);
  return c;
}

std::vector<Case> RandomCases(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i) {
    Case t;
    t.m = 1 + static_cast<int64_t>(rng() % 40);
    t.n = 1 + static_cast<int64_t>(rng() % 100);
    t.k = static_cast<int64_t>(rng() % 300);
    t.trans_a = rng() % 2 == 1;
    t.accumulate = rng() % 2 == 1;
    t.alpha = t.accumulate ? 1.0 : (rng() % 2 ? 0.125 : -0.3);
    cases.push_back(t);
  }
  // Fixed shapes of the oracle's tiles (256 x 128 x 512 and friends) and exact edges.
  cases.push_back({256, 128, 512, false, true, 1.0});
  cases.push_back({512, 128, 256, true, true, 1.0});
  cases.push_back({256, 512, 128, false, false, 0.08838834764831845});
  cases.push_back({6, 32, 128, false, false, 1.0});
  cases.push_back({7, 33, 129, true, false, 2.0});
  cases.push_back({5, 31, 0, false, false, 3.0});
  cases.push_back({5, 31, 0, false, true, 1.0});
  return cases;
}

TEST(OracleGemmTest, PortableLoopIsTheDocumentedFmaChain) {
  std::mt19937_64 rng(11);
  for (const Case& t : RandomCases(60, 1)) {
    const Operands r = Make(t, rng);
    bool ran = false;
    const std::vector<double> c = RunOn("portable", t, r, &ran);
    ASSERT_TRUE(ran);
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < t.n; ++j) {
        double x = t.accumulate ? r.c0[static_cast<size_t>(i * t.n + j)] : 0.0;
        for (int64_t kb = 0; kb < t.k; kb += kGemmKc) {
          double part = 0.0;
          for (int64_t l = kb; l < std::min(t.k, kb + kGemmKc); ++l) {
            part = std::fma(r.a[static_cast<size_t>(i * r.a_rs + l * r.a_cs)],
                            r.b[static_cast<size_t>(l * t.n + j)], part);
          }
          x = (kb == 0 && !t.accumulate) ? part : x + part;
        }
        if (!t.accumulate && t.alpha != 1.0) x = t.alpha * x;
        ASSERT_EQ(c[static_cast<size_t>(i * t.n + j)], x)
            << "m" << t.m << " n" << t.n << " k" << t.k << " at " << i << "," << j;
      }
    }
  }
}

TEST(OracleGemmTest, EveryIsaGivesThePortableBits) {
  std::printf("GemmPanels runs the %s version on this machine\n", GemmPanelsIsa());
  std::mt19937_64 rng(12);
  int tried = 0;
  for (const Case& t : RandomCases(300, 2)) {
    const Operands r = Make(t, rng);
    bool ran = false;
    const std::vector<double> ref = RunOn("portable", t, r, &ran);
    for (const char* isa : {"avx512", "avx2"}) {
      const std::vector<double> c = RunOn(isa, t, r, &ran);
      if (!ran) continue;
      ++tried;
      for (size_t e = 0; e < c.size(); ++e) {
        ASSERT_EQ(c[e], ref[e]) << isa << " m" << t.m << " n" << t.n << " k" << t.k << " trans_a "
                                << t.trans_a << " element " << e;
      }
    }
    // The default version too (whichever this machine picked).
    std::vector<double> c = r.c0;
    GemmPanels(t.m, t.n, t.k, r.a.data(), r.a_rs, r.a_cs, {r.panels.data(), t.k * kPanelWidth},
               t.alpha, t.accumulate, c.data(), t.n);
    ASSERT_EQ(c, ref);
  }
  std::printf("%d ISA runs compared bitwise with the portable loop\n", tried);
}

TEST(OracleGemmTest, AgreesWithOpenBlasWithinTheDotProductBound) {
  std::mt19937_64 rng(13);
  double worst = 0;
  for (const Case& t : RandomCases(200, 3)) {
    const Operands r = Make(t, rng);
    std::vector<double> c = r.c0;
    GemmPanels(t.m, t.n, t.k, r.a.data(), r.a_rs, r.a_cs, {r.panels.data(), t.k * kPanelWidth},
               t.alpha, t.accumulate, c.data(), t.n);
    std::vector<double> blas = r.c0;
    if (t.k > 0) {
      cblas_dgemm(CblasRowMajor, t.trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans,
                  static_cast<int>(t.m), static_cast<int>(t.n), static_cast<int>(t.k), t.alpha,
                  r.a.data(), static_cast<int>(t.trans_a ? t.m : t.k), r.b.data(),
                  static_cast<int>(t.n), t.accumulate ? 1.0 : 0.0, blas.data(),
                  static_cast<int>(t.n));
    } else if (!t.accumulate) {
      std::fill(blas.begin(), blas.end(), 0.0);
    }
    // Both are within gamma_(k+1) |alpha| (|C| + sum |a b|) of the exact value.
    const double u = 0x1p-53;
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < t.n; ++j) {
        double mag = t.accumulate ? std::abs(r.c0[static_cast<size_t>(i * t.n + j)]) : 0.0;
        for (int64_t l = 0; l < t.k; ++l) {
          mag += std::abs(r.a[static_cast<size_t>(i * r.a_rs + l * r.a_cs)] *
                          r.b[static_cast<size_t>(l * t.n + j)]);
        }
        const double bound = 2 * (t.k + 2) * u * std::abs(t.alpha) * mag;
        const double diff =
            std::abs(c[static_cast<size_t>(i * t.n + j)] - blas[static_cast<size_t>(i * t.n + j)]);
        ASSERT_LE(diff, bound) << "m" << t.m << " n" << t.n << " k" << t.k;
        if (bound > 0) worst = std::max(worst, diff / bound);
      }
    }
  }
  std::printf("largest |ours - OpenBLAS| / bound: %.3g\n", worst);
}

TEST(OracleGemmTest, PanelsPadWithZerosAndViewRows) {
  // 3 x 70 matrix: three panels, the last with 6 columns and 26 zero columns.
  std::vector<double> src(3 * 70);
  for (size_t e = 0; e < src.size(); ++e) src[e] = static_cast<double>(e + 1);
  std::vector<double> dst(static_cast<size_t>(PanelCount(70) * 3 * kPanelWidth), -1.0);
  PackPanels(src.data(), 3, 70, 70, 1, dst.data());
  const Panels p{dst.data(), 3 * kPanelWidth};
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 96; ++c) {
      const double want = c < 70 ? src[static_cast<size_t>(r * 70 + c)] : 0.0;
      EXPECT_EQ(p.data[(c / kPanelWidth) * p.panel_stride + r * kPanelWidth + c % kPanelWidth],
                want);
    }
  }
  EXPECT_EQ(p.Rows(2).data[0], src[2 * 70]);
  // Transposed packing reads columns through the stride.
  std::vector<double> dt(static_cast<size_t>(PanelCount(3) * 70 * kPanelWidth));
  PackPanels(src.data(), 70, 3, 1, 70, dt.data());
  EXPECT_EQ(dt[5 * kPanelWidth + 2], src[2 * 70 + 5]);
}

}  // namespace
}  // namespace attest::oracle_internal
