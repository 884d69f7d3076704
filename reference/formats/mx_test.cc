// Tests of MX block quantization (mx.h; OCP MX v1.0 §6.3, torchao mx_tensor.py `to_mx`,
// TransformerEngine ptx.cuh `float_to_e8m0`): each scale mode against an independent formula
// over a stratified amax sweep, the named library disagreements, identities, policies, axes
// and partial blocks.
#include "reference/formats/mx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "reference/formats/format.h"
#include "reference/formats/quantize.h"

namespace attest {
namespace {

constexpr Format kMxElements[] = {Format::kE4M3FN, Format::kE5M2, Format::kE3M2FN, Format::kE2M3FN,
                                  Format::kE2M1FN};
constexpr ScaleMode kModes[] = {ScaleMode::kFloor, ScaleMode::kCeil, ScaleMode::kRceil,
                                ScaleMode::kEven};

// ---- Independent formulas, written from the sources' prose with double arithmetic. ----

// amax = m * 2^e with e = max(floor(log2 amax), -127), so fp32 subnormals have e = -127 and
// m in [0, 2) (the spec's "fp32-subnormal amax -> -127").
void Split(float amax, int* e, double* m) {
  const double a = amax;
  *e = a < std::ldexp(1.0, -126) ? -127 : std::ilogb(a);
  *m = a / std::ldexp(1.0, *e);
}

int ClampToByte(int shared) {
  if (shared < -127) shared = -127;
  if (shared > 128) shared = 128;
  return shared + 127;
}

int ExpectedScale(float amax, Format f, ScaleMode mode) {
  if (std::isnan(amax)) return 0xFF;
  const int emax = Spec(f).max_exponent();
  if (mode == ScaleMode::kRceil) {
    // ceil_pow2(fl32(amax * fl32(1/max))): the product of two floats is exact in double,
    // and the cast to float is the fp32 multiply's single rounding.
    if (std::isinf(amax)) return 0xFE;
    const double rcp = static_cast<float>(1.0 / MaxFinite(f));
    const double d = static_cast<float>(static_cast<double>(amax) * rcp);
    if (d == 0) return 0;
    int x;
    const double m = std::frexp(d, &x);  // d = m 2^x, m in [0.5, 1)
    int k = m == 0.5 ? x - 1 : x;        // smallest k with 2^k >= d
    if (k < -127) k = -127;
    if (k > 127) k = 127;  // satfinite
    return k + 127;
  }
  if (std::isinf(amax)) return 0xFF;
  if (amax == 0) return 0;
  int e;
  double m;
  Split(amax, &e, &m);
  if (mode == ScaleMode::kCeil && m != 1.0 && !(e == -127 && m == 0)) e += 1;
  if (mode == ScaleMode::kEven) {
    const int mbits = Spec(f).mantissa_bits;
    // Round the significand to mbits fraction bits, ties up (the add-then-truncate).
    const double r = std::floor(m * std::ldexp(1.0, mbits) + 0.5) / std::ldexp(1.0, mbits);
    if (r >= 2.0) {
      e += 1;
      if (e == 128) return 0xFF;  // torchao: rounded amax is Inf
    }
  }
  return ClampToByte(e - emax);
}

// Every binade boundary of fp32 and every RCEIL boundary (max * 2^k) ±1 ulp, subnormals,
// the largest values, zero and the specials.
std::vector<float> StratifiedAmax(Format f) {
  std::vector<float> out;
  const float inf = std::numeric_limits<float>::infinity();
  auto add3 = [&](float v) {
    if (!(v > 0) || std::isinf(v)) return;
    out.push_back(std::nextafter(v, 0.0f));
    out.push_back(v);
    out.push_back(std::nextafter(v, inf));
  };
  for (int k = -149; k <= 127; ++k) {
    add3(std::ldexp(1.0f, k));
    add3(static_cast<float>(std::ldexp(MaxFinite(f), k)));
    // EVEN's carry point: (2 - 2^-(mbits+1)) 2^k.
    add3(static_cast<float>(std::ldexp(2.0 - std::ldexp(1.0, -(Spec(f).mantissa_bits + 1)), k)));
    add3(std::ldexp(1.5f, k));
  }
  for (uint32_t bits : {0x00000001u, 0x00000002u, 0x003FFFFFu, 0x00400000u, 0x00400001u,
                        0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F000000u, 0x7EFFFFFFu}) {
    out.push_back(std::bit_cast<float>(bits));
  }
  out.push_back(0.0f);
  out.push_back(inf);
  out.push_back(std::numeric_limits<float>::quiet_NaN());
  // A seeded uniform sample of bit patterns on top.
  std::mt19937 rng(20260);
  for (int i = 0; i < 20000; ++i) {
    out.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x7FFFFFFFu));
  }
  return out;
}

TEST(MxScale, EveryModeMatchesItsIndependentFormulaOnAStratifiedAmaxSweep) {
  size_t checked = 0;
  for (Format f : kMxElements) {
    const std::vector<float> amax = StratifiedAmax(f);
    for (ScaleMode mode : kModes) {
      for (float a : amax) {
        ASSERT_EQ(MxScaleCode(a, f, mode), ExpectedScale(a, f, mode))
            << Name(f) << " " << Name(mode) << " amax " << std::hexfloat << a;
        ++checked;
      }
    }
  }
  std::printf("checked %zu (format, mode, amax) triples\n", checked);
}

TEST(MxScale, ModesDisagreeWhereTheLibrariesDo) {
  // Bytes: 127 = 2^0, 128 = 2^1.
  // E4M3 amax 500: FLOOR 2^0 (the element saturates to 448) vs RCEIL and CEIL 2^1.
  EXPECT_EQ(MxScaleCode(500.0f, Format::kE4M3FN, ScaleMode::kFloor), 127);
  EXPECT_EQ(MxScaleCode(500.0f, Format::kE4M3FN, ScaleMode::kCeil), 128);
  EXPECT_EQ(MxScaleCode(500.0f, Format::kE4M3FN, ScaleMode::kRceil), 128);
  // EVEN rounds 500 = 1.953125 * 2^8 to 4 significant bits first: 2^9, so 2^1 as well.
  EXPECT_EQ(MxScaleCode(500.0f, Format::kE4M3FN, ScaleMode::kEven), 128);
  // E4M3 amax 448: CEIL 2^1, the others 2^0 (448 * fl(1/448) rounds to exactly 1 in fp32).
  EXPECT_EQ(MxScaleCode(448.0f, Format::kE4M3FN, ScaleMode::kCeil), 128);
  EXPECT_EQ(MxScaleCode(448.0f, Format::kE4M3FN, ScaleMode::kFloor), 127);
  EXPECT_EQ(MxScaleCode(448.0f, Format::kE4M3FN, ScaleMode::kRceil), 127);
  EXPECT_EQ(MxScaleCode(448.0f, Format::kE4M3FN, ScaleMode::kEven), 127);
  // E2M1 amax 7: FLOOR 2^0 vs RCEIL 2^1.
  EXPECT_EQ(MxScaleCode(7.0f, Format::kE2M1FN, ScaleMode::kFloor), 127);
  EXPECT_EQ(MxScaleCode(7.0f, Format::kE2M1FN, ScaleMode::kRceil), 128);
  // EVEN rounds 15.5 = 1.9375 * 2^3 up to 2^4 for E4M3 (mbits 3), FLOOR keeps 2^3.
  EXPECT_EQ(MxScaleCode(15.5f, Format::kE4M3FN, ScaleMode::kEven), 127 + 4 - 8);
  EXPECT_EQ(MxScaleCode(15.5f, Format::kE4M3FN, ScaleMode::kFloor), 127 + 3 - 8);
  // Zero, subnormal amax, the top of fp32.
  for (ScaleMode mode : kModes) {
    EXPECT_EQ(MxScaleCode(0.0f, Format::kE4M3FN, mode), 0x00) << Name(mode);
    EXPECT_EQ(MxScaleCode(1e-40f, Format::kE4M3FN, mode), 0x00) << Name(mode);
  }
  EXPECT_EQ(MxScaleCode(std::numeric_limits<float>::max(), Format::kE4M3FN, ScaleMode::kFloor),
            127 + 127 - 8);
  // torchao EVEN carries FLT_MAX into Inf and answers NaN.
  EXPECT_EQ(MxScaleCode(std::numeric_limits<float>::max(), Format::kE4M3FN, ScaleMode::kEven),
            0xFF);
  // RCEIL saturates Inf to 2^127 (TE), the others give NaN (torchao isfinite).
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(MxScaleCode(inf, Format::kE4M3FN, ScaleMode::kRceil), 0xFE);
  EXPECT_EQ(MxScaleCode(inf, Format::kE4M3FN, ScaleMode::kFloor), 0xFF);
}

Tensor Row(std::vector<double> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::FromF64({1, n}, std::move(v));
}

QuantizedTensor Mx(const Tensor& t, Format f, ScaleMode mode,
                   BlockNanPolicy nan = BlockNanPolicy::kPropagateNaN, int64_t axis = -1,
                   int64_t block = 32, MxReciprocal rcp = MxReciprocal::kExact) {
  auto q = QuantizeMx(t, {f, block, axis, mode, nan, rcp});
  EXPECT_TRUE(q.ok()) << (q.ok() ? "" : q.error().message);
  return std::move(q).value();
}

TEST(MxQuantize, E4M3Amax500SaturatesUnderFloorAndNotUnderCeilOrRceil) {
  const Tensor t = Row({500.0, 1.0});
  const QuantizedTensor floor = Mx(t, Format::kE4M3FN, ScaleMode::kFloor);
  EXPECT_EQ(floor.scales.span<uint8_t>()[0], 127);
  EXPECT_EQ(floor.codes.span<uint8_t>()[0], 0x7E);  // 448
  EXPECT_EQ(floor.dequant.span<double>()[0], 448.0);
  for (ScaleMode mode : {ScaleMode::kCeil, ScaleMode::kRceil}) {
    const QuantizedTensor q = Mx(t, Format::kE4M3FN, mode);
    EXPECT_EQ(q.scales.span<uint8_t>()[0], 128);
    // 250 lies between 240 and 256 (spacing 16): nearest is 256.
    EXPECT_EQ(q.dequant.span<double>()[0], 512.0);
    EXPECT_EQ(q.dequant.span<double>()[1], 1.0);
  }
}

TEST(MxQuantize, E2M1Amax7FloorSaturatesTo6RceilTiesTo8) {
  const Tensor t = Row({7.0, -0.75});
  const QuantizedTensor floor = Mx(t, Format::kE2M1FN, ScaleMode::kFloor);
  EXPECT_EQ(floor.codes.span<uint8_t>()[0], 0x7);  // 6, saturated
  EXPECT_EQ(floor.dequant.span<double>()[0], 6.0);
  EXPECT_EQ(floor.dequant.span<double>()[1], -1.0);  // tie 0.5|1 -> even 1
  const QuantizedTensor rceil = Mx(t, Format::kE2M1FN, ScaleMode::kRceil);
  EXPECT_EQ(rceil.scales.span<uint8_t>()[0], 128);
  EXPECT_EQ(rceil.codes.span<uint8_t>()[0], 0x6);  // 3.5 ties to even 4
  EXPECT_EQ(rceil.dequant.span<double>()[0], 8.0);
  EXPECT_EQ(rceil.dequant.span<double>()[1], -1.0);  // -0.375 -> -0.5 (nearest), * 2
}

// A seeded tensor whose blocks span many binades, with exact zeros sprinkled in.
Tensor RandomTensor(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> binade(-30, 30);
  std::vector<double> v(static_cast<size_t>(Tensor::NumElements(shape)));
  int row_scale = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 7 == 0) row_scale = binade(rng);
    v[i] = (i % 11 == 3) ? 0.0
                         : static_cast<float>(std::ldexp(normal(rng), row_scale));  // fp32 values
  }
  return Tensor::FromF64(std::move(shape), std::move(v));
}

TEST(MxQuantize, DequantIsCodeTimesScaleAndAFixedPointOfRequantization) {
  const Tensor t = RandomTensor({6, 96}, 7);
  for (Format f : kMxElements) {
    for (ScaleMode mode : kModes) {
      const QuantizedTensor q = Mx(t, f, mode);
      const auto codes = q.codes.span<uint8_t>();
      const auto scales = q.scales.span<uint8_t>();
      const auto dq = q.dequant.span<double>();
      ASSERT_EQ(q.scales.shape(), (Shape{6, 3}));
      for (size_t i = 0; i < dq.size(); ++i) {
        const int s = scales[(i / 96) * 3 + (i % 96) / 32];
        ASSERT_EQ(dq[i], std::ldexp(Decode(codes[i], f), s - 127));
      }
      // Quantizing the dequantized tensor again changes nothing that it represents.
      const QuantizedTensor again = Mx(q.dequant, f, mode);
      ASSERT_TRUE(again.dequant.BitwiseEqual(q.dequant)) << Name(f) << " " << Name(mode);
      // FLOOR re-derives the same scales and codes (the amax keeps its binade).
      if (mode == ScaleMode::kFloor) {
        EXPECT_TRUE(again.scales.BitwiseEqual(q.scales)) << Name(f);
        EXPECT_TRUE(again.codes.BitwiseEqual(q.codes)) << Name(f);
      }
    }
  }
}

TEST(MxQuantize, ElementsAreRoundedToNearestEvenAndSaturated) {
  // Against an independent element rounding: RoundTo in double of x / 2^e with saturation.
  const Tensor t = RandomTensor({4, 64}, 11);
  for (Format f : kMxElements) {
    for (ScaleMode mode : kModes) {
      const QuantizedTensor q = Mx(t, f, mode);
      const auto scales = q.scales.span<uint8_t>();
      const auto x = t.span<double>();
      const auto dq = q.dequant.span<double>();
      EncodeOptions sat;
      sat.overflow = Overflow::kSaturate;
      for (size_t i = 0; i < x.size(); ++i) {
        const int e = scales[(i / 64) * 2 + (i % 64) / 32] - 127;
        const double want = std::ldexp(RoundTo(std::ldexp(x[i], -e), f, sat), e);
        ASSERT_EQ(dq[i], want) << Name(f) << " " << Name(mode) << " x " << x[i];
      }
    }
  }
}

TEST(MxQuantize, AllZeroBlockHasScaleByteZero) {
  const Tensor t = Tensor::FromF64({2, 32}, std::vector<double>(64, 0.0));
  for (Format f : kMxElements) {
    for (ScaleMode mode : kModes) {
      const QuantizedTensor q = Mx(t, f, mode);
      EXPECT_EQ(q.scales.span<uint8_t>()[0], 0x00);
      EXPECT_EQ(q.scales.span<uint8_t>()[1], 0x00);
      for (uint8_t c : q.codes.span<uint8_t>()) EXPECT_EQ(c, 0);
      for (double d : q.dequant.span<double>()) EXPECT_EQ(d, 0.0);
    }
  }
}

TEST(MxQuantize, NanAndInfPolicies) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v(64, 1.0);
  v[3] = nan;   // block 0 holds a NaN
  v[40] = 5.0;  // block 1 finite
  const Tensor t = Row(v);
  // microxcaling / torchao: the NaN block is NaN, the other block untouched.
  for (BlockNanPolicy policy : {BlockNanPolicy::kPropagateNaN, BlockNanPolicy::kScaleNaN}) {
    const QuantizedTensor q = Mx(t, Format::kE4M3FN, ScaleMode::kFloor, policy);
    EXPECT_EQ(q.scales.span<uint8_t>()[0], 0xFF);
    for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(q.dequant.span<double>()[i]));
    EXPECT_EQ(q.scales.span<uint8_t>()[1], 127 + 2 - 8);
    EXPECT_EQ(q.dequant.span<double>()[40], 5.0);
  }
  // TransformerEngine: fmaxf drops the NaN; the NaN element alone encodes as NaN (fp8) or
  // as +max (fp4, PTX satfinite).
  const QuantizedTensor te8 = Mx(t, Format::kE4M3FN, ScaleMode::kRceil, BlockNanPolicy::kIgnoreNaN);
  EXPECT_EQ(te8.scales.span<uint8_t>()[0], MxScaleCode(1.0f, Format::kE4M3FN, ScaleMode::kRceil));
  EXPECT_EQ(te8.codes.span<uint8_t>()[3], 0x7F);
  EXPECT_TRUE(std::isnan(te8.dequant.span<double>()[3]));
  EXPECT_EQ(te8.dequant.span<double>()[4], 1.0);
  const QuantizedTensor te4 = Mx(t, Format::kE2M1FN, ScaleMode::kRceil, BlockNanPolicy::kIgnoreNaN);
  EXPECT_EQ(te4.codes.span<uint8_t>()[3], 0x7);
  // An Inf under kIgnoreNaN: RCEIL saturates the scale to 2^127 (finite elements flush to 0,
  // the Inf saturates to max); FLOOR has no finite answer and gives NaN.
  v[3] = inf;
  const QuantizedTensor te_inf =
      Mx(Row(v), Format::kE4M3FN, ScaleMode::kRceil, BlockNanPolicy::kIgnoreNaN);
  EXPECT_EQ(te_inf.scales.span<uint8_t>()[0], 0xFE);
  EXPECT_EQ(te_inf.dequant.span<double>()[3], std::ldexp(448.0, 127));
  EXPECT_EQ(te_inf.dequant.span<double>()[4], 0.0);
  const QuantizedTensor floor_inf =
      Mx(Row(v), Format::kE4M3FN, ScaleMode::kFloor, BlockNanPolicy::kIgnoreNaN);
  EXPECT_EQ(floor_inf.scales.span<uint8_t>()[0], 0xFF);
  const QuantizedTensor prop_inf = Mx(Row(v), Format::kE4M3FN, ScaleMode::kRceil);
  EXPECT_EQ(prop_inf.scales.span<uint8_t>()[0], 0xFF);
}

TEST(MxQuantize, BlockingAlongAxis0IsTheTransposeOfBlockingAlongAxis1) {
  const Tensor t = RandomTensor({70, 5}, 3);  // 70 = 2 full blocks + a partial one of 6
  const Tensor tt = t.Permute({1, 0}).Clone();
  for (Format f : kMxElements) {
    for (ScaleMode mode : kModes) {
      const QuantizedTensor a = Mx(t, f, mode, BlockNanPolicy::kPropagateNaN, 0);
      const QuantizedTensor b = Mx(tt, f, mode, BlockNanPolicy::kPropagateNaN, 1);
      ASSERT_EQ(a.scales.shape(), (Shape{3, 5}));
      EXPECT_TRUE(a.scales.Permute({1, 0}).BitwiseEqual(b.scales));
      EXPECT_TRUE(a.codes.Permute({1, 0}).BitwiseEqual(b.codes));
      EXPECT_TRUE(a.dequant.Permute({1, 0}).BitwiseEqual(b.dequant));
    }
  }
  // And along the middle axis of a rank-3 tensor, against per-slice rank-2 results.
  const Tensor t3 = RandomTensor({3, 40, 4}, 5);
  const QuantizedTensor q3 =
      Mx(t3, Format::kE4M3FN, ScaleMode::kRceil, BlockNanPolicy::kPropagateNaN, 1);
  ASSERT_EQ(q3.scales.shape(), (Shape{3, 2, 4}));
  for (int64_t i = 0; i < 3; ++i) {
    const QuantizedTensor s = Mx(t3.Select(0, i).Clone(), Format::kE4M3FN, ScaleMode::kRceil,
                                 BlockNanPolicy::kPropagateNaN, 0);
    EXPECT_TRUE(q3.dequant.Select(0, i).BitwiseEqual(s.dequant));
    EXPECT_TRUE(q3.scales.Select(0, i).BitwiseEqual(s.scales));
  }
}

TEST(MxQuantize, PartialLastBlockEqualsZeroPadding) {
  const Tensor t = RandomTensor({2, 40}, 9);
  Tensor padded = Tensor::Zeros(DType::kF64, {2, 64});
  padded.Narrow(1, 0, 40).CopyFrom(t);
  for (ScaleMode mode : kModes) {
    const QuantizedTensor q = Mx(t, Format::kE2M1FN, mode);
    const QuantizedTensor p = Mx(padded, Format::kE2M1FN, mode);
    ASSERT_EQ(q.scales.shape(), (Shape{2, 2}));
    EXPECT_TRUE(q.scales.BitwiseEqual(p.scales));
    EXPECT_TRUE(q.codes.BitwiseEqual(p.codes.Narrow(1, 0, 40)));
    EXPECT_TRUE(q.dequant.BitwiseEqual(p.dequant.Narrow(1, 0, 40)));
  }
  // Block size is a parameter: 16 along an axis of 40 gives 3 blocks.
  EXPECT_EQ(Mx(t, Format::kE4M3FN, ScaleMode::kFloor, BlockNanPolicy::kPropagateNaN, -1, 16)
                .scales.shape(),
            (Shape{2, 3}));
}

TEST(MxQuantize, TransformerEngineReciprocalOfScaleByteZeroIsOne) {
  // amax 1e-37 under RCEIL gives byte 0 (2^-127): torchao multiplies by 2^127, TE's exp2f_rcp
  // by 1, so TE flushes the block to zero.
  const Tensor t = Row({1e-37, -5e-38});
  const QuantizedTensor exact = Mx(t, Format::kE4M3FN, ScaleMode::kRceil);
  const QuantizedTensor te = Mx(t, Format::kE4M3FN, ScaleMode::kRceil, BlockNanPolicy::kIgnoreNaN,
                                -1, 32, MxReciprocal::kTransformerEngine);
  EXPECT_EQ(exact.scales.span<uint8_t>()[0], 0);
  EXPECT_EQ(te.scales.span<uint8_t>()[0], 0);
  EXPECT_NE(exact.codes.span<uint8_t>()[0], 0);
  EXPECT_EQ(te.codes.span<uint8_t>()[0], 0);
  EXPECT_EQ(te.dequant.span<double>()[1], 0.0);
  EXPECT_EQ(MxElementFactor(254, MxReciprocal::kTransformerEngine), 0.0f);
  EXPECT_EQ(MxElementFactor(254, MxReciprocal::kExact), std::ldexp(1.0f, -127));
}

TEST(MxQuantize, RejectsBadOptions) {
  const Tensor t = Row({1.0});
  EXPECT_FALSE(QuantizeMx(t, {Format::kBF16}).ok());
  EXPECT_FALSE(QuantizeMx(t, {Format::kE4M3FN, 0}).ok());
  MxOptions bad_axis;
  bad_axis.axis = 2;
  const auto r = QuantizeMx(t, bad_axis);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("axis 2"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace attest
