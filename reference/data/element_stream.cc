// The element streams of the generators (generate.h): Philox-4x32-10, the uniform and
// normal draws of one element, DeterministicLog, and NormalsOf, which draws the normals of
// consecutive elements several at a time. Philox follows Salmon et al., SC'11, with the
// constants of Random123 (philox.h: PHILOX_M4x32_0/1, PHILOX_W32_0/1); its known-answer
// vectors (Random123 examples/kat_vectors) are pinned in generate_test.cc.
//
// This file is compiled with -ffp-contract=off (see CMakeLists.txt): a fused multiply-add
// rounds once where a*b+c rounds twice, so contraction would change the last bits between
// machines with and without FMA.
#include "reference/data/element_stream.h"

#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "reference/data/generate.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTEST_GENERATE_X86 1
#include <immintrin.h>
#else
#define ATTEST_GENERATE_X86 0
#endif

// Every double operation must round to double once (no x87 80-bit intermediates).
static_assert(FLT_EVAL_METHOD == 0, "generators need IEEE double evaluation (e.g. SSE2)");
static_assert(std::numeric_limits<double>::is_iec559);

namespace attest {

// --- Philox -------------------------------------------------------------------------------

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t{kPhiloxM0} * c[0];
    const uint64_t p1 = uint64_t{kPhiloxM1} * c[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

uint64_t ElementStream::NextU64() {
  if (used_ > 2) {
    buffer_ = Philox4x32(
        {static_cast<uint32_t>(index_), static_cast<uint32_t>(index_ >> 32), stream_, block_++},
        key_);
    used_ = 0;
  }
  const uint64_t w = (uint64_t{buffer_[used_]} << 32) | buffer_[used_ + 1];
  used_ += 2;
  return w;
}

double ElementStream::NextUniform() {
  // k * 2^-53 with k < 2^53 is exact: every value of the grid {0, 2^-53, ..., 1 - 2^-53}.
  return static_cast<double>(NextU64() >> 11) * 0x1p-53;
}

double ElementStream::NextNormal() {
  // Marsaglia's polar method: (u, v) uniform in the unit disc; z = u * sqrt(-2 ln s / s).
  // Acceptance is pi/4 per attempt, so needing more than 200 attempts has probability
  // (1 - pi/4)^200 < 1e-130; each attempt reads fresh words of this element's own stream.
  for (;;) {
    const double u = 2.0 * NextUniform() - 1.0;  // exact: the grid of k * 2^-52 in [-1, 1)
    const double v = 2.0 * NextUniform() - 1.0;
    const double s = u * u + v * v;
    if (s >= 1.0 || s == 0.0) continue;
    return u * std::sqrt(-2.0 * DeterministicLog(s) / s);
  }
}

double DeterministicLog(double x) {
  // 1. Special values.
  if (std::isnan(x) || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  // 2. x = m * 2^e with m in [sqrt(1/2), sqrt(2)), read from the bits (exact). Subnormals are
  // first scaled by 2^54 (exact).
  int e = 0;
  if (x < std::numeric_limits<double>::min()) {
    x *= 0x1p54;
    e = -54;
  }
  const auto bits = std::bit_cast<uint64_t>(x);
  e += static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  double m = std::bit_cast<double>((bits & 0x000f'ffff'ffff'ffffULL) | 0x3ff0'0000'0000'0000ULL);
  if (m > 0x1.6a09e667f3bcdp+0) {  // sqrt(2) rounded
    m *= 0.5;
    ++e;
  }
  // 3. ln m = ln(1 + f) with f = m - 1 exact (Sterbenz), f in [-0.293, 0.414]. With
  // s = f / (2 + f), ln(1 + f) = 2 atanh(s) = 2s + s R(s^2), R = 2z/3 + 2z^2/5 + ..., and
  // 2s = f - s f = f - (hfsq - s hfsq) where hfsq = f^2 / 2. Arranged as f - (correction)
  // (the layout of fdlibm's e_log.c), the exact f carries the leading bits and the rounding
  // of s and R only touches a correction below |f| / 2.
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;  // <= 0.0295: the series through z^12 leaves < 2^-60 relative
  double r = 2.0 / 25.0;
  for (int k = 11; k >= 1; --k) r = r * z + 2.0 / (2.0 * k + 1.0);
  r *= z;
  const double hfsq = 0.5 * f * f;
  // 4. e ln 2 in two pieces (fdlibm's ln2_hi has 32 trailing zero bits, so e * ln2_hi is exact
  // for |e| < 2^20), the small piece folded into the correction.
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double de = static_cast<double>(e);
  return de * kLn2Hi - ((hfsq - (s * (hfsq + r) + de * kLn2Lo)) - f);
}

// --- Normals of consecutive elements, several at a time ----------------------------------
//
// NormalsOf(seed, stream, first, out) sets out[i] to ElementStream(seed, stream, first + i)
// .NextNormal(), bit for bit: the AVX2 and AVX-512 versions run Philox on four or eight
// counters at once and the polar method's arithmetic with the same IEEE-754 operations in the
// same order (no FMA: this file is compiled with -ffp-contract=off and the code below calls no
// FMA intrinsic).
// Each attempt of the polar method reads exactly one Philox block (two 64-bit words), so an
// element whose attempt `block` is rejected is retried with block + 1, with the others
// rejected there.

namespace {

#if ATTEST_GENERATE_X86
// 2 NextUniform() - 1 of the words (hi << 32 | lo), exactly: NextUniform's k = w >> 11 has 53
// bits; with k = b 2^52 + m and x = 1 + m 2^-52 (the bits 0x3ff | m), 2 k 2^-53 - 1 is x - 1
// for b = 1 and x - 2 for b = 0, both exact.
__attribute__((target("avx2"))) inline __m256d Centred4(__m256i hi, __m256i lo) {
  const __m256i k = _mm256_srli_epi64(_mm256_or_si256(_mm256_slli_epi64(hi, 32), lo), 11);
  const __m256i m = _mm256_and_si256(k, _mm256_set1_epi64x(0x000f'ffff'ffff'ffffLL));
  const __m256d x = _mm256_castsi256_pd(_mm256_or_si256(m, _mm256_set1_epi64x(0x3ffLL << 52)));
  const __m256d b = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_srli_epi64(k, 52), 63));
  return _mm256_sub_pd(x, _mm256_blendv_pd(_mm256_set1_pd(2.0), _mm256_set1_pd(1.0), b));
}

// DeterministicLog's series coefficients 2 / (2k + 1), k = 1..11 (correctly rounded divisions,
// at compile time as at run time).
constexpr std::array<double, 12> kSeries = [] {
  std::array<double, 12> c{};
  for (int k = 11; k >= 1; --k) c[static_cast<size_t>(k)] = 2.0 / (2.0 * k + 1.0);
  return c;
}();

// Attempt number block[l] of element index[l] for the 4 G lanes l: u, v from that block of
// the element's stream; bit l of the result is set when s = u^2 + v^2 is in (0, 1), and then
// out[l] is the normal. G groups of four run side by side: each is a chain of dependent
// operations (Philox's rounds, the log's series) that the core overlaps with the others' (G = 4
// took 0.65 of G = 1's CPU time for the gaussian row here, on an AVX2-only EPYC).
template <int G>
__attribute__((target("avx2"))) uint32_t PolarAttempt(std::array<uint32_t, 2> key,
                                                      uint32_t stream, const uint64_t* index,
                                                      const uint32_t* block, double* out) {
  const __m256i low32 = _mm256_set1_epi64x(0xffffffffLL);
  __m256i c0[G], c1[G], c2[G], c3[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + 4 * g));
    c0[g] = _mm256_and_si256(idx, low32);
    c1[g] = _mm256_srli_epi64(idx, 32);
    c2[g] = _mm256_set1_epi64x(stream);
    c3[g] = _mm256_cvtepu32_epi64(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 4 * g)));
  }
  // Philox4x32-10 (Philox4x32 above), one counter per 64-bit lane, each word in the low half.
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0), m1 = _mm256_set1_epi64x(kPhiloxM1);
  uint32_t k0 = key[0], k1 = key[1];
#pragma GCC unroll 10
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const __m256i key0 = _mm256_set1_epi64x(k0), key1 = _mm256_set1_epi64x(k1);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m256i p0 = _mm256_mul_epu32(c0[g], m0);
      const __m256i p1 = _mm256_mul_epu32(c2[g], m1);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[g]), key0);
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[g]), key1);
      c1[g] = _mm256_and_si256(p1, low32);
      c3[g] = _mm256_and_si256(p0, low32);
    }
  }
  const __m256i mantissa = _mm256_set1_epi64x(0x000f'ffff'ffff'ffffLL);
  const __m256i one_bits = _mm256_set1_epi64x(0x3ffLL << 52);
  const __m256d one = _mm256_set1_pd(1.0);
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  __m256d u[G], s[G], f[G], q[G], z[G], r[G];
  __m256i e[G];
  uint32_t accepted = 0;
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    u[g] = Centred4(c0[g], c1[g]);
    const __m256d v = Centred4(c2[g], c3[g]);
    s[g] = _mm256_add_pd(_mm256_mul_pd(u[g], u[g]), _mm256_mul_pd(v, v));
    const __m256d ok = _mm256_and_pd(_mm256_cmp_pd(s[g], one, _CMP_LT_OQ),
                                     _mm256_cmp_pd(s[g], _mm256_setzero_pd(), _CMP_NEQ_OQ));
    accepted |= static_cast<uint32_t>(_mm256_movemask_pd(ok)) << (4 * g);
    // DeterministicLog(s) for s in [2^-104, 1): normal, so step 1 and the subnormal scaling
    // of step 2 do not apply (rejected lanes compute values that a later attempt replaces).
    const __m256i bits = _mm256_castpd_si256(s[g]);
    e[g] = _mm256_sub_epi64(
        _mm256_and_si256(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(0x7ff)),
        _mm256_set1_epi64x(1023));
    __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, mantissa), one_bits));
    const __m256d big = _mm256_cmp_pd(m, _mm256_set1_pd(0x1.6a09e667f3bcdp+0), _CMP_GT_OQ);
    m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), big);
    e[g] = _mm256_sub_epi64(e[g], _mm256_castpd_si256(big));  // the mask is -1 where halved
    f[g] = _mm256_sub_pd(m, one);
    q[g] = _mm256_div_pd(f[g], _mm256_add_pd(_mm256_set1_pd(2.0), f[g]));
    z[g] = _mm256_mul_pd(q[g], q[g]);
    r[g] = _mm256_set1_pd(2.0 / 25.0);
  }
#pragma GCC unroll 11
  for (int k = 11; k >= 1; --k) {
    const __m256d ck = _mm256_set1_pd(kSeries[static_cast<size_t>(k)]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) r[g] = _mm256_add_pd(_mm256_mul_pd(r[g], z[g]), ck);
  }
  // double(e) exactly, |e| < 2^51: the bits of 1.5 2^52 + e, minus 1.5 2^52.
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    r[g] = _mm256_mul_pd(r[g], z[g]);
    const __m256d hfsq = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), f[g]), f[g]);
    const __m256d de = _mm256_sub_pd(
        _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(magic), e[g])), magic);
    const __m256d inner = _mm256_add_pd(_mm256_mul_pd(q[g], _mm256_add_pd(hfsq, r[g])),
                                        _mm256_mul_pd(de, _mm256_set1_pd(kLn2Lo)));
    const __m256d log_s = _mm256_sub_pd(_mm256_mul_pd(de, _mm256_set1_pd(kLn2Hi)),
                                        _mm256_sub_pd(_mm256_sub_pd(hfsq, inner), f[g]));
    // u * sqrt(-2 ln s / s).
    const __m256d t = _mm256_div_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_s), s[g]);
    _mm256_storeu_pd(out + 4 * g, _mm256_mul_pd(u[g], _mm256_sqrt_pd(t)));
  }
  return accepted;
}

// GCC 12's avx512fintrin.h passes a self-initialised `__Y` (_mm512_undefined_*) as the unused
// merge source of most unmasked intrinsics, and -Wuninitialized reports it inside the header
// for each use; the value is never read (the mask is all ones).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The AVX-512 counterpart of Centred4, on eight lanes: the bit b = bit 52 of k is tested into
// a mask (vptestmq) instead of being moved to the sign bit for blendv; the selection of 1 or 2
// and the one subtraction are the same.
__attribute__((target("avx512f"))) inline __m512d Centred8(__m512i hi, __m512i lo) {
  const __m512i k = _mm512_srli_epi64(_mm512_or_si512(_mm512_slli_epi64(hi, 32), lo), 11);
  const __m512i m = _mm512_and_si512(k, _mm512_set1_epi64(0x000f'ffff'ffff'ffffLL));
  const __m512d x = _mm512_castsi512_pd(_mm512_or_si512(m, _mm512_set1_epi64(0x3ffLL << 52)));
  const __mmask8 b = _mm512_test_epi64_mask(k, _mm512_set1_epi64(1LL << 52));
  return _mm512_sub_pd(x, _mm512_mask_blend_pd(b, _mm512_set1_pd(2.0), _mm512_set1_pd(1.0)));
}

// PolarAttempt on 8 G lanes with AVX-512F alone (every intrinsic below is in AVX512F; none
// needs DQ, BW or VL), operation for operation: vpmuludq, the 64-bit shifts and logic and
// vpmovzxdq are the same integer operations on twice the lanes, and vdivpd, vsqrtpd, vmulpd,
// vaddpd and vsubpd are IEEE-754 correctly rounded at every width (round to nearest even, as
// MXCSR leaves it), so each lane rounds as the AVX2 and scalar code do. The comparisons give
// masks instead of all-ones lanes: the halving of m becomes a masked multiply (the lanes not
// halved keep m, as blendv kept them) and e + 1 a masked add. double(e) keeps the 1.5 2^52
// trick (vcvtqq2pd, also exact here, would need AVX512DQ). G = 3 is the fastest here: on a Xeon
// with AVX-512 (2.8 GHz, best of 5 on 2^20 values, single thread), NormalsOf took 11.4, 9.5,
// 8.5 and 9.8 ns per value for G = 1, 2, 3 and 4, against 11.5 for PolarAttempt<4> (with GCC
// 12, G = 4 spills more than twice as many zmm values to the stack as G = 3).
template <int G>
__attribute__((target("avx512f"))) uint32_t PolarAttempt512(std::array<uint32_t, 2> key,
                                                            uint32_t stream,
                                                            const uint64_t* index,
                                                            const uint32_t* block, double* out) {
  const __m512i low32 = _mm512_set1_epi64(0xffffffffLL);
  __m512i c0[G], c1[G], c2[G], c3[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m512i idx = _mm512_loadu_si512(index + 8 * g);
    c0[g] = _mm512_and_si512(idx, low32);
    c1[g] = _mm512_srli_epi64(idx, 32);
    c2[g] = _mm512_set1_epi64(stream);
    c3[g] = _mm512_cvtepu32_epi64(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 8 * g)));
  }
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0), m1 = _mm512_set1_epi64(kPhiloxM1);
  uint32_t k0 = key[0], k1 = key[1];
#pragma GCC unroll 10
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const __m512i key0 = _mm512_set1_epi64(k0), key1 = _mm512_set1_epi64(k1);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512i p0 = _mm512_mul_epu32(c0[g], m0);
      const __m512i p1 = _mm512_mul_epu32(c2[g], m1);
      c0[g] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p1, 32), c1[g]), key0);
      c2[g] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), c3[g]), key1);
      c1[g] = _mm512_and_si512(p1, low32);
      c3[g] = _mm512_and_si512(p0, low32);
    }
  }
  const __m512i mantissa = _mm512_set1_epi64(0x000f'ffff'ffff'ffffLL);
  const __m512i one_bits = _mm512_set1_epi64(0x3ffLL << 52);
  const __m512d one = _mm512_set1_pd(1.0);
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  __m512d u[G], s[G], f[G], q[G], z[G], r[G];
  __m512i e[G];
  uint32_t accepted = 0;
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    u[g] = Centred8(c0[g], c1[g]);
    const __m512d v = Centred8(c2[g], c3[g]);
    s[g] = _mm512_add_pd(_mm512_mul_pd(u[g], u[g]), _mm512_mul_pd(v, v));
    const __mmask8 ok = _mm512_cmp_pd_mask(s[g], one, _CMP_LT_OQ) &
                        _mm512_cmp_pd_mask(s[g], _mm512_setzero_pd(), _CMP_NEQ_OQ);
    accepted |= static_cast<uint32_t>(ok) << (8 * g);
    // DeterministicLog(s) for s in [2^-104, 1), as in PolarAttempt.
    const __m512i bits = _mm512_castpd_si512(s[g]);
    e[g] = _mm512_sub_epi64(
        _mm512_and_si512(_mm512_srli_epi64(bits, 52), _mm512_set1_epi64(0x7ff)),
        _mm512_set1_epi64(1023));
    __m512d m = _mm512_castsi512_pd(_mm512_or_si512(_mm512_and_si512(bits, mantissa), one_bits));
    const __mmask8 big = _mm512_cmp_pd_mask(m, _mm512_set1_pd(0x1.6a09e667f3bcdp+0), _CMP_GT_OQ);
    m = _mm512_mask_mul_pd(m, big, m, _mm512_set1_pd(0.5));
    e[g] = _mm512_mask_add_epi64(e[g], big, e[g], _mm512_set1_epi64(1));
    f[g] = _mm512_sub_pd(m, one);
    q[g] = _mm512_div_pd(f[g], _mm512_add_pd(_mm512_set1_pd(2.0), f[g]));
    z[g] = _mm512_mul_pd(q[g], q[g]);
    r[g] = _mm512_set1_pd(2.0 / 25.0);
  }
#pragma GCC unroll 11
  for (int k = 11; k >= 1; --k) {
    const __m512d ck = _mm512_set1_pd(kSeries[static_cast<size_t>(k)]);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) r[g] = _mm512_add_pd(_mm512_mul_pd(r[g], z[g]), ck);
  }
  const __m512d magic = _mm512_set1_pd(0x1.8p52);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    r[g] = _mm512_mul_pd(r[g], z[g]);
    const __m512d hfsq = _mm512_mul_pd(_mm512_mul_pd(_mm512_set1_pd(0.5), f[g]), f[g]);
    const __m512d de = _mm512_sub_pd(
        _mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(magic), e[g])), magic);
    const __m512d inner = _mm512_add_pd(_mm512_mul_pd(q[g], _mm512_add_pd(hfsq, r[g])),
                                        _mm512_mul_pd(de, _mm512_set1_pd(kLn2Lo)));
    const __m512d log_s = _mm512_sub_pd(_mm512_mul_pd(de, _mm512_set1_pd(kLn2Hi)),
                                        _mm512_sub_pd(_mm512_sub_pd(hfsq, inner), f[g]));
    const __m512d t = _mm512_div_pd(_mm512_mul_pd(_mm512_set1_pd(-2.0), log_s), s[g]);
    _mm512_storeu_pd(out + 8 * g, _mm512_mul_pd(u[g], _mm512_sqrt_pd(t)));
  }
  return accepted;
}

#pragma GCC diagnostic pop

// A PolarAttempt or PolarAttempt512 instance.
using AttemptFn = uint32_t (*)(std::array<uint32_t, 2> key, uint32_t stream,
                               const uint64_t* index, const uint32_t* block, double* out);

// NormalsOf with kAttempt, kLanes elements at a time, in pieces of kPiece elements so that the
// retries of a piece are still in cache: attempt 0 of every element of the piece, then attempt
// 1 of those rejected, and so on. The element indices of a pass are written out before its
// first kAttempt call: a vector load of values that scalar stores have just written cannot be
// forwarded from them, and would wait until those stores, and so everything before them (the
// previous call's divisions and square root), had retired. That, and the acceptance returned
// as a bit mask rather than an array of bool, took the AVX2 path from 13.9 to 12.0 ns per value
// on the Xeon of PolarAttempt512's comment.
template <size_t kLanes, AttemptFn kAttempt>
void NormalsBatched(uint64_t seed, uint32_t stream, uint64_t first, std::span<double> out) {
  const std::array<uint32_t, 2> key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  constexpr size_t kPiece = 1024;
  std::array<size_t, kPiece> pending{};  // offsets into out of the elements still to draw
  std::array<uint64_t, kPiece + kLanes> index{};
  uint32_t block[kLanes];
  double value[kLanes];
  for (size_t begin = 0; begin < out.size(); begin += kPiece) {
    size_t npending = std::min(out.size() - begin, kPiece);
    for (size_t j = 0; j < npending; ++j) pending[j] = begin + j;
    for (uint32_t attempt = 0; npending > 0; ++attempt) {
      // A short last group repeats its last element.
      for (size_t j = 0; j < npending; ++j) index[j] = first + pending[j];
      std::fill(index.data() + npending, index.data() + npending + kLanes, index[npending - 1]);
      std::fill(block, block + kLanes, attempt);
      // The rejected ones move to the front of pending, in order (nretry <= j + l: no entry is
      // overwritten before it is read). Every lane's value is stored, a rejected one's too (a
      // later pass overwrites it), so that no branch depends on acceptance, which a predictor
      // misses about once in five lanes (12.0 to 11.6 ns per value for AVX2).
      size_t nretry = 0;
      for (size_t j = 0; j < npending; j += kLanes) {
        const uint32_t ok = kAttempt(key, stream, index.data() + j, block, value);
        const size_t lanes = std::min(kLanes, npending - j);
        for (size_t l = 0; l < lanes; ++l) {
          const size_t at = pending[j + l];
          out[at] = value[l];
          pending[nretry] = at;
          nretry += ((ok >> l) & 1) ^ 1;
        }
      }
      npending = nretry;
    }
  }
}

bool HaveAvx2() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return have;
}

bool HaveAvx512() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return have;
}
#endif

}  // namespace

namespace internal {

bool HaveNormalsIsa(NormalsIsa isa) {
  switch (isa) {
    case NormalsIsa::kScalar:
      return true;
#if ATTEST_GENERATE_X86
    case NormalsIsa::kAvx2:
      return HaveAvx2();
    case NormalsIsa::kAvx512:
      return HaveAvx512();
#endif
    default:
      return false;
  }
}

void NormalsOfIsa(NormalsIsa isa, uint64_t seed, uint32_t stream, uint64_t first,
                  std::span<double> out) {
#if ATTEST_GENERATE_X86
  if (isa == NormalsIsa::kAvx512) {
    return NormalsBatched<24, PolarAttempt512<3>>(seed, stream, first, out);
  }
  if (isa == NormalsIsa::kAvx2) {
    return NormalsBatched<16, PolarAttempt<4>>(seed, stream, first, out);
  }
#endif
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = ElementStream(seed, stream, first + i).NextNormal();
  }
}

}  // namespace internal

void NormalsOf(uint64_t seed, uint32_t stream, uint64_t first, std::span<double> out) {
  using internal::NormalsIsa;
  const NormalsIsa isa = internal::HaveNormalsIsa(NormalsIsa::kAvx512) ? NormalsIsa::kAvx512
                         : internal::HaveNormalsIsa(NormalsIsa::kAvx2) ? NormalsIsa::kAvx2
                                                                       : NormalsIsa::kScalar;
  internal::NormalsOfIsa(isa, seed, stream, first, out);
}

}  // namespace attest
