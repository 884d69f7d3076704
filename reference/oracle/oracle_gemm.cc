// The oracle's panel matrix product (oracle_gemm.h): one blocking driver, a portable
// micro-kernel that writes the rounding sequence out with std::fma, and one vector
// micro-kernel written with Highway (github.com/google/highway, hwy/highway.h) that performs the
// same roundings. hwy/foreach_target.h compiles this file once per target (AVX2 and AVX-512 on
// x86-64; NEON and SVE/SVE2 on aarch64) and HWY_DYNAMIC_DISPATCH picks the best one the CPU
// runs, once, at the first product (google/highway g3doc/quick_reference.md, "Dynamic
// dispatch"). bench/README.md "Highway" has the evaluation against the hand-written AVX-512 and
// AVX2 kernels this replaced (bench/hand_gemm.cc): the same bits, within 5 % of their rate.
#include "reference/oracle/oracle_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

// SSSE3 and SSE4 have no FMA (Highway's MulAdd is a multiply and an add there), so their kernel
// would round differently: not compiled; such CPUs get the portable kernel, as does Highway's
// scalar fallback (IsaHere below).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reference/oracle/oracle_gemm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Shared by every target's pass over this file: defined once.
#ifndef ATTEST_ORACLE_GEMM_TYPES
#define ATTEST_ORACLE_GEMM_TYPES
namespace attest::oracle_internal::gemm {

// What a micro-kernel call does with its MR x kPanelWidth block of C (rows of the block,
// columns [0, nvalid) of the panel): x = first ? t : C + t; C = scale ? alpha x : x.
struct Epilogue {
  bool first = false;  // the first k block of an overwriting product
  bool scale = false;  // the last k block of an overwriting product with alpha != 1
  double alpha = 1.0;
};

using MicroFn = void (*)(int64_t, const double*, int64_t, int64_t, const double*, double*, int64_t,
                         int, Epilogue);

constexpr int kRows = 6;  // rows of C per vector micro-kernel call

struct Isa {
  const char* name = "portable";
  int mr = 0;                       // rows per micro-kernel call (0: the portable kernel)
  MicroFn micro[kRows + 1] = {};    // micro[r]: r rows, 1 <= r <= mr
};

}  // namespace attest::oracle_internal::gemm
#endif  // ATTEST_ORACLE_GEMM_TYPES

HWY_BEFORE_NAMESPACE();
namespace attest::oracle_internal::gemm {
namespace HWY_NAMESPACE {

// The targets whose MulAdd is one fused multiply-add.
#if HWY_HAVE_FLOAT64 &&                                                                \
    (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2 || \
     HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 ||     \
     HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128)
namespace hn = hwy::HWY_NAMESPACE;

// At most 8 doubles per vector (one AVX-512 register): a pass of kVectors vectors then spans
// 8, 16 or 32 columns, which divides the 32-column panel on every target, SVE of any vector
// length included (Highway's SVE vectors hold a power of two of lanes).
using D = hn::CappedTag<double, 8>;
using V = hn::Vec<D>;

// Vectors per row of the accumulator block. AVX-512, NEON and SVE have 32 vector registers:
// 6 rows x 4 vectors = 24 accumulators, 4 for the panel row, 1 broadcast (AVX-512: 6 x 32, one
// pass per panel). AVX2 has 16: 6 x 2 = 12 accumulators, 2 for the panel row, 1 broadcast
// (6 x 8, four passes per panel).
#if HWY_TARGET == HWY_AVX2
constexpr int kVectors = 2;
#else
constexpr int kVectors = 4;
#endif

// One vector of C: `cnt` valid lanes (0: none), selected by m.
HWY_INLINE void StoreC(D d, const Epilogue& e, V alpha, int cnt, hn::Mask<D> m, double* cp, V t) {
  if (cnt == 0) return;
  V x = t;
  if (!e.first) x = hn::Add(hn::MaskedLoad(m, d, cp), t);
  if (e.scale) x = hn::Mul(alpha, x);
  hn::BlendedStore(x, m, d, cp);
}

// MR rows x (kVectors x Lanes) columns per pass, passes over the panel's valid columns. SVE's
// vectors are sizeless (no arrays of them), so the accumulators are named: t<row><vector>;
// rows >= MR and vectors >= kVectors are never touched and the compiler drops them.
// Per k: the panel row is loaded once and each of the MR entries of A is broadcast and
// multiplied into it by FMA, so every element of C sees oracle_gemm.h's FMA chain.
template <int MR>
HWY_NOINLINE void Micro(int64_t kc, const double* a, int64_t a_rs, int64_t a_cs, const double* b,
                        double* c, int64_t ldc, int nvalid, Epilogue e) {
  const D d;
  const int n = static_cast<int>(hn::Lanes(d));
  const V alpha = hn::Set(d, e.alpha);
  for (int j0 = 0; j0 < nvalid; j0 += kVectors * n) {
#define ATTEST_ACC(r) \
  V t##r##0 = hn::Zero(d), t##r##1 = hn::Zero(d), t##r##2 = hn::Zero(d), t##r##3 = hn::Zero(d)
    ATTEST_ACC(0);
    ATTEST_ACC(1);
    ATTEST_ACC(2);
    ATTEST_ACC(3);
    ATTEST_ACC(4);
    ATTEST_ACC(5);
#undef ATTEST_ACC
    for (int64_t l = 0; l < kc; ++l) {
      const double* bl = b + l * kPanelWidth + j0;
      const V b0 = hn::LoadU(d, bl), b1 = hn::LoadU(d, bl + n);
      V b2 = b0, b3 = b0;
      if constexpr (kVectors > 2) {
        b2 = hn::LoadU(d, bl + 2 * n);
        b3 = hn::LoadU(d, bl + 3 * n);
      }
      const double* al = a + l * a_cs;
#define ATTEST_FMA(r)                           \
  if constexpr (MR > r) {                       \
    const V x = hn::Set(d, al[r * a_rs]);       \
    t##r##0 = hn::MulAdd(x, b0, t##r##0);       \
    t##r##1 = hn::MulAdd(x, b1, t##r##1);       \
    if constexpr (kVectors > 2) {               \
      t##r##2 = hn::MulAdd(x, b2, t##r##2);     \
      t##r##3 = hn::MulAdd(x, b3, t##r##3);     \
    }                                           \
  }
      ATTEST_FMA(0)
      ATTEST_FMA(1)
      ATTEST_FMA(2)
      ATTEST_FMA(3)
      ATTEST_FMA(4)
      ATTEST_FMA(5)
#undef ATTEST_FMA
    }
    const int c0 = std::clamp(nvalid - j0, 0, n), c1 = std::clamp(nvalid - j0 - n, 0, n),
              c2 = std::clamp(nvalid - j0 - 2 * n, 0, n),
              c3 = std::clamp(nvalid - j0 - 3 * n, 0, n);
    const auto m0 = hn::FirstN(d, static_cast<size_t>(c0)),
               m1 = hn::FirstN(d, static_cast<size_t>(c1)),
               m2 = hn::FirstN(d, static_cast<size_t>(c2)),
               m3 = hn::FirstN(d, static_cast<size_t>(c3));
#define ATTEST_STORE(r)                                          \
  if constexpr (MR > r) {                                        \
    double* cp = c + r * ldc + j0;                               \
    StoreC(d, e, alpha, c0, m0, cp, t##r##0);                    \
    StoreC(d, e, alpha, c1, m1, cp + n, t##r##1);                \
    if constexpr (kVectors > 2) {                                \
      StoreC(d, e, alpha, c2, m2, cp + 2 * n, t##r##2);          \
      StoreC(d, e, alpha, c3, m3, cp + 3 * n, t##r##3);          \
    }                                                            \
  }
    ATTEST_STORE(0)
    ATTEST_STORE(1)
    ATTEST_STORE(2)
    ATTEST_STORE(3)
    ATTEST_STORE(4)
    ATTEST_STORE(5)
#undef ATTEST_STORE
  }
}

Isa IsaHere() {
  Isa isa;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  isa.name = "avx512";
#elif HWY_TARGET == HWY_AVX2
  isa.name = "avx2";
#elif HWY_TARGET == HWY_NEON
  isa.name = "neon";
#elif HWY_TARGET == HWY_SVE
  isa.name = "sve";
#elif HWY_TARGET == HWY_SVE2
  isa.name = "sve2";
#elif HWY_TARGET == HWY_SVE_256
  isa.name = "sve_256";
#else
  isa.name = "sve2_128";
#endif
  isa.mr = kRows;
  isa.micro[1] = Micro<1>;
  isa.micro[2] = Micro<2>;
  isa.micro[3] = Micro<3>;
  isa.micro[4] = Micro<4>;
  isa.micro[5] = Micro<5>;
  isa.micro[6] = Micro<6>;
  return isa;
}
#else
// No fused multiply-add (Highway's scalar and EMU128 fallbacks): the portable kernel.
Isa IsaHere() { return Isa{}; }
#endif

}  // namespace HWY_NAMESPACE
}  // namespace attest::oracle_internal::gemm
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attest::oracle_internal {
namespace gemm {
// IsaHere of the best target this CPU runs (Highway's dynamic dispatch).
HWY_EXPORT(IsaHere);
Isa Dispatched() { return HWY_DYNAMIC_DISPATCH(IsaHere)(); }
}  // namespace gemm

namespace {
using gemm::Epilogue;
using gemm::Isa;

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

// The vector version for one Highway target, if it was compiled here and this CPU runs it;
// each target's code lives in its own namespace N_<target> (hwy/highway.h HWY_NAMESPACE).
std::optional<Isa> IsaOf(int64_t target) {
  if ((HWY_SUPPORTED_TARGETS & HWY_TARGETS & target) == 0) return std::nullopt;
  Isa isa;
  switch (target) {
#if HWY_TARGETS & HWY_AVX3
    case HWY_AVX3: isa = gemm::N_AVX3::IsaHere(); break;
#endif
#if HWY_TARGETS & HWY_AVX2
    case HWY_AVX2: isa = gemm::N_AVX2::IsaHere(); break;
#endif
#if HWY_TARGETS & HWY_NEON
    case HWY_NEON: isa = gemm::N_NEON::IsaHere(); break;
#endif
#if HWY_TARGETS & HWY_SVE
    case HWY_SVE: isa = gemm::N_SVE::IsaHere(); break;
#endif
#if HWY_TARGETS & HWY_SVE2
    case HWY_SVE2: isa = gemm::N_SVE2::IsaHere(); break;
#endif
#if HWY_TARGETS & HWY_SVE_256
    case HWY_SVE_256: isa = gemm::N_SVE_256::IsaHere(); break;
#endif
#if HWY_TARGETS & HWY_SVE2_128
    case HWY_SVE2_128: isa = gemm::N_SVE2_128::IsaHere(); break;
#endif
    default: return std::nullopt;
  }
  if (isa.mr == 0) return std::nullopt;
  return isa;
}

// The vector versions this machine runs, found once (Highway reads CPUID for it, which costs
// microseconds in a virtual machine: not per product).
const std::vector<Isa>& Runnable() {
  static const std::vector<Isa> all = [] {
    std::vector<Isa> found;
    for (int64_t target : {HWY_AVX3, HWY_AVX2, HWY_NEON, HWY_SVE, HWY_SVE2, HWY_SVE_256,
                           HWY_SVE2_128}) {
      if (std::optional<Isa> isa = IsaOf(target)) found.push_back(*isa);
    }
    return found;
  }();
  return all;
}

// The version called `name` if this machine runs it.
std::optional<Isa> Named(std::string_view name) {
  if (name == "portable") return Isa{};
  for (const Isa& isa : Runnable()) {
    if (name == isa.name) return isa;
  }
  return std::nullopt;
}

// The best version this machine runs (Highway's dynamic dispatch), or the one
// ATTEST_ORACLE_ISA names (when it runs here): read once, at the first product.
const Isa& Best() {
  static const Isa best = []() -> Isa {
    if (const char* want = std::getenv("ATTEST_ORACLE_ISA")) {
      if (std::optional<Isa> isa = Named(want)) return *isa;
    }
    return gemm::Dispatched();
  }();
  return best;
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

void PackPanels(const double* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                double* dst) {
  for (int64_t p = 0; p < PanelCount(cols); ++p) {
    const int64_t c0 = p * kPanelWidth, width = std::min(kPanelWidth, cols - c0);
    double* panel = dst + p * rows * kPanelWidth;
    for (int64_t r = 0; r < rows; ++r) {
      double* out = panel + r * kPanelWidth;
      const double* in = src + r * rs + c0 * cs;
      if (cs == 1) {
        std::memcpy(out, in, static_cast<size_t>(width) * sizeof(double));
      } else {
        for (int64_t j = 0; j < width; ++j) out[j] = in[j * cs];
      }
      std::fill(out + width, out + kPanelWidth, 0.0);
    }
  }
}

void GemmPanels(int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs, int64_t a_cs,
                Panels b, double alpha, bool accumulate, double* c, int64_t ldc) {
  Drive(Best(), m, n, k, a, a_rs, a_cs, b, alpha, accumulate, c, ldc);
}

const char* GemmPanelsIsa() { return Best().name; }

bool GemmPanelsOn(const char* isa, int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs,
                  int64_t a_cs, Panels b, double alpha, bool accumulate, double* c, int64_t ldc) {
  const std::optional<Isa> chosen = Named(isa);
  if (!chosen) return false;
  Drive(*chosen, m, n, k, a, a_rs, a_cs, b, alpha, accumulate, c, ldc);
  return true;
}

}  // namespace attest::oracle_internal
#endif  // HWY_ONCE
