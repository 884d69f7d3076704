// A CPU model of one RDNA3 wave32 v_wmma_f32_16x16x16_f16 (layout in hip_wmma.h), used to
// run the example HIP kernel's own index math on the host (tests and the emulated plugin).
//
// Arithmetic: every f16 x f16 product is exact in f32 (11 + 11 significant bits <= 24); the
// order and the intermediate rounding of the hardware's 16-term sum are not documented, so
// the model sums in double and rounds once to f32. Tests that check the layout use integer
// values whose sums are exact, where any order gives the same bits.
#pragma once

#include <array>
#include <string>

#include "kernels/plugin/examples/hip_wmma.h"

namespace attest::wmma {

using WaveA = std::array<Half16, kWave>;
using WaveAcc = std::array<Float8, kWave>;

// c = a x b + c over one wave. Returns false (and says which lane and element in `why`) if
// the two half-waves disagree on an A or B element: that kernel would be wrong on hardware.
inline bool EmulateWmmaF32F16(const WaveA& a, const WaveA& b, WaveAcc& c, std::string* why) {
  for (int lane = 0; lane < kTile; ++lane) {
    for (int e = 0; e < kTile; ++e) {
      // Compared as bits (a NaN must be replicated as well).
      const bool same_a = __builtin_memcmp(&a[lane][e], &a[lane + kTile][e], 2) == 0;
      const bool same_b = __builtin_memcmp(&b[lane][e], &b[lane + kTile][e], 2) == 0;
      if (!same_a || !same_b) {
        if (why) {
          *why = std::string(same_a ? "B" : "A") + " fragment element " + std::to_string(e) +
                 " differs between lanes " + std::to_string(lane) + " and " +
                 std::to_string(lane + kTile);
        }
        return false;
      }
    }
  }
  // The hardware's layout, spelled out here on purpose rather than through hip_wmma.h's
  // ARow/BCol/CRow/CCol, so that a wrong layout function in the kernel cannot agree with
  // itself in the tests (RDNA3 ISA section 7.9; lanes 16..31 of A and B are the replicas):
  //   A[m][k] = lane m, element k;  B[k][n] = lane n, element k;
  //   C[m][n] = D[m][n] = lane n + 16 * (m % 2), element m / 2.
  double am[kTile][kTile], bm[kTile][kTile], cm[kTile][kTile];
  for (int i = 0; i < kTile; ++i) {
    for (int k = 0; k < kTile; ++k) {
      am[i][k] = static_cast<double>(a[i][k]);
      bm[k][i] = static_cast<double>(b[i][k]);
    }
  }
  for (int m = 0; m < kTile; ++m) {
    for (int n = 0; n < kTile; ++n) cm[m][n] = c[n + kTile * (m % 2)][m / 2];
  }
  for (int m = 0; m < kTile; ++m) {
    for (int n = 0; n < kTile; ++n) {
      double sum = cm[m][n];
      for (int k = 0; k < kTile; ++k) sum += am[m][k] * bm[k][n];
      c[n + kTile * (m % 2)][m / 2] = static_cast<float>(sum);
    }
  }
  return true;
}

}  // namespace attest::wmma
