// Vectorisable exp kernel (see oracle_exp.h for the method and its accuracy).
#include "reference/oracle/oracle_exp.h"

#include <cstring>

namespace attest::oracle_internal {
namespace {

// One version per ISA level, picked at load time (GCC function multiversioning), so that a
// portable build still runs 8-wide on AVX-512 machines. Each version is the same sequence
// of IEEE operations (no FMA contraction: -ffp-contract=off for this file), so results do
// not depend on which version runs.
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

}  // namespace

ATTEST_EXP_CLONES
void ExpInPlace(double* x, int64_t n) {
  // 1 / n! for n = 2..13, Horner from the top.
  constexpr double c13 = 1.0 / 6227020800.0, c12 = 1.0 / 479001600.0, c11 = 1.0 / 39916800.0,
                   c10 = 1.0 / 3628800.0, c9 = 1.0 / 362880.0, c8 = 1.0 / 40320.0,
                   c7 = 1.0 / 5040.0, c6 = 1.0 / 720.0, c5 = 1.0 / 120.0, c4 = 1.0 / 24.0,
                   c3 = 1.0 / 6.0, c2 = 0.5;
  const double two_m54 = 0x1p-54;
  for (int64_t e = 0; e < n; ++e) {
    const double in = x[e];
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
    x[e] = in != in ? in : out;
  }
}

}  // namespace attest::oracle_internal
