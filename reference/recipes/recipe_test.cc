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

TEST(QuantizeOperand, PerVectorTensorScaleIsEachVectorQuantisedAlone) {
  // [S = 6, D = 32] under NVFP4 and FP8 current scaling: with per_vector_tensor_scale each
  // row equals that row quantised as its own tensor, and a huge value in row 4 leaves every
  // other row bitwise unchanged; with one tensor-wide amax the same bump moves row 0.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> base(6 * 32);
  for (float& x : base) x = normal(rng);
  std::vector<float> bumped = base;
  bumped[4 * 32 + 3] = 3000.0f;
  for (const char* block : {"nvfp4", "fp8-tensor-e4m3"}) {
    OperandScheme s;
    s.kind = OperandKind::kBlock;
    s.block = block;
    s.per_vector_tensor_scale = true;
    auto a = QuantizeOperand(base, {6, 32}, 1, s);
    auto b = QuantizeOperand(bumped, {6, 32}, 1, s);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    for (int64_t row = 0; row < 6; ++row) {
      const std::vector<float> alone_in(base.begin() + row * 32, base.begin() + row * 32 + 32);
      OperandScheme whole = s;  // one tensor-wide scale over a tensor of one row
      whole.per_vector_tensor_scale = false;
      auto alone = QuantizeOperand(alone_in, {1, 32}, 1, whole);
      ASSERT_TRUE(alone.ok()) << alone.error().message;
      for (int64_t d = 0; d < 32; ++d) {
        const auto i = static_cast<size_t>(row * 32 + d);
        EXPECT_TRUE(SameValue((*a)[i], (*alone)[static_cast<size_t>(d)])) << block << " " << i;
        if (row != 4) EXPECT_TRUE(SameValue((*a)[i], (*b)[i])) << block << " " << i;
      }
    }
    s.per_vector_tensor_scale = false;
    auto wa = QuantizeOperand(base, {6, 32}, 1, s);
    auto wb = QuantizeOperand(bumped, {6, 32}, 1, s);
    ASSERT_TRUE(wa.ok() && wb.ok());
    bool row0_moved = false;
    for (size_t i = 0; i < 32; ++i) row0_moved |= !SameValue((*wa)[i], (*wb)[i]);
    EXPECT_TRUE(row0_moved) << block;
  }
  // The blocked axis must be the innermost one.
  OperandScheme s;
  s.kind = OperandKind::kBlock;
  s.block = "nvfp4";
  s.per_vector_tensor_scale = true;
  auto bad = QuantizeOperand(base, {6, 32}, 0, s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("innermost"), std::string::npos) << bad.error().message;
}

TEST(Recipes, OnlyTheCudnnRowSharesScalesAcrossPositions) {
  // mxfp8-cudnn blocks V, dO, K, Q and dS along the sequence; every other row scales per
  // position (MX / NVFP4 along D with per-token second-level scales) or statically.
  for (const Recipe& r : AllRecipes()) {
    EXPECT_EQ(SharesScalesAcrossPositions(r), r.name == "mxfp8-cudnn") << r.name;
  }
  // Each leaking operand form is recognised on an otherwise leak-free row.
  const Recipe base = *FindRecipe("mxfp8-pvbf16");
  Recipe seq = base;
  seq.pv.b = seq.qk.b;
  seq.pv.b.axis = QuantAxis::kSequence;  // MX blocks along the keys
  EXPECT_TRUE(SharesScalesAcrossPositions(seq));
  Recipe tensor = base;
  tensor.pv.b.scheme.kind = OperandKind::kBlock;
  tensor.pv.b.scheme.block = "fp8-tensor-e4m3";  // one current amax over the tensor
  EXPECT_TRUE(SharesScalesAcrossPositions(tensor));
  tensor.pv.b.scheme.block_options.tensor_amax = 448.0f;  // static: the data sets nothing
  EXPECT_FALSE(SharesScalesAcrossPositions(tensor));
  Recipe nvfp4 = *FindRecipe("nvfp4-mixed");
  nvfp4.qk.b.scheme.per_vector_tensor_scale = false;  // TransformerEngine's tensor amax
  EXPECT_TRUE(SharesScalesAcrossPositions(nvfp4));
}

}  // namespace
}  // namespace attest
