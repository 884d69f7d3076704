// Unit tests of the element formats (format.h): table facts against OCP OFP8 / OCP MX v1.0 /
// IEEE 754, every encoding of every format of <= 16 bits decoded and re-encoded under every
// rounding mode and overflow policy, NaN/overflow/underflow policies, flags, the stochastic
// rounding bit convention, single rounding from double, and the tensor-level functions.
#include "reference/formats/format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/formats/format_test_util.h"
#include "reference/formats/fp32_table_encoder.h"

namespace attest {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr Format kSmallFormats[] = {Format::kBF16,   Format::kF16,    Format::kE4M3FN,
                                    Format::kE5M2,   Format::kE3M2FN, Format::kE2M3FN,
                                    Format::kE2M1FN, Format::kE8M0FNU};
constexpr Rounding kAllRoundings[] = {Rounding::kNearestEven, Rounding::kTowardZero,
                                      Rounding::kUp,          Rounding::kDown,
                                      Rounding::kNearestAway, Rounding::kStochastic};
constexpr Overflow kAllOverflows[] = {Overflow::kSaturate, Overflow::kInf, Overflow::kNan,
                                      Overflow::kDefault};

uint64_t Code(double x, Format f, EncodeOptions o = {}) { return Encode(x, f, o).code; }

TEST(FormatTable, ExtremesMatchThePublishedTables) {
  // OCP OFP8 v1.0 Table 1; OCP MX v1.0 Tables 2-4 and §5.4.1; IEEE 754 binary16/32/64.
  struct Row {
    Format f;
    double max, min_normal, min_positive;
    int bits;
  };
  const Row rows[] = {
      {Format::kF64, std::numeric_limits<double>::max(), 0x1p-1022, 0x1p-1074, 64},
      {Format::kF32, std::numeric_limits<float>::max(), 0x1p-126, 0x1p-149, 32},
      {Format::kBF16, 0x1.FEp127, 0x1p-126, 0x1p-133, 16},
      {Format::kF16, 65504.0, 0x1p-14, 0x1p-24, 16},
      {Format::kE4M3FN, 448.0, 0x1p-6, 0x1p-9, 8},
      {Format::kE5M2, 57344.0, 0x1p-14, 0x1p-16, 8},
      {Format::kE3M2FN, 28.0, 0x1p-2, 0x1p-4, 6},
      {Format::kE2M3FN, 7.5, 1.0, 0.125, 6},
      {Format::kE2M1FN, 6.0, 1.0, 0.5, 4},
      {Format::kE8M0FNU, 0x1p127, 0x1p-127, 0x1p-127, 8},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::string(Name(r.f)));
    EXPECT_EQ(MaxFinite(r.f), r.max);
    EXPECT_EQ(MinNormal(r.f), r.min_normal);
    EXPECT_EQ(MinPositive(r.f), r.min_positive);
    EXPECT_EQ(Spec(r.f).bits(), r.bits);
    EXPECT_EQ(ParseFormat(Name(r.f)), r.f);
  }
  // E2M1 codes 0-7 = 0, .5, 1, 1.5, 2, 3, 4, 6 (OCP MX v1.0 §5.3.3).
  const double e2m1[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint64_t c = 0; c < 8; ++c) {
    EXPECT_EQ(Decode(c, Format::kE2M1FN), e2m1[c]);
    EXPECT_EQ(Decode(c | 8, Format::kE2M1FN), -e2m1[c]);
  }
  EXPECT_EQ(Decode(0x00, Format::kE8M0FNU), 0x1p-127);
  EXPECT_EQ(Decode(0x7F, Format::kE8M0FNU), 1.0);
  EXPECT_TRUE(std::isnan(Decode(0xFF, Format::kE8M0FNU)));
  EXPECT_TRUE(std::isnan(Decode(0x7F, Format::kE4M3FN)));
  EXPECT_TRUE(std::isnan(Decode(0xFF, Format::kE4M3FN)));
  EXPECT_EQ(Decode(0x7C, Format::kE5M2), kInf);
  EXPECT_TRUE(std::isnan(Decode(0x7D, Format::kE5M2)));
}

TEST(FormatTable, NamesAndDTypes) {
  EXPECT_EQ(ParseFormat("float8_e4m3fn"), Format::kE4M3FN);
  EXPECT_EQ(ParseFormat("fp4"), Format::kE2M1FN);
  EXPECT_EQ(ParseFormat("e4m3fnuz"), std::nullopt);
  EXPECT_EQ(FormatOf(DType::kE8M0FNU), Format::kE8M0FNU);
  EXPECT_EQ(FormatOf(DType::kU8), std::nullopt);
  EXPECT_EQ(DTypeOf(Format::kE2M1FN), std::nullopt);
  EXPECT_EQ(DTypeOf(Format::kBF16), DType::kBF16);
  for (const FormatSpec& s : AllFormats()) {
    if (const auto d = DTypeOf(s.format)) EXPECT_EQ(Name(*d), s.name);
  }
  EXPECT_EQ(ParseRounding("rna"), Rounding::kNearestAway);
  EXPECT_EQ(ParseRounding("stochastic"), Rounding::kStochastic);
  EXPECT_EQ(ParseRounding("up"), std::nullopt);
}

// Decode agrees with the independently written value table of format_test_util.h.
TEST(FormatDecode, AgreesWithIndependentValueTable) {
  for (Format f : kSmallFormats) {
    SCOPED_TRACE(std::string(Name(f)));
    const testing::RefEncoder ref(f);
    const auto& values = ref.values();
    for (uint64_t c = 0; c < values.size(); ++c) {
      // Finite codes are dense from 0 (specials sit at the top of each half).
      EXPECT_EQ(Decode(c, f), values[c]) << "code " << c;
      if (Spec(f).is_signed) EXPECT_EQ(Decode(c | ref.sign_bit(), f), -values[c]);
    }
    EXPECT_EQ(Spec(f).max_finite_code(), ref.max_code());
  }
}

// Every code of every format of <= 16 bits survives Decode -> Encode under every rounding
// mode, overflow policy and (for NaN codes) NaN policy, with no flags for finite codes.
TEST(FormatRoundTrip, EveryEncodingEveryModeIsTheIdentity) {
  int64_t checked = 0;
  for (Format f : kSmallFormats) {
    const FormatSpec& s = Spec(f);
    for (uint64_t code = 0; code <= s.code_mask(); ++code) {
      const double v = Decode(code, f);
      const bool negative = (code & s.sign_mask()) != 0;
      for (Rounding r : kAllRoundings) {
        for (uint32_t rbits : {0u, 0x80000000u, 0xFFFFFFFFu}) {
          if (r != Rounding::kStochastic && rbits != 0) continue;
          for (Overflow ov : kAllOverflows) {
            for (NanPolicy np : {NanPolicy::kKeepSign, NanPolicy::kDropSign}) {
              EncodeOptions o;
              o.rounding = r;
              o.overflow = ov;
              o.random_bits = rbits;
              o.nan = np;
              const EncodeResult e = Encode(v, f, o);
              ++checked;
              if (IsNanCode(code, f)) {
                const uint64_t want =
                    ((negative && np == NanPolicy::kKeepSign) ? s.sign_mask() : 0) |
                    s.canonical_nan;
                ASSERT_EQ(e.code, want) << Name(f) << " NaN code " << code;
                ASSERT_EQ(e.flags, kFlagInvalid);
              } else if (IsInfCode(code, f) &&
                         (ov == Overflow::kSaturate || ov == Overflow::kNan)) {
                // Inf is exact but the policy asks for a finite value or NaN.
                ASSERT_NE(e.code, code);
              } else {
                ASSERT_EQ(e.code, code) << Name(f) << " code " << code << " rounding " << Name(r)
                                        << " overflow " << static_cast<int>(ov);
                ASSERT_EQ(e.flags, kFlagNone) << Name(f) << " code " << code;
              }
            }
          }
        }
      }
    }
  }
  std::printf("[ roundtrip] %lld (code, mode, policy) combinations\n",
              static_cast<long long>(checked));
}

// f32 and f64 codes round-trip too (a stride through their code space).
TEST(FormatRoundTrip, WideFormatsSampled) {
  for (uint64_t c = 0; c < (uint64_t{1} << 32); c += 65521) {
    const double v = Decode(c, Format::kF32);
    const float f = std::bit_cast<float>(static_cast<uint32_t>(c));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(v, static_cast<double>(f));
    EXPECT_EQ(Code(v, Format::kF32), c);
  }
  for (double v : {0.0, -0.0, 1.0, 0x1p-1074, -0x1p-1022, 0x1.fffffffffffffp1023, kInf}) {
    EXPECT_EQ(Code(v, Format::kF64), std::bit_cast<uint64_t>(v));
    EXPECT_EQ(Encode(v, Format::kF64).flags, kFlagNone);
  }
}

TEST(FormatEncode, E4M3OverflowThresholdAndPolicies) {
  // 464 is the midpoint of 448 (0x7E, mantissa 110 even) and the unbounded successor 480.
  EXPECT_EQ(Code(464.0, Format::kE4M3FN), 0x7Eu);
  EXPECT_EQ(Code(std::nextafter(464.0, kInf), Format::kE4M3FN), 0x7Fu);
  EXPECT_EQ(Code(-1e30, Format::kE4M3FN), 0xFFu);
  EXPECT_EQ(Code(-1e30, Format::kE4M3FN, {.overflow = Overflow::kSaturate}), 0xFEu);
  EXPECT_EQ(Code(kInf, Format::kE4M3FN, {.overflow = Overflow::kSaturate}), 0x7Eu);
  EXPECT_EQ(Code(kInf, Format::kE4M3FN), 0x7Fu);
  EXPECT_EQ(Code(-kNaN, Format::kE4M3FN), 0xFFu);
  EXPECT_EQ(Code(-kNaN, Format::kE4M3FN, {.nan = NanPolicy::kDropSign}), 0x7Fu);
  // IEEE §7.4: toward-zero directions deliver max finite even without saturation.
  EXPECT_EQ(Code(1000.0, Format::kE4M3FN, {.rounding = Rounding::kTowardZero}), 0x7Eu);
  EXPECT_EQ(Code(1000.0, Format::kE4M3FN, {.rounding = Rounding::kUp}), 0x7Fu);
  EXPECT_EQ(Code(-1000.0, Format::kE4M3FN, {.rounding = Rounding::kUp}), 0xFEu);
  const EncodeResult r = Encode(500.0, Format::kE4M3FN);
  EXPECT_EQ(r.flags, kFlagOverflow | kFlagInexact);
}

TEST(FormatEncode, E5M2OverflowPolicies) {
  EXPECT_EQ(Code(61439.0, Format::kE5M2), 0x7Bu);
  EXPECT_EQ(Code(61440.0, Format::kE5M2), 0x7Cu);  // tie, 57344 has odd mantissa 11
  EXPECT_EQ(Code(61440.0, Format::kE5M2, {.overflow = Overflow::kSaturate}), 0x7Bu);
  EXPECT_EQ(Code(61440.0, Format::kE5M2, {.overflow = Overflow::kNan}), 0x7Eu);
  EXPECT_EQ(Code(-1e9, Format::kE5M2, {.rounding = Rounding::kDown}), 0xFCu);
  EXPECT_EQ(Code(-1e9, Format::kE5M2, {.rounding = Rounding::kTowardZero}), 0xFBu);
  EXPECT_EQ(Code(kNaN, Format::kE5M2), 0x7Eu);
}

TEST(FormatEncode, FormatsWithoutSpecials) {
  // fp6/fp4 have neither Inf nor NaN: overflow and Inf saturate; NaN -> max finite with the
  // policy's sign (PTX satfinite: +max), flagged invalid.
  EXPECT_EQ(Code(1e30, Format::kE2M1FN), 0x7u);
  EXPECT_EQ(Code(-kInf, Format::kE2M1FN), 0xFu);
  EXPECT_EQ(Encode(-kInf, Format::kE2M1FN).flags, kFlagOverflow | kFlagInexact);
  EXPECT_EQ(Code(-kNaN, Format::kE2M1FN), 0xFu);
  EXPECT_EQ(Code(-kNaN, Format::kE2M1FN, {.nan = NanPolicy::kDropSign}), 0x7u);
  EXPECT_EQ(Encode(kNaN, Format::kE3M2FN).flags, kFlagInvalid);
  EXPECT_EQ(Code(29.0, Format::kE3M2FN), 0x1Fu);  // 28 + half ulp 2 = 30 is the tie
  EXPECT_EQ(Code(7.75, Format::kE2M3FN), 0x1Fu);  // saturates at 7.5
  EXPECT_EQ(Code(0.25, Format::kE2M1FN), 0x0u);   // tie to even: 0
  EXPECT_EQ(Code(0.75, Format::kE2M1FN), 0x2u);   // tie between .5 (odd) and 1 (even)
  EXPECT_EQ(Code(5.0, Format::kE2M1FN), 0x6u);    // tie between 4 (even) and 6
  EXPECT_EQ(Code(-0.0, Format::kE2M1FN), 0x8u);
}

TEST(FormatEncode, E8M0Quirks) {
  const Format f = Format::kE8M0FNU;
  EXPECT_EQ(Code(0.0, f), 0xFFu);  // no zero (ml_dtypes: NaN)
  EXPECT_EQ(Code(-0.0, f), 0xFFu);
  EXPECT_EQ(Code(-1.0, f), 0xFFu);  // no sign
  EXPECT_EQ(Encode(-1.0, f).flags, kFlagInvalid);
  EXPECT_EQ(Code(1.5, f), 0x80u);  // one-digit significand: ties go up
  EXPECT_EQ(Code(0.75, f), 0x7Fu);
  EXPECT_EQ(Code(0x1.7ffffp0, f), 0x7Fu);
  EXPECT_EQ(Code(0x1p-140, f), 0x00u);  // nothing below 2^-127
  EXPECT_EQ(Encode(0x1p-140, f).flags, kFlagInexact | kFlagUnderflow);
  // cvt.rz / cvt.rp (.satfinite) ue8m0 semantics.
  EXPECT_EQ(Code(0x1.fffffep0, f, {.rounding = Rounding::kTowardZero}), 0x7Fu);
  EXPECT_EQ(Code(0x1.000002p0, f, {.rounding = Rounding::kUp}), 0x80u);
  EXPECT_EQ(Code(0x1.000002p127, f, {.rounding = Rounding::kUp}), 0xFFu);
  EXPECT_EQ(Code(0x1.000002p127, f, {.rounding = Rounding::kUp, .overflow = Overflow::kSaturate}),
            0xFEu);
  EXPECT_EQ(Code(kInf, f, {.overflow = Overflow::kSaturate}), 0xFEu);
  EXPECT_EQ(Code(0x1.8p127, f), 0xFFu);  // the tie rounds up, past 2^127
}

TEST(FormatEncode, RoundsOnceFromDouble) {
  // Just above the bf16 midpoint of 1 and 1 + 2^-7: through float it would first become
  // the midpoint 1 + 2^-8 and then tie to 1; rounded once it goes up.
  const double x = 1.0 + 0x1p-8 + 0x1p-40;
  EXPECT_EQ(static_cast<float>(x), 1.0f + 0x1p-8f);
  EXPECT_EQ(Code(x, Format::kBF16), 0x3F81u);
  EXPECT_EQ(Code(static_cast<float>(x), Format::kBF16), 0x3F80u);
  EXPECT_EQ(Code(1.0 + 0x1p-4 + 0x1p-52, Format::kE4M3FN), 0x39u);
  EXPECT_EQ(RoundTo(1.0 + 0x1p-4 + 0x1p-52, Format::kE4M3FN), 1.125);
  EXPECT_EQ(RoundTo(1.0 + 0x1p-4, Format::kE4M3FN), 1.0);
}

TEST(FormatEncode, StochasticBitConvention) {
  // 1 + 2^-4 is half an e4m3 ulp above 1: F = floor(0.5 · 2^32) = 2^31.
  const double x = 1.0 + 0x1p-4;
  auto sr = [](uint32_t bits) {
    return EncodeOptions{.rounding = Rounding::kStochastic, .random_bits = bits};
  };
  EXPECT_EQ(Code(x, Format::kE4M3FN, sr(0x7FFFFFFFu)), 0x38u);
  EXPECT_EQ(Code(x, Format::kE4M3FN, sr(0x80000000u)), 0x39u);
  // 1 + 2^-5 is a quarter ulp (ulp 2^-3): up iff random_bits >= 3 · 2^30.
  EXPECT_EQ(Code(1.0 + 0x1p-5, Format::kE4M3FN, sr(0xBFFFFFFFu)), 0x38u);
  EXPECT_EQ(Code(1.0 + 0x1p-5, Format::kE4M3FN, sr(0xC0000000u)), 0x39u);
  EXPECT_EQ(Code(-(1.0 + 0x1p-5), Format::kE4M3FN, sr(0xC0000000u)), 0xB9u);
  // Exact values never move.
  EXPECT_EQ(Code(1.0, Format::kE4M3FN, sr(0xFFFFFFFFu)), 0x38u);
  // Over an evenly spaced set of random bits, P(up) is the discarded fraction exactly.
  int ups = 0;
  for (uint32_t k = 0; k < 1024; ++k) {
    ups += Code(1.0 + 0x1p-5 * 1.5, Format::kE4M3FN, sr(k << 22)) == 0x39u ? 1 : 0;
  }
  EXPECT_EQ(ups, 384);  // 3/8 of 1024
}

TEST(FormatEncode, FlagsUnderflowAndFlush) {
  EXPECT_EQ(Encode(1.0, Format::kE4M3FN).flags, kFlagNone);
  EXPECT_EQ(Encode(1.1, Format::kE4M3FN).flags, kFlagInexact);
  EXPECT_EQ(Encode(0x1p-9, Format::kE4M3FN).flags, kFlagNone);  // exact subnormal
  EXPECT_EQ(Encode(0x1.8p-9, Format::kE4M3FN).flags, kFlagInexact | kFlagUnderflow);
  EXPECT_EQ(Code(0x1p-11, Format::kE4M3FN), 0x00u);
  EXPECT_EQ(Code(-0x1p-11, Format::kE4M3FN), 0x80u);
  EXPECT_EQ(Code(-0x1p-11, Format::kE4M3FN, {.rounding = Rounding::kDown}), 0x81u);
  const EncodeOptions ftz{.flush_subnormals = true};
  EXPECT_EQ(Code(0x1p-7, Format::kE4M3FN, ftz), 0x00u);
  EXPECT_EQ(Code(-0x1p-7, Format::kE4M3FN, ftz), 0x80u);
  EXPECT_EQ(Encode(0x1p-7, Format::kE4M3FN, ftz).flags, kFlagInexact | kFlagUnderflow);
  EXPECT_EQ(Code(0x1p-6, Format::kE4M3FN, ftz), 0x08u);    // min normal stays
  EXPECT_EQ(Code(0x1.fp-7, Format::kE4M3FN, ftz), 0x08u);  // rounds up to min normal
  EXPECT_EQ(Code(0x1p-149, Format::kF32), 0x1u);
  EXPECT_EQ(Code(0x1p-150, Format::kF32), 0x0u);
  EXPECT_EQ(Code(0x1.0000001p-150, Format::kF32), 0x1u);
}

// A small, sanitizer-friendly version of format_sweep_test's TableEncoderSweep.
TEST(Fp32TableEncoder, EqualsEncodeF32OnBoundariesAndASample) {
  for (Format f : {Format::kBF16, Format::kE4M3FN, Format::kE2M1FN, Format::kE8M0FNU}) {
    for (Rounding r : {Rounding::kNearestEven, Rounding::kUp, Rounding::kDown}) {
      const EncodeOptions o{.rounding = r};
      const auto table = Fp32TableEncoder::Make(f, o);
      ASSERT_TRUE(table.ok());
      std::vector<float> inputs = testing::BoundaryInputs(testing::RefEncoder(f));
      for (uint64_t b = 11; b < (uint64_t{1} << 32); b += 1'000'003) {
        inputs.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
      }
      for (float x : inputs) {
        ASSERT_EQ(table->Encode(x), EncodeF32(x, f, o).code)
            << Name(f) << " " << Name(r) << " x=" << std::hexfloat << x;
      }
    }
  }
}

TEST(FormatTensor, RoundTensorIsRoundToOnEveryElement) {
  // RoundTensor rounds f32, bf16 and f16 without encoding (format.cc NearestIeee) and splits
  // large tensors across threads: every element must still be RoundTo's, bit for bit. Inputs:
  // every binade from below the subnormals to past the overflow threshold, exact ties and
  // their neighbours on every format's grid, signed zeros, double subnormals, Inf and NaN.
  std::mt19937_64 rng(7);
  std::vector<double> x;
  for (int i = 0; i < (1 << 18); ++i) {
    const int e = static_cast<int>(rng() % 340) - 180;  // 2^-180 .. 2^159
    const double v = std::ldexp(1.0 + static_cast<double>(rng() >> 12) * 0x1p-52, e);
    x.push_back((rng() & 1) ? -v : v);
  }
  for (Format f : {Format::kF32, Format::kBF16, Format::kF16}) {
    const FormatSpec& spec = Spec(f);
    for (int e = spec.min_normal_exponent() - spec.mantissa_bits - 2;
         e <= spec.max_exponent() + 1; ++e) {
      const double ulp = std::ldexp(1.0, std::max(e, spec.min_normal_exponent()) -
                                             spec.mantissa_bits);
      for (int k = 0; k < 4; ++k) {
        const double m = std::ldexp(1.0, e) + ulp * static_cast<double>(k);
        for (double t : {m + ulp / 2, m - ulp / 2, std::nextafter(m + ulp / 2, 0.0),
                         std::nextafter(m + ulp / 2, kInf)}) {
          x.push_back(t);
          x.push_back(-t);
        }
      }
    }
    const double top = MaxFinite(f);
    const double half = std::ldexp(1.0, spec.max_exponent() - spec.mantissa_bits - 1);
    for (double t : {top, top + half, std::nextafter(top + half, 0.0), top + 2 * half}) {
      x.push_back(t);
      x.push_back(-t);
    }
  }
  for (double t : {0.0, -0.0, 0x1p-1074, -0x1p-1074, 0x1p-1030, kInf, -kInf,
                   std::numeric_limits<double>::quiet_NaN(), 0x1p1023, -0x1.fffffffffffffp1023}) {
    x.push_back(t);
  }
  x.push_back(-std::numeric_limits<double>::quiet_NaN());
  const Tensor t = Tensor::FromF64({static_cast<int64_t>(x.size())}, x);
  for (Format f : {Format::kF32, Format::kBF16, Format::kF16, Format::kE4M3FN}) {
    for (const Tensor& in : {t, t.Narrow(0, 0, 999)}) {  // threaded and one-thread paths
      const Tensor r = RoundTensor(in, f);
      const auto got = r.span<const double>();
      // In place: the same bits over a copy of the input (threaded and one-thread paths too).
      Tensor own = Tensor::FromF64(in.shape(), std::vector<double>(x.begin(), x.begin() +
                                                                      in.numel()));
      RoundTensorInPlace(own, *DTypeOf(f));
      const auto over = own.span<const double>();
      for (size_t i = 0; i < got.size(); ++i) {
        const double want = RoundTo(x[i], f);
        ASSERT_EQ(std::bit_cast<uint64_t>(got[i]), std::bit_cast<uint64_t>(want))
            << Name(f) << " x=" << std::hexfloat << x[i];
        ASSERT_EQ(std::bit_cast<uint64_t>(over[i]), std::bit_cast<uint64_t>(want))
            << Name(f) << " in place, x=" << std::hexfloat << x[i];
      }
    }
  }
  // Only a contiguous f64 tensor is rounded in place.
  Tensor f32 = Tensor::Zeros(DType::kF32, {4});
  EXPECT_THROW(RoundTensorInPlace(f32, DType::kBF16), std::invalid_argument);
  Tensor wide = Tensor::FromF64({2, 2}, {1.0, 2.0, 3.0, 4.0});
  Tensor transposed = wide.Permute({1, 0});
  EXPECT_THROW(RoundTensorInPlace(transposed, DType::kBF16), std::invalid_argument);
  EXPECT_THROW(RoundTensorInPlace(wide, DType::kI32), std::invalid_argument);
}

TEST(FormatTensor, WidenEncodeRound) {
  Tensor bf = Tensor::Zeros(DType::kBF16, {2, 3});
  const uint16_t codes[] = {0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000, 0x4049};
  for (int i = 0; i < 6; ++i) bf.span<uint16_t>()[i] = codes[i];
  const Tensor wide = ToF64(bf);
  ASSERT_EQ(wide.dtype(), DType::kF64);
  ASSERT_EQ(wide.shape(), (Shape{2, 3}));
  EXPECT_EQ(wide.at<double>({0, 0}), 1.0);
  EXPECT_EQ(wide.at<double>({0, 1}), -2.0);
  EXPECT_EQ(wide.at<double>({0, 2}), kInf);
  EXPECT_EQ(wide.at<double>({1, 0}), 0x1p-133);
  EXPECT_TRUE(std::signbit(wide.at<double>({1, 1})));
  EXPECT_EQ(wide.at<double>({1, 2}), 3.140625);

  // Encoding the widened values gives the codes back (a transposed view too).
  const auto back = FromF64(wide.Permute({1, 0}), DType::kBF16);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->shape(), (Shape{3, 2}));
  EXPECT_EQ(back->at<uint16_t>({2, 1}), 0x4049);
  EXPECT_EQ(back->at<uint16_t>({0, 1}), 0x0001);

  Tensor ints = Tensor::Zeros(DType::kI32, {2});
  ints.span<int32_t>()[1] = -5;
  const Tensor x = Tensor::FromF64({4}, {1.0, 500.0, 0.3, -7.0});
  const auto fp8 = FromF64(x, DType::kE4M3FN, {.overflow = Overflow::kSaturate});
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->at<uint8_t>({1}), 0x7E);
  const Tensor rounded = RoundTensor(x, DType::kE4M3FN);
  EXPECT_EQ(rounded.at<double>({2}), 0.3125);
  EXPECT_TRUE(std::isnan(rounded.at<double>({1})));
  const auto fp4 = FromF64Codes(x, Format::kE2M1FN);
  ASSERT_TRUE(fp4.ok());
  EXPECT_EQ(fp4->dtype(), DType::kU8);
  EXPECT_EQ(fp4->at<uint8_t>({3}), 0xF);  // -7 saturates to -6
  EXPECT_EQ(RoundTensor(x, Format::kE2M1FN).at<double>({2}), 0.5);

  // Convert: any float input, flags counted, fp4 stored as U8 codes.
  ConversionStats stats;
  const auto conv = Convert(bf, Format::kE2M1FN, {}, &stats);
  ASSERT_TRUE(conv.ok());
  EXPECT_EQ(conv->dtype(), DType::kU8);
  EXPECT_EQ(conv->at<uint8_t>({0, 2}), 0x7);  // Inf saturates (no Inf in e2m1)
  EXPECT_EQ(conv->at<uint8_t>({1, 2}), 0x5);  // 3.140625 -> 3
  EXPECT_EQ(stats.elements, 6);
  EXPECT_EQ(stats.overflow, 1);
  EXPECT_EQ(stats.inexact, 3);  // Inf, 2^-133 (-> 0) and 3.140625
  EXPECT_EQ(stats.underflow, 1);
  EXPECT_EQ(stats.invalid, 0);
  const auto e8 = Convert(bf, Format::kE8M0FNU, {}, &stats);
  ASSERT_TRUE(e8.ok());
  EXPECT_EQ(e8->dtype(), DType::kE8M0FNU);
  EXPECT_EQ(stats.invalid, 3);  // -2, Inf (no Inf: NaN) and -0; 2^-133 clamps to 0x00
  EXPECT_EQ(stats.underflow, 1);
  EXPECT_EQ(e8->at<uint8_t>({1, 0}), 0x00);
  EXPECT_EQ(e8->at<uint8_t>({0, 0}), 0x7F);
  EXPECT_FALSE(Convert(ints, Format::kBF16).ok());

  EXPECT_FALSE(FromF64(bf, DType::kE4M3FN).ok());  // input must be f64
  EXPECT_FALSE(FromF64(x, DType::kU8).ok());
  EXPECT_FALSE(FromF64Codes(x, Format::kBF16).ok());
  EXPECT_EQ(ToF64(ints).at<double>({1}), -5.0);
}

}  // namespace
}  // namespace attest
