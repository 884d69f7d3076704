// Tests of the scheme registry and Quantize() (quantize.h; docs/design.md scheme names).
#include "reference/formats/quantize.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "reference/formats/mx.h"
#include "reference/formats/nvfp4.h"

namespace attest {
namespace {

TEST(ElementCodec, EqualsEncodeF32OnEveryTableBucketMidpointAndAStratifiedSample) {
  EncodeOptions sat;
  sat.overflow = Overflow::kSaturate;
  sat.nan = NanPolicy::kDropSign;
  size_t checked = 0;
  for (Format f :
       {Format::kE4M3FN, Format::kE5M2, Format::kE3M2FN, Format::kE2M3FN, Format::kE2M1FN}) {
    const ElementCodec& codec = CodecFor(f);
    auto check = [&](float v) {
      ASSERT_EQ(codec.Encode(v), EncodeF32(v, f, sat).code) << Name(f) << " " << std::hexfloat << v;
      ++checked;
    };
    // Every representable value and midpoint, ±1 ulp, both signs; then the specials.
    const uint64_t top = Spec(f).max_finite_code();
    for (uint64_t c = 0; c <= top; ++c) {
      for (double v : {Decode(c, f), c < top ? (Decode(c, f) + Decode(c + 1, f)) / 2 : 0.0,
                       Decode(top, f) * 1.5}) {
        for (float s : {1.0f, -1.0f}) {
          const float x = s * static_cast<float>(v);
          check(x);
          check(std::nextafter(x, 0.0f));
          check(std::nextafter(x, s * std::numeric_limits<float>::infinity()));
        }
      }
    }
    for (float v :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
          std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()}) {
      check(v);
    }
    // Every bucket of the table: its lowest magnitude, the next, the highest, both signs.
    for (uint32_t bucket = 0; bucket < (1u << 16); ++bucket) {
      for (uint32_t low : {0u, 1u, 0x8000u, 0xFFFFu}) {
        check(std::bit_cast<float>((bucket << 16) | low));
      }
    }
    // Every 4093rd fp32 bit pattern (about a million per format, all binades).
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4093) {
      check(std::bit_cast<float>(static_cast<uint32_t>(bits)));
    }
  }
  std::printf("checked %zu fp32 inputs\n", checked);
}

// A zero-size tensor may have any other dim up to 2^63 - 1 (the safetensors reader accepts
// [0, 2^63 - 1]); the scale grid is then zero-size too, with ceil(dim / block) there, never a
// negative dim from an overflowing shape + block - 1.
TEST(Schemes, ZeroSizeTensorsGiveZeroSizeScalesOfNonNegativeShape) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(BlockGridShape({0, kHuge}, {1, 32}), (Shape{0, kHuge / 32 + 1}));
  EXPECT_EQ(BlockGridShape({0, 64}, {1, 32}), (Shape{0, 2}));
  EXPECT_EQ(BlockGridShape({65, 0}, {32, 1}), (Shape{3, 0}));
  for (const Scheme& scheme : AllSchemes()) {
    SchemeOptions o;
    o.scheme = std::string(scheme.name);
    auto q = Quantize(Tensor::Zeros(DType::kF32, {0, kHuge}), o);
    ASSERT_TRUE(q.ok()) << scheme.name << ": " << q.error().message;
    EXPECT_EQ(q->codes.numel(), 0) << scheme.name;
    EXPECT_EQ(q->scales.numel(), 0) << scheme.name;
    for (int64_t d : q->scales.shape()) EXPECT_GE(d, 0) << scheme.name;
  }
}

TEST(Schemes, RegistryHoldsExactlyTheDesignNames) {
  std::set<std::string> names;
  for (const Scheme& s : AllSchemes()) names.insert(std::string(s.name));
  EXPECT_EQ(names, (std::set<std::string>{"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3",
                                          "mxfp4", "nvfp4", "fp8-tensor-e4m3", "fp8-block-e4m3"}));
  EXPECT_EQ(FindScheme("nope"), nullptr);
  for (std::string_view m : {"floor", "ceil", "rceil", "even"}) {
    ASSERT_TRUE(ParseScaleMode(m).has_value());
    EXPECT_EQ(Name(*ParseScaleMode(m)), m);
  }
  EXPECT_FALSE(ParseScaleMode("round").has_value());
  EXPECT_EQ(ParseBlockNanPolicy("scale"), BlockNanPolicy::kPropagateNaN);
  EXPECT_EQ(ParseNvfp4Variant("torchao"), Nvfp4Variant::kTorchao);
}

TEST(Schemes, EveryRowQuantizesWithItsDTypesAndShapes) {
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  std::vector<double> v(3 * 256);
  for (auto& e : v) e = static_cast<float>(normal(rng));
  const Tensor t = Tensor::FromF64({3, 256}, v);
  struct Want {
    std::string_view scheme;
    DType codes, scales;
    Shape scale_shape;
  };
  const Want wants[] = {
      {"mxfp8-e4m3", DType::kE4M3FN, DType::kE8M0FNU, {3, 8}},
      {"mxfp8-e5m2", DType::kE5M2, DType::kE8M0FNU, {3, 8}},
      {"mxfp6-e3m2", DType::kU8, DType::kE8M0FNU, {3, 8}},
      {"mxfp6-e2m3", DType::kU8, DType::kE8M0FNU, {3, 8}},
      {"mxfp4", DType::kU8, DType::kE8M0FNU, {3, 8}},
      {"nvfp4", DType::kU8, DType::kE4M3FN, {3, 16}},
      {"fp8-tensor-e4m3", DType::kE4M3FN, DType::kF32, {1, 1}},
      {"fp8-block-e4m3", DType::kE4M3FN, DType::kF32, {3, 2}},
  };
  for (const Want& w : wants) {
    SchemeOptions o;
    o.scheme = std::string(w.scheme);
    auto q = Quantize(t, o);
    ASSERT_TRUE(q.ok()) << w.scheme << ": " << q.error().message;
    EXPECT_EQ(q->scheme, w.scheme);
    EXPECT_EQ(q->codes.dtype(), w.codes) << w.scheme;
    EXPECT_EQ(q->scales.dtype(), w.scales) << w.scheme;
    EXPECT_EQ(q->scales.shape(), w.scale_shape) << w.scheme;
    EXPECT_EQ(q->dequant.shape(), t.shape());
    EXPECT_EQ(q->tensor_scale.defined(), w.scheme == "nvfp4");
    // Relative error of the dequantization, printed for the record.
    double num = 0, den = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      num += std::pow(q->dequant.span<double>()[i] - v[i], 2);
      den += v[i] * v[i];
    }
    std::printf("%-16s relative RMS error %.3e\n", o.scheme.c_str(), std::sqrt(num / den));
    // Half a relative step of the element format bounds the RMS error of Gaussian data.
    EXPECT_LT(std::sqrt(num / den), 0.5 * std::ldexp(1.0, -Spec(q->element).mantissa_bits));
  }
}

TEST(Schemes, InputsAreRoundedToFp32FirstAndMayBeViewsOrNarrowDTypes) {
  // 1 + 2^-30 is not an fp32 value: the libraries see fl32(x) = 1.
  SchemeOptions o;
  o.scale_mode = ScaleMode::kRceil;
  auto q = Quantize(Tensor::FromF64({1, 2}, {1.0 + 0x1p-30, 0x1p-30}), o);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->dequant.span<double>()[0], 1.0);
  // A strided view quantizes like its contiguous copy.
  std::vector<double> v(4 * 64);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::ldexp(static_cast<double>(i % 29) - 14, static_cast<int>(i % 5));
  const Tensor t = Tensor::FromF64({4, 64}, v);
  const Tensor view = t.Permute({1, 0});
  o.axis = 0;
  auto a = Quantize(view, o);
  auto b = Quantize(view.Clone(), o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->codes.BitwiseEqual(b->codes));
  EXPECT_TRUE(a->scales.BitwiseEqual(b->scales));
  // A bf16 tensor is widened exactly (bf16 values are fp32 values).
  auto bf16 = FromF64(t, DType::kBF16);
  ASSERT_TRUE(bf16.ok());
  o.axis = -1;
  auto c = Quantize(*bf16, o);
  auto d = Quantize(ToF64(*bf16), o);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_TRUE(c->dequant.BitwiseEqual(d->dequant));
}

TEST(Schemes, OptionsReachTheQuantizersAndAreEchoed) {
  const Tensor t = Tensor::FromF64({1, 2}, {500.0, 1.0});
  SchemeOptions o;
  auto floor = Quantize(t, o);
  ASSERT_TRUE(floor.ok());
  EXPECT_EQ(floor->options.scale_mode, ScaleMode::kFloor);
  EXPECT_EQ(floor->options.block_size, 32);
  EXPECT_EQ(floor->scales.span<uint8_t>()[0], 127);
  o.scale_mode = ScaleMode::kRceil;
  auto rceil = Quantize(t, o);
  ASSERT_TRUE(rceil.ok());
  EXPECT_EQ(rceil->scales.span<uint8_t>()[0], 128);
  o.axis = 0;
  auto axis0 = Quantize(t, o);
  ASSERT_TRUE(axis0.ok());
  EXPECT_EQ(axis0->scales.shape(), (Shape{1, 2}));
  o.axis = 3;
  auto bad = Quantize(t, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("mxfp8-e4m3"), std::string::npos);
  o.scheme = "mxfp9";
  auto unknown = Quantize(t, o);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("mxfp9"), std::string::npos);
}

}  // namespace
}  // namespace attest
