// Tests of the recipe table and the operand hook (recipe.h): the fast bf16/f16 rounding
// against the generic encoder of reference/formats, table validity, and the hook's schemes.
#include "reference/recipes/recipe.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

namespace attest {
namespace {

// Same value or both NaN.
bool SameValue(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(RoundElement, MatchesGenericEncoderOnRandomAndBoundaryBitPatterns) {
  std::mt19937_64 rng(20261202);
  int64_t checked = 0;
  for (Format f : {Format::kBF16, Format::kF16}) {
    auto check = [&](uint32_t bits) {
      const float x = std::bit_cast<float>(bits);
      const float want = static_cast<float>(RoundTo(static_cast<double>(x), f));
      ASSERT_TRUE(SameValue(RoundElement(x, f), want))
          << Name(f) << " x=" << x << " bits=0x" << std::hex << bits;
      ++checked;
    };
    for (int n = 0; n < 2'000'000; ++n) check(static_cast<uint32_t>(rng()));
    // Every exponent with mantissa patterns around the rounding boundaries (ties, ±1).
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t e = 0; e < 256; ++e) {
        for (uint32_t low : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFu, 0x8000u,
                             0x8001u, 0x18000u, 0xFFFFu}) {
          for (uint32_t high : {0u, 0x10000u, 0x7F0000u, 0x7FE000u, 0x3FE000u}) {
            check(sign | (e << 23) | ((high | low) & 0x7FFFFFu));
          }
        }
      }
    }
  }
  std::printf("RoundElement: %lld values agree with RoundTo\n", static_cast<long long>(checked));
}

TEST(Recipes, TableRowsAreValidAndFindable) {
  ASSERT_GE(AllRecipes().size(), 2u);
  for (const Recipe& r : AllRecipes()) {
    EXPECT_TRUE(ValidateRecipe(r).ok()) << r.name;
    EXPECT_EQ(FindRecipe(r.name), &r);
    EXPECT_FALSE(r.input_dtypes.empty()) << r.name;
  }
  ASSERT_NE(FindRecipe("bf16"), nullptr);
  ASSERT_NE(FindRecipe("f16"), nullptr);
  EXPECT_EQ(FindRecipe("no-such-recipe"), nullptr);
  // FlashAttention-2 rounding points: P before PV and dV, dS before dQ and dK, D from the
  // rounded O.
  const Recipe& bf16 = *FindRecipe("bf16");
  EXPECT_EQ(bf16.pv.a.scheme.kind, OperandKind::kElement);
  EXPECT_EQ(bf16.pv.a.scheme.element, Format::kBF16);
  EXPECT_EQ(bf16.pdo.a.scheme.element, Format::kBF16);
  EXPECT_EQ(bf16.dsk.a.scheme.element, Format::kBF16);
  EXPECT_EQ(bf16.dsq.a.scheme.element, Format::kBF16);
  EXPECT_EQ(bf16.qk.a.scheme.kind, OperandKind::kNone);
  EXPECT_EQ(bf16.delta, DeltaSource::kRoundedO);
  EXPECT_TRUE(ElementOnly(bf16));
}

TEST(Recipes, ValidationNamesTheBadOperand) {
  Recipe r = *FindRecipe("bf16");
  r.pv.a.scheme.pre_scale = 3.0;
  Status s = ValidateRecipe(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("pv.a"), std::string::npos) << s.error().message;
  r = *FindRecipe("bf16");
  r.qk.b.scheme.kind = OperandKind::kBlock;
  r.qk.b.scheme.block = "mxfp9";
  s = ValidateRecipe(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("mxfp9"), std::string::npos) << s.error().message;
}

TEST(QuantizeOperand, ElementSchemeWithPowerOfTwoPreScale) {
  // cuDNN-style P × 16 → e4m3fn (saturating) → ÷ 16.
  OperandScheme s;
  s.kind = OperandKind::kElement;
  s.element = Format::kE4M3FN;
  s.pre_scale = 16.0;
  s.overflow = Overflow::kSaturate;
  const std::vector<float> in = {1.0f, 0.3f, 0.001f, 100.0f};
  auto out = QuantizeOperand(in, {4}, 0, s);
  ASSERT_TRUE(out.ok());
  EncodeOptions sat;
  sat.overflow = Overflow::kSaturate;
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i], static_cast<float>(RoundTo(in[i] * 16.0, Format::kE4M3FN, sat) / 16.0));
  }
  EXPECT_EQ((*out)[3], 448.0f / 16.0f);  // saturated
  OperandScheme none;
  auto same = QuantizeOperand(in, {4}, 0, none);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, in);
}

TEST(QuantizeOperand, BlockSchemeAlongTheSequenceSharesScalesAcrossPositions) {
  // [S = 64, D = 2], blocks of 32 along S: a large value at position 40 changes the scale of
  // block 1 (positions 32..63) only, so position 33 moves and position 1 does not.
  OperandScheme s;
  s.kind = OperandKind::kBlock;
  s.block = "mxfp8-e4m3";
  std::vector<float> base(128, 0.0f);
  for (size_t i = 0; i < base.size(); ++i) base[i] = 0.01f * static_cast<float>(i % 7 + 1);
  std::vector<float> bumped = base;
  bumped[40 * 2] = 1048576.0f;  // scale 2^12: small values of block 1 flush to 0
  auto a = QuantizeOperand(base, {64, 2}, 0, s);
  auto b = QuantizeOperand(bumped, {64, 2}, 0, s);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ((*a)[1 * 2], (*b)[1 * 2]);
  EXPECT_NE((*a)[33 * 2], (*b)[33 * 2]);
}

}  // namespace
}  // namespace attest
