// Vectorisable row kernels of the float64 oracle (see oracle_exp.h for the methods and their
// accuracy).
#include "reference/oracle/oracle_exp.h"

#include <cstring>

namespace attest::oracle_internal {
namespace {

// One version per ISA level, picked at load time (GCC function multiversioning), so that a
// portable build still runs 8-wide on AVX-512 machines. Each version is the same sequence
// of IEEE operations (no FMA contraction: -ffp-contract=off for this file; lanes are explicit
// arrays, not the vectoriser's choice), so results do not depend on which version runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define ATTEST_EXP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ATTEST_EXP_CLONES
#endif

constexpr double kLog2e = 1.44269504088896338700e+00;
constexpr double kLn2Hi = 6.93147180369123816490e-01;  // fdlibm ln2HI: 32 trailing zeros
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // fdlibm ln2LO
constexpr double kRound = 0x1.8p52;  // adding it rounds to an integer (|t| < 2^51)
constexpr double kNegInf = -__builtin_inf();

inline double FromBits(uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}
inline uint64_t ToBits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

// exp(in), branch-free so that loops calling it vectorise (inlined into each ISA clone).
__attribute__((always_inline)) inline double Exp(double in) {
  // 1 / n! for n = 2..13, Horner from the top.
  constexpr double c13 = 1.0 / 6227020800.0, c12 = 1.0 / 479001600.0, c11 = 1.0 / 39916800.0,
                   c10 = 1.0 / 3628800.0, c9 = 1.0 / 362880.0, c8 = 1.0 / 40320.0,
                   c7 = 1.0 / 5040.0, c6 = 1.0 / 720.0, c5 = 1.0 / 120.0, c4 = 1.0 / 24.0,
                   c3 = 1.0 / 6.0, c2 = 0.5;
  constexpr double two_m54 = 0x1p-54;
  // 1. Clamp into the range where the integer arithmetic below is defined (NaN -> -746;
  //    it is restored at the end).
  double xc = in > -746.0 ? in : -746.0;
  xc = xc < 710.0 ? xc : 710.0;
  // 2. Reduce: k = round(x / ln 2), r = x - k ln 2 with |r| <= ln(2)/2 (+ rounding). The
  //    integer k is also read from the low bits of t (no float -> int64 conversion, which
  //    AVX2 cannot vectorise).
  const double t = xc * kLog2e + kRound;
  const double k = t - kRound;
  const int64_t ki = static_cast<int64_t>(ToBits(t) - ToBits(kRound));
  const double r = (xc - k * kLn2Hi) - k * kLn2Lo;
  // 3. exp(r) = 1 + r + r^2 (1/2 + r/6 + ...), the small terms first.
  double p = c13;
  p = p * r + c12;
  p = p * r + c11;
  p = p * r + c10;
  p = p * r + c9;
  p = p * r + c8;
  p = p * r + c7;
  p = p * r + c6;
  p = p * r + c5;
  p = p * r + c4;
  p = p * r + c3;
  p = p * r + c2;
  const double er = 1.0 + (r + (r * r) * p);
  // 4. Scale by 2^k; below 2^-1022 in two steps (2^(k+54) then 2^-54), above 2^1000 as
  //    2^(k-1) then 2 (2^1024 itself has no bit pattern).
  const bool tiny = k < -1000.0;
  const bool big = k > 1000.0;
  const int64_t kk = ki + (tiny ? 54 : 0) - (big ? 1 : 0);
  const double y = er * FromBits(static_cast<uint64_t>(kk + 1023) << 52);
  double out = tiny ? y * two_m54 : (big ? y * 2.0 : y);
  out = in < -745.2 ? 0.0 : out;
  out = in > 709.782712893384 ? __builtin_inf() : out;
  return in != in ? in : out;
}

// Eight lanes as GCC vector types (each ISA clone maps them onto its own registers: one
// zmm, two ymm or four xmm); every operation is the per-lane IEEE operation.
typedef double V8 __attribute__((vector_size(64)));
typedef int64_t I8 __attribute__((vector_size(64)));

// Exp of eight arguments that all lie in [-708, 709], where the results are normal and
// finite: Exp's steps 2 and 3 as they are, and the scaling by 2^k in one exact step (Exp's
// two-step scalings are exact there too, its clamps and special cases inactive), so every
// lane is bitwise Exp's result. About half of Exp's operations.
// (Arguments by reference: a 64-byte vector by value changes the ABI per ISA level.)
__attribute__((always_inline)) inline void ExpNormal8(const V8& x, V8& out) {
  constexpr double c13 = 1.0 / 6227020800.0, c12 = 1.0 / 479001600.0, c11 = 1.0 / 39916800.0,
                   c10 = 1.0 / 3628800.0, c9 = 1.0 / 362880.0, c8 = 1.0 / 40320.0,
                   c7 = 1.0 / 5040.0, c6 = 1.0 / 720.0, c5 = 1.0 / 120.0, c4 = 1.0 / 24.0,
                   c3 = 1.0 / 6.0, c2 = 0.5;
  const V8 t = x * kLog2e + kRound;
  const V8 k = t - kRound;
  const I8 ki = (I8)t - (int64_t)ToBits(kRound);
  const V8 r = (x - k * kLn2Hi) - k * kLn2Lo;
  V8 p = r * c13 + c12;
  p = p * r + c11;
  p = p * r + c10;
  p = p * r + c9;
  p = p * r + c8;
  p = p * r + c7;
  p = p * r + c6;
  p = p * r + c5;
  p = p * r + c4;
  p = p * r + c3;
  p = p * r + c2;
  const V8 er = 1.0 + (r + (r * r) * p);
  out = er * (V8)((ki + 1023) << 52);
}

// Whether every lane of x lies in [-708, 709] (NaN does not).
// (Selects and adds, which GCC keeps in vector registers; it splits a vector `&` of two
// comparison masks into scalar code.)
__attribute__((always_inline)) inline bool AllNormalRange(const V8& x) {
  const V8 zero = {}, one = zero + 1.0;
  const V8 hi = x - 709.0, lo = -708.0 - x;
  V8 bad = hi <= 0.0 ? zero : one;  // NaN: the comparison fails, so it counts as bad
  bad += lo <= 0.0 ? zero : one;
  bad += __builtin_shuffle(bad, I8{4, 5, 6, 7, 0, 1, 2, 3});
  bad += __builtin_shuffle(bad, I8{2, 3, 0, 1, 6, 7, 4, 5});
  bad += __builtin_shuffle(bad, I8{1, 0, 3, 2, 5, 4, 7, 6});
  return bad[0] == 0.0;
}

// p[e] = exp(x[e] - shift) for e in [0, n): blocks of eight in range by ExpNormal8, the
// others (masked -inf scores, underflow, NaN) and the tail by Exp; the same bits either way.
__attribute__((always_inline)) inline void ExpShifted(const double* __restrict x,
                                                      double* __restrict p, int64_t n,
                                                      double shift) {
  int64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    V8 a;
    std::memcpy(&a, x + e, sizeof a);
    a -= shift;
    if (AllNormalRange(a)) {
      V8 y;
      ExpNormal8(a, y);
      std::memcpy(p + e, &y, sizeof y);
    } else {
      for (int j = 0; j < 8; ++j) p[e + j] = Exp(a[j]);
    }
  }
  for (; e < n; ++e) p[e] = Exp(x[e] - shift);
}

// sum += x with its rounding error added to comp (Knuth's TwoSum: branch-free).
__attribute__((always_inline)) inline void TwoSumAdd(double& sum, double& comp, double x) {
  const double t = sum + x;
  const double bp = t - sum;
  comp += (sum - (t - bp)) + (x - bp);
  sum = t;
}

// The lane-compensated sum of x[0, n) (oracle_exp.h): lane j takes x[e] with e % 8 == j.
__attribute__((always_inline)) inline CompensatedSum LaneSum(const double* x, int64_t n) {
  double s[kSumLanes] = {}, c[kSumLanes] = {};
  int64_t e = 0;
  for (; e + kSumLanes <= n; e += kSumLanes) {
    for (int j = 0; j < kSumLanes; ++j) TwoSumAdd(s[j], c[j], x[e + j]);
  }
  for (int j = 0; e + j < n; ++j) TwoSumAdd(s[j], c[j], x[e + j]);
  CompensatedSum out;
  for (int j = 0; j < kSumLanes; ++j) {
    TwoSumAdd(out.sum, out.comp, s[j]);
    out.comp += c[j];
  }
  return out;
}

}  // namespace

ATTEST_EXP_CLONES
void ExpInPlace(double* x, int64_t n) {
  // Through the blocked path, so that the exp tests exercise both of its branches.
  int64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    V8 a;
    std::memcpy(&a, x + e, sizeof a);
    if (AllNormalRange(a)) {
      V8 y;
      ExpNormal8(a, y);
      std::memcpy(x + e, &y, sizeof y);
    } else {
      for (int j = 0; j < 8; ++j) x[e + j] = Exp(a[j]);
    }
  }
  for (; e < n; ++e) x[e] = Exp(x[e]);
}

ATTEST_EXP_CLONES
CompensatedSum ExpShiftSum(const double* __restrict x, double* __restrict p, int64_t n,
                           double shift) {
  // Two passes over the row (it is in L1): the exps, then the sum in explicit lanes.
  ExpShifted(x, p, n, shift);
  return LaneSum(p, n);
}

ATTEST_EXP_CLONES
void BackwardRow(const double* __restrict s, double* __restrict p, double* __restrict dp,
                 int64_t n, double lse, double delta, double* __restrict mass,
                 int64_t* __restrict seen) {
  ExpShifted(s, p, n, lse);
  for (int64_t e = 0; e < n; ++e) {
    seen[e] += s[e] != kNegInf ? 1 : 0;
    dp[e] = p[e] * (dp[e] - delta);
    mass[e] += p[e];
  }
}

ATTEST_EXP_CLONES
int64_t RowStats(const double* x, const double* norm, int64_t n, double* max, double* norm_max) {
  // GCC vector types (every ISA clone splits them into its own registers): the loop is a
  // reduction the auto-vectoriser does not take (max with NaN semantics). Max and count are
  // exact, so the lane order cannot change the result.
  typedef double V8 __attribute__((vector_size(64)));
  typedef int64_t I8 __attribute__((vector_size(64)));
  const V8 neg_inf = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  const V8 zero = {};
  V8 mx = neg_inf, nk = zero;
  I8 cnt = {};
  int64_t e = 0;
  for (; e + kSumLanes <= n; e += kSumLanes) {
    V8 v, w;
    std::memcpy(&v, x + e, sizeof v);
    std::memcpy(&w, norm + e, sizeof w);
    const I8 visible = v != neg_inf;  // -1 where visible
    cnt -= visible;
    mx = mx < v ? v : mx;  // as std::max(mx, v): NaN never replaces mx
    const V8 wv = visible ? w : zero;
    nk = nk < wv ? wv : nk;
  }
  int64_t count = 0;
  double m = kNegInf, w = 0;
  for (int j = 0; j < kSumLanes; ++j) {
    count += cnt[j];
    m = m < mx[j] ? mx[j] : m;
    w = w < nk[j] ? nk[j] : w;
  }
  for (; e < n; ++e) {
    if (x[e] == kNegInf) continue;
    ++count;
    m = m < x[e] ? x[e] : m;
    w = w < norm[e] ? norm[e] : w;
  }
  *max = m;
  *norm_max = w;
  return count;
}

}  // namespace attest::oracle_internal
