// Tests of the RDNA3 WMMA fragment layout the example HIP kernel uses (hip_wmma.h) against
// the CPU model of the instruction (hip_wmma_emulate.h, which states the hardware layout on
// its own): a 16x16x16 f16 -> f32 product assembled lane by lane must equal the plain matrix
// product, exactly (integer-valued inputs, so no summation order can change a bit).
#include "kernels/plugin/examples/hip_wmma.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <utility>

#include "kernels/plugin/examples/hip_wmma_emulate.h"

namespace attest::wmma {
namespace {

TEST(HipWmmaLayout, EveryAccumulatorElementHasExactlyOneOwner) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < kWave; ++lane) {
    for (int r = 0; r < kAccPerLane; ++r) {
      const int m = CRow(lane, r), n = CCol(lane);
      ASSERT_TRUE(m >= 0 && m < kTile && n >= 0 && n < kTile) << lane << " " << r;
      EXPECT_TRUE(seen.insert({m, n}).second) << "(" << m << ", " << n << ") twice";
    }
  }
  EXPECT_EQ(seen.size(), size_t{kTile * kTile});
  // A and B: the two half-waves supply the same rows / columns (the replication rule).
  for (int lane = 0; lane < kTile; ++lane) {
    EXPECT_EQ(ARow(lane), ARow(lane + kTile));
    EXPECT_EQ(BCol(lane), BCol(lane + kTile));
  }
}

// Fragments of row-major 16x16 matrices, loaded the way the kernel loads them.
void LoadA(const double (&m)[kTile][kTile], WaveA& a) {
  for (int lane = 0; lane < kWave; ++lane) {
    for (int e = 0; e < kTile; ++e) a[lane][e] = static_cast<_Float16>(m[ARow(lane)][e]);
  }
}
void LoadB(const double (&m)[kTile][kTile], WaveA& b) {
  for (int lane = 0; lane < kWave; ++lane) {
    for (int e = 0; e < kTile; ++e) b[lane][e] = static_cast<_Float16>(m[e][BCol(lane)]);
  }
}

TEST(HipWmmaLayout, TheTileProductIsTheMatrixProduct) {
  std::mt19937 rng(20261202);
  std::uniform_int_distribution<int> small(-8, 8), acc(-1000, 1000);
  for (int trial = 0; trial < 50; ++trial) {
    double a[kTile][kTile], b[kTile][kTile], c[kTile][kTile];
    for (int i = 0; i < kTile; ++i) {
      for (int j = 0; j < kTile; ++j) {
        a[i][j] = small(rng);
        b[i][j] = small(rng);
        c[i][j] = acc(rng);
      }
    }
    WaveA fa, fb;
    LoadA(a, fa);
    LoadB(b, fb);
    WaveAcc fc;
    for (int lane = 0; lane < kWave; ++lane) {
      for (int r = 0; r < kAccPerLane; ++r) {
        fc[lane][r] = static_cast<float>(c[CRow(lane, r)][CCol(lane)]);
      }
    }
    std::string why;
    ASSERT_TRUE(EmulateWmmaF32F16(fa, fb, fc, &why)) << why;
    for (int lane = 0; lane < kWave; ++lane) {
      for (int r = 0; r < kAccPerLane; ++r) {
        const int m = CRow(lane, r), n = CCol(lane);
        double want = c[m][n];
        for (int k = 0; k < kTile; ++k) want += a[m][k] * b[k][n];
        ASSERT_EQ(fc[lane][r], static_cast<float>(want))
            << "trial " << trial << " lane " << lane << " element " << r << " = D[" << m
            << "][" << n << "]";
      }
    }
  }
}

// One non-zero per matrix pins the layout down completely: A = e_(m0,k0), B = e_(k0,n0)
// gives D = e_(m0,n0), so exactly one lane and element may hold a 1.
TEST(HipWmmaLayout, AUnitProductLandsInTheOwningLaneAndElement) {
  for (int m0 = 0; m0 < kTile; ++m0) {
    for (int n0 = 0; n0 < kTile; n0 += 5) {
      const int k0 = (m0 * 7 + n0) % kTile;
      double a[kTile][kTile] = {}, b[kTile][kTile] = {};
      a[m0][k0] = 1;
      b[k0][n0] = 1;
      WaveA fa, fb;
      LoadA(a, fa);
      LoadB(b, fb);
      WaveAcc fc{};
      std::string why;
      ASSERT_TRUE(EmulateWmmaF32F16(fa, fb, fc, &why)) << why;
      for (int lane = 0; lane < kWave; ++lane) {
        for (int r = 0; r < kAccPerLane; ++r) {
          const bool owner = CRow(lane, r) == m0 && CCol(lane) == n0;
          ASSERT_EQ(fc[lane][r], owner ? 1.0f : 0.0f) << m0 << " " << n0 << " " << lane;
        }
      }
    }
  }
}

TEST(HipWmmaLayout, FragmentsThatAreNotReplicatedAreRefused) {
  double a[kTile][kTile] = {}, b[kTile][kTile] = {};
  WaveA fa, fb;
  LoadA(a, fa);
  LoadB(b, fb);
  WaveAcc fc{};
  std::string why;
  fa[20][3] = static_cast<_Float16>(1.0f);
  EXPECT_FALSE(EmulateWmmaF32F16(fa, fb, fc, &why));
  EXPECT_EQ(why, "A fragment element 3 differs between lanes 4 and 20");
  fa[20][3] = static_cast<_Float16>(0.0f);
  fb[1][15] = static_cast<_Float16>(2.0f);
  EXPECT_FALSE(EmulateWmmaF32F16(fa, fb, fc, &why));
  EXPECT_EQ(why, "B fragment element 15 differs between lanes 1 and 17");
}

}  // namespace
}  // namespace attest::wmma
