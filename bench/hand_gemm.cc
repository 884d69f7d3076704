// The baseline of the Highway evaluation (bench/README.md "Highway"): the oracle's panel
// product as it was before reference/oracle/oracle_gemm.cc took the Highway micro-kernel: the
// same blocking driver with micro-kernels hand-written with AVX-512 and AVX2 intrinsics
// (`__attribute__((target(...)))`, picked by name). bench/hwy_gemm_bench.cc runs it beside the
// oracle's and checks that both give the same bits.
#include "bench/hand_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTEST_GEMM_X86 1
#include <immintrin.h>
#else
#define ATTEST_GEMM_X86 0
#endif

namespace attest::hand_gemm {
namespace {
using oracle_internal::kGemmKc;
using oracle_internal::kPanelWidth;
using oracle_internal::PanelCount;
using oracle_internal::Panels;

// What a micro-kernel call does with its MR x kPanelWidth block of C (rows of the block,
// columns [0, nvalid) of the panel): x = first ? t : C + t; C = scale ? alpha x : x.
struct Epilogue {
  bool first = false;  // the first k block of an overwriting product
  bool scale = false;  // the last k block of an overwriting product with alpha != 1
  double alpha = 1.0;
};

// The portable micro-kernel: the rounding sequence every other version reproduces.
void MicroPortable(int mr, int64_t kc, const double* a, int64_t a_rs, int64_t a_cs, const double* b,
                   double* c, int64_t ldc, int nvalid, Epilogue e) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < nvalid; ++j) {
      double t = 0.0;
      for (int64_t l = 0; l < kc; ++l) {
        t = std::fma(a[r * a_rs + l * a_cs], b[l * kPanelWidth + j], t);
      }
      double& cj = c[r * ldc + j];
      double x = e.first ? t : cj + t;
      if (e.scale) x = e.alpha * x;
      cj = x;
    }
  }
}

#if ATTEST_GEMM_X86
// AVX-512: MR rows x 32 columns = 4 MR zmm accumulators (24 for MR = 6), the panel row in
// 4 zmm, one broadcast: 29 of the 32 registers.
template <int MR>
__attribute__((target("avx512f,fma"))) void Micro512(int64_t kc, const double* a, int64_t a_rs,
                                                     int64_t a_cs, const double* b, double* c,
                                                     int64_t ldc, int nvalid, Epilogue e) {
  __m512d t[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) t[r][v] = _mm512_setzero_pd();
  }
  for (int64_t l = 0; l < kc; ++l) {
    const double* bl = b + l * kPanelWidth;
    const __m512d b0 = _mm512_loadu_pd(bl), b1 = _mm512_loadu_pd(bl + 8),
                  b2 = _mm512_loadu_pd(bl + 16), b3 = _mm512_loadu_pd(bl + 24);
    const double* al = a + l * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512d x = _mm512_set1_pd(al[r * a_rs]);
      t[r][0] = _mm512_fmadd_pd(x, b0, t[r][0]);
      t[r][1] = _mm512_fmadd_pd(x, b1, t[r][1]);
      t[r][2] = _mm512_fmadd_pd(x, b2, t[r][2]);
      t[r][3] = _mm512_fmadd_pd(x, b3, t[r][3]);
    }
  }
  __mmask8 mask[4];
  for (int v = 0; v < 4; ++v) {
    const int cnt = std::clamp(nvalid - 8 * v, 0, 8);
    mask[v] = static_cast<__mmask8>((1u << cnt) - 1u);
  }
  const __m512d alpha = _mm512_set1_pd(e.alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      if (mask[v] == 0) continue;
      double* cp = c + r * ldc + 8 * v;
      __m512d x = e.first ? t[r][v] : _mm512_add_pd(_mm512_maskz_loadu_pd(mask[v], cp), t[r][v]);
      if (e.scale) x = _mm512_mul_pd(alpha, x);
      _mm512_mask_storeu_pd(cp, mask[v], x);
    }
  }
}

// AVX2: MR rows x 8 columns per pass (12 ymm accumulators for MR = 6, two for the panel
// row, one broadcast), four passes per panel. Partial columns are loaded and stored with
// masks (vmaskmovpd), and every loop over the accumulators is unrolled so that they stay in
// registers.
template <int MR>
__attribute__((target("avx2,fma"))) void Micro256(int64_t kc, const double* a, int64_t a_rs,
                                                  int64_t a_cs, const double* b, double* c,
                                                  int64_t ldc, int nvalid, Epilogue e) {
  const __m256d alpha = _mm256_set1_pd(e.alpha);
  for (int j0 = 0; j0 < nvalid; j0 += 8) {
    __m256d t[MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) t[r][0] = t[r][1] = _mm256_setzero_pd();
    for (int64_t l = 0; l < kc; ++l) {
      const double* bl = b + l * kPanelWidth + j0;
      const __m256d b0 = _mm256_loadu_pd(bl), b1 = _mm256_loadu_pd(bl + 4);
      const double* al = a + l * a_cs;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256d x = _mm256_broadcast_sd(al + r * a_rs);
        t[r][0] = _mm256_fmadd_pd(x, b0, t[r][0]);
        t[r][1] = _mm256_fmadd_pd(x, b1, t[r][1]);
      }
    }
    // Lane masks for columns j0 .. j0 + 7 (all-ones high bit = active).
    const int cnt = std::min(8, nvalid - j0);
    const __m256i lanes0 = _mm256_setr_epi64x(0, 1, 2, 3), lanes1 = _mm256_setr_epi64x(4, 5, 6, 7);
    const __m256i limit = _mm256_set1_epi64x(cnt);
    const __m256i m0 = _mm256_cmpgt_epi64(limit, lanes0), m1 = _mm256_cmpgt_epi64(limit, lanes1);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      double* cp = c + r * ldc + j0;
      __m256d x0 = t[r][0], x1 = t[r][1];
      if (!e.first) {
        x0 = _mm256_add_pd(_mm256_maskload_pd(cp, m0), x0);
        x1 = _mm256_add_pd(_mm256_maskload_pd(cp + 4, m1), x1);
      }
      if (e.scale) {
        x0 = _mm256_mul_pd(alpha, x0);
        x1 = _mm256_mul_pd(alpha, x1);
      }
      _mm256_maskstore_pd(cp, m0, x0);
      _mm256_maskstore_pd(cp + 4, m1, x1);
    }
  }
}
#endif

using MicroFn = void (*)(int64_t, const double*, int64_t, int64_t, const double*, double*, int64_t,
                         int, Epilogue);

struct Isa {
  const char* name;
  int mr;            // rows per micro-kernel call (0: the portable kernel, any rows)
  MicroFn micro[7];  // micro[r]: r rows, 1 <= r <= mr
};

const Isa& Portable() {
  static const Isa isa{"portable", 0, {}};
  return isa;
}

#if ATTEST_GEMM_X86
const Isa& Avx512() {
  static const Isa isa{
      "avx512",
      6,
      {nullptr, Micro512<1>, Micro512<2>, Micro512<3>, Micro512<4>, Micro512<5>, Micro512<6>}};
  return isa;
}
const Isa& Avx2() {
  static const Isa isa{
      "avx2",
      6,
      {nullptr, Micro256<1>, Micro256<2>, Micro256<3>, Micro256<4>, Micro256<5>, Micro256<6>}};
  return isa;
}
#endif

// The version called `name` if this machine runs it, else nullptr.
const Isa* Named(std::string_view name) {
  if (name == "portable") return &Portable();
#if ATTEST_GEMM_X86
  __builtin_cpu_init();
  if (name == "avx512" && __builtin_cpu_supports("avx512f")) return &Avx512();
  if (name == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return &Avx2();
  }
#endif
  return nullptr;
}

void Drive(const Isa& isa, int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs,
           int64_t a_cs, Panels b, double alpha, bool accumulate, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0);
    }
    return;
  }
  for (int64_t kb = 0; kb < k; kb += kGemmKc) {
    const int64_t kc = std::min(kGemmKc, k - kb);
    Epilogue e;
    e.first = kb == 0 && !accumulate;
    e.scale = kb + kc >= k && !accumulate && alpha != 1.0;
    e.alpha = alpha;
    for (int64_t p = 0; p < PanelCount(n); ++p) {
      const int nvalid = static_cast<int>(std::min(kPanelWidth, n - p * kPanelWidth));
      const double* bp = b.data + p * b.panel_stride + kb * kPanelWidth;
      double* cp = c + p * kPanelWidth;
      const double* ap = a + kb * a_cs;
      if (isa.mr == 0) {
        MicroPortable(static_cast<int>(m), kc, ap, a_rs, a_cs, bp, cp, ldc, nvalid, e);
        continue;
      }
      for (int64_t i0 = 0; i0 < m; i0 += isa.mr) {
        const int rows = static_cast<int>(std::min<int64_t>(isa.mr, m - i0));
        isa.micro[rows](kc, ap + i0 * a_rs, a_rs, a_cs, bp, cp + i0 * ldc, ldc, nvalid, e);
      }
    }
  }
}

}  // namespace

bool GemmPanelsOn(const char* isa, int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs,
                  int64_t a_cs, Panels b, double alpha, bool accumulate, double* c, int64_t ldc) {
  const Isa* chosen = Named(isa);
  if (chosen == nullptr) return false;
  Drive(*chosen, m, n, k, a, a_rs, a_cs, b, alpha, accumulate, c, ldc);
  return true;
}

}  // namespace attest::hand_gemm
