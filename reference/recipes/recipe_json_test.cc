// Recipes as JSON: every built-in recipe survives the round trip field for field, a declared
// copy of a built-in is the built-in, and a malformed recipe is refused with the field named.
#include "reference/recipes/recipe_json.h"

#include <string>

#include <gtest/gtest.h>

namespace attest {
namespace {

TEST(RecipeJson, EveryBuiltinRecipeRoundTrips) {
  for (const Recipe& r : AllRecipes()) {
    const nlohmann::json j = RecipeToJson(r);
    auto back = RecipeFromJson(j, "recipe");
    ASSERT_TRUE(back.ok()) << r.name << ": " << back.error().message;
    EXPECT_EQ(RecipeToJson(*back), j) << r.name;
    // The same contents under a built-in's name are that built-in row.
    auto declared = DeclareRecipe(*back, "recipe");
    ASSERT_TRUE(declared.ok()) << declared.error().message;
    EXPECT_EQ(*declared, &r);
    EXPECT_TRUE(IsBuiltinRecipe(*declared));
  }
}

TEST(RecipeJson, ADeclaredRecipeIsFoundByName) {
  nlohmann::json j = RecipeToJson(*FindRecipe("mxfp8-pvbf16"));
  j["name"] = "test-json-floor";
  j["gemms"]["qk"]["a"]["scale_mode"] = "floor";
  auto r = RecipeFromJson(j, "recipe");
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto d = DeclareRecipe(*r, "recipe");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_FALSE(IsBuiltinRecipe(*d));
  EXPECT_EQ(FindRecipe("test-json-floor"), *d);
  EXPECT_EQ((*d)->qk.a.scheme.block_options.scale_mode, ScaleMode::kFloor);
  EXPECT_EQ(RecipeToJson(**d), j);
  // Declaring it again is a no-op; other contents under its name are refused.
  EXPECT_EQ(*DeclareRecipe(*r, "recipe"), *d);
  j["gemms"]["qk"]["a"]["scale_mode"] = "ceil";
  auto other = RecipeFromJson(j, "recipe");
  ASSERT_TRUE(other.ok());
  auto clash = DeclareRecipe(*other, "capabilities.recipe");
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.error().message.find("capabilities.recipe.name: 'test-json-floor' is already "
                                       "declared"), std::string::npos)
      << clash.error().message;
}

TEST(RecipeJson, DeltaDoRoundTripsAndDefaultsToTheInput) {
  nlohmann::json j = RecipeToJson(*FindRecipe("mxfp8-cudnn"));
  EXPECT_EQ(j["delta_do"], "input");
  j["name"] = "test-json-delta-do";
  j["delta_do"] = "dov_operand";
  auto r = RecipeFromJson(j, "recipe");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->delta_do, DeltaDo::kDovOperand);
  EXPECT_EQ(RecipeToJson(*r), j);
  // Optional on input: a recipe written before the field reads its dO as given.
  j.erase("delta_do");
  auto old = RecipeFromJson(j, "recipe");
  ASSERT_TRUE(old.ok()) << old.error().message;
  EXPECT_EQ(old->delta_do, DeltaDo::kInput);
}

// Output and gradient scales (cuDNN's FP8 scale_o, scale_dQ/dK/dV) round-trip; they are
// printed only when set, and a scale that is not a power of two is an error naming it.
TEST(RecipeJson, OutputAndGradientScalesRoundTripAndMustBePowersOfTwo) {
  nlohmann::json j = RecipeToJson(*FindRecipe("mxfp8-pvbf16"));
  EXPECT_FALSE(j.contains("gradient_scales"));
  EXPECT_FALSE(j.contains("output_scale"));
  j["name"] = "test-json-scaled-outputs";
  j["gradients"] = "e4m3fn";
  j["gradient_scales"] = {128.0, 64.0, 0.5};
  j["output_scale"] = 16.0;
  auto r = RecipeFromJson(j, "recipe");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->output_scale, 16.0);
  EXPECT_EQ(r->gradient_scales[1], 64.0);
  EXPECT_EQ(RecipeToJson(*r), j);
  j["gradient_scales"] = {128.0, 3.0, 1.0};
  auto bad = RecipeFromJson(j, "recipe");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("gradient_scales[1] (dk)"), std::string::npos)
      << bad.error().message;
  j["gradient_scales"] = {128.0, 64.0};
  EXPECT_FALSE(RecipeFromJson(j, "recipe").ok());
  j["gradient_scales"] = {1.0, 1.0, 1.0};
  j["output_scale"] = -4.0;
  auto neg = RecipeFromJson(j, "recipe");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.error().message.find("output_scale"), std::string::npos);
}

// A directed rounding a recipe declares (the bias check expects its bias): o, the gradients
// and an element operand; written only when not nearest-even; stochastic is refused.
TEST(RecipeJson, DeclaredRoundingDirectionsRoundTrip) {
  nlohmann::json j = RecipeToJson(*FindRecipe("bf16"));
  EXPECT_FALSE(j.contains("output_rounding"));
  EXPECT_FALSE(j["gemms"]["pv"]["a"].contains("rounding"));
  j["name"] = "test-json-directed";
  j["output_rounding"] = "rz";
  j["gradient_rounding"] = "ru";
  j["gemms"]["pv"]["a"]["rounding"] = "rz";
  auto r = RecipeFromJson(j, "recipe");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->output_rounding, Rounding::kTowardZero);
  EXPECT_EQ(r->gradient_rounding, Rounding::kUp);
  EXPECT_EQ(r->pv.a.scheme.rounding, Rounding::kTowardZero);
  EXPECT_TRUE(HasDirectedRounding(*r));
  EXPECT_FALSE(HasDirectedRounding(*FindRecipe("bf16")));
  EXPECT_EQ(RecipeToJson(*r), j);
  EXPECT_EQ(OutputRoundingOf(*r, Format::kBF16).rounding, Rounding::kTowardZero);
  // 1 + 2^-7 + 2^-9 truncates to 1 + 2^-7 in bf16; nearest-even gives 1 + 2^-6.
  const float x = 1.0f + 0x1p-7f + 0x1p-8f + 0x1p-9f;
  EXPECT_EQ(RoundElement(x, OutputRoundingOf(*r, Format::kBF16)), 1.0f + 0x1p-7f);
  EXPECT_EQ(RoundElement(x, OutputRoundingOf(*FindRecipe("bf16"), Format::kBF16)),
            1.0f + 0x1p-6f);
  j["output_rounding"] = "sr";
  auto bad = RecipeFromJson(j, "recipe");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("recipe.output_rounding"), std::string::npos)
      << bad.error().message;
}

TEST(RecipeJson, ErrorsNameTheField) {
  const nlohmann::json base = RecipeToJson(*FindRecipe("mxfp8-cudnn"));
  struct Bad {
    const char* what;
    nlohmann::json j;
    const char* message;
  };
  std::vector<Bad> bad;
  auto edit = [&](const char* what, auto f, const char* message) {
    nlohmann::json j = base;
    j["name"] = "test-json-bad";
    f(j);
    bad.push_back({what, j, message});
  };
  edit("unknown field", [](nlohmann::json& j) { j["acumulate"] = "f32"; },
       "c.recipe.acumulate: unknown field");
  edit("scale mode", [](nlohmann::json& j) { j["gemms"]["qk"]["b"]["scale_mode"] = "nearest"; },
       "c.recipe.gemms.qk.b.scale_mode: unknown scale mode 'nearest'");
  edit("scale mode on FP8", [](nlohmann::json& j) {
         j["gemms"]["qk"]["b"] = {{"kind", "block"}, {"scheme", "fp8-tensor-e4m3"},
                                  {"axis", "head_dim"}, {"scale_mode", "floor"}};
       },
       "c.recipe.gemms.qk.b.scale_mode: only MX schemes have one");
  edit("scheme", [](nlohmann::json& j) { j["gemms"]["pv"]["b"]["scheme"] = "mxfp9"; },
       "c.recipe.gemms.pv.b.scheme: unknown block scheme 'mxfp9'");
  edit("pre-scale", [](nlohmann::json& j) { j["gemms"]["pv"]["a"]["pre_scale"] = 12; },
       "c.recipe.gemms.pv.a.pre_scale: 12 is not a positive power of two");
  edit("axis", [](nlohmann::json& j) { j["gemms"]["dov"]["a"]["axis"] = "rows"; },
       "c.recipe.gemms.dov.a.axis: unknown axis 'rows'");
  edit("gemm", [](nlohmann::json& j) { j["gemms"]["qv"] = j["gemms"]["qk"]; },
       "c.recipe.gemms.qv: unknown GEMM");
  edit("format", [](nlohmann::json& j) { j["output"] = "bf15"; },
       "c.recipe.output: unknown format 'bf15'");
  edit("delta", [](nlohmann::json& j) { j["delta"] = "o"; }, "c.recipe.delta: unknown source 'o'");
  edit("delta_do", [](nlohmann::json& j) { j["delta_do"] = "fp8"; },
       "c.recipe.delta_do: unknown dO 'fp8' (input, dov_operand)");
  edit("dtypes", [](nlohmann::json& j) { j["input_dtypes"] = {"e4m3fn"}; },
       "c.recipe.input_dtypes: entries must be bf16, f16 or f32");
  edit("name", [](nlohmann::json& j) { j["name"] = "a b"; }, "c.recipe.name: 1 to 64 characters");
  for (const Bad& b : bad) {
    auto r = RecipeFromJson(b.j, "c.recipe");
    ASSERT_FALSE(r.ok()) << b.what;
    EXPECT_NE(r.error().message.find(b.message), std::string::npos)
        << b.what << ": " << r.error().message;
  }
  // A built-in's name with other contents.
  nlohmann::json j = base;
  j["lse"] = "f16";
  auto r = RecipeFromJson(j, "c.recipe");
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto d = DeclareRecipe(*r, "c.recipe");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("'mxfp8-cudnn' is already a built-in recipe"),
            std::string::npos)
      << d.error().message;
}

}  // namespace
}  // namespace attest
