// bench/hwy_gemm.h: the panel product of reference/oracle/oracle_gemm.cc with one Highway
// micro-kernel for every target. foreach_target.h compiles this file once per target in
// HWY_TARGETS (hwy/foreach_target.h, google/highway g3doc/quick_reference.md "Dynamic
// dispatch"); the part under HWY_ONCE builds the dispatch tables.
#include "bench/hwy_gemm.h"

#include <algorithm>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/hwy_gemm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attest::hwy_gemm {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using oracle_internal::kGemmKc;
using oracle_internal::kPanelWidth;
using oracle_internal::PanelCount;
using oracle_internal::Panels;

// At most 8 doubles per vector (one AVX-512 register): a pass of kVectors vectors then spans
// 8, 16 or 32 columns, which divides the 32-column panel on every target, SVE of any vector
// length included (Highway's SVE vectors hold a power of two of lanes).
using D = hn::CappedTag<double, 8>;
using V = hn::Vec<D>;

// Vectors per row of the accumulator block. AVX-512, NEON and SVE have 32 vector registers:
// 6 rows x 4 vectors = 24 accumulators, 4 for the panel row, 1 broadcast. AVX2 and SSE4 have
// 16: 6 x 2 = 12 accumulators, 2 for the panel row, 1 broadcast. These are the shapes of
// oracle_gemm.cc's Micro512 (6 x 32, one pass) and Micro256 (6 x 8, four passes).
#if HWY_ARCH_X86 && HWY_TARGET != HWY_AVX3 && HWY_TARGET != HWY_AVX3_DL
constexpr int kVectors = 2;
#else
constexpr int kVectors = 4;
#endif
constexpr int kRows = 6;

// oracle_gemm.cc's Epilogue: x = first ? t : C + t; C = scale ? alpha x : x.
struct Epilogue {
  bool first = false;
  bool scale = false;
  double alpha = 1.0;
};

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

using MicroFn = void (*)(int64_t, const double*, int64_t, int64_t, const double*, double*, int64_t,
                         int, Epilogue);
constexpr MicroFn kMicro[kRows + 1] = {nullptr,   Micro<1>, Micro<2>, Micro<3>,
                                       Micro<4>, Micro<5>, Micro<6>};

// oracle_gemm.cc's Drive, with this target's micro-kernels.
void DrivePanels(int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs, int64_t a_cs,
                 Panels b, double alpha, bool accumulate, double* c, int64_t ldc) {
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
      for (int64_t i0 = 0; i0 < m; i0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i0));
        kMicro[rows](kc, ap + i0 * a_rs, a_rs, a_cs, bp, cp + i0 * ldc, ldc, nvalid, e);
      }
    }
  }
}

std::string ShapeHere() {
  const int n = static_cast<int>(hn::Lanes(D()));
  return std::to_string(kRows) + "x" + std::to_string(kVectors * n) + " (" +
         std::to_string(kVectors) + " vectors of " + std::to_string(n) + ")";
}

}  // namespace HWY_NAMESPACE
}  // namespace attest::hwy_gemm
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attest::hwy_gemm {

HWY_EXPORT(DrivePanels);
HWY_EXPORT(ShapeHere);

void GemmPanels(int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs, int64_t a_cs,
                oracle_internal::Panels b, double alpha, bool accumulate, double* c, int64_t ldc) {
  HWY_DYNAMIC_DISPATCH(DrivePanels)(m, n, k, a, a_rs, a_cs, b, alpha, accumulate, c, ldc);
}

OnlyTarget::OnlyTarget(int64_t target) {
  ok_ = (hwy::SupportedTargets() & HWY_TARGETS & target) != 0;
  if (!ok_) return;
  hwy::SetSupportedTargetsForTest(target);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

OnlyTarget::~OnlyTarget() {
  if (!ok_) return;
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

std::vector<int64_t> Targets() { return hwy::SupportedAndGeneratedTargets(); }

std::string TargetName(int64_t target) { return hwy::TargetName(target); }

std::string ChosenTarget() {
  const std::vector<int64_t> all = Targets();
  return all.empty() ? std::string("none") : TargetName(all.front());
}

std::string KernelShape(int64_t target) {
  OnlyTarget only(target);
  if (!only.ok()) return "";
  return HWY_DYNAMIC_DISPATCH(ShapeHere)();
}

}  // namespace attest::hwy_gemm
#endif  // HWY_ONCE
