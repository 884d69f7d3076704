// Test-only pieces for the tests of declared recipes and family profiles
// (declared_recipe_test.cc, family_profile_test.cc, consistency_test.cc): an MXFP8 recipe
// edited as JSON the way a kernel author writes one, the capabilities that declare it, a CPU
// model that runs it, and a wrapper that hides a kernel's recipe behind a family profile.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/kernel.h"
#include "kernels/models/lowp_models.h"
#include "reference/recipes/recipe.h"
#include "reference/recipes/recipe_json.h"

namespace attest::recipe_test {

// mxfp8-pvbf16's recipe under another name, with every MX scale mode set to `mode`.
inline nlohmann::json Mxfp8Recipe(const std::string& name, const std::string& mode) {
  nlohmann::json r = RecipeToJson(*FindRecipe("mxfp8-pvbf16"));
  r["name"] = name;
  r["description"] = "MXFP8 E4M3, " + mode + " E8M0 scales per 32 along D for Q.K^T and dO.V^T";
  for (auto& [gemm, operands] : r["gemms"].items()) {
    for (auto& [side, op] : operands.items()) {
      if (op.contains("scale_mode")) op["scale_mode"] = mode;
    }
  }
  return r;
}

// The capabilities an external kernel sends (docs/protocol.md), recipe as an object, with
// cpu/mxfp8-pvbf16's other claims. Parsing them registers the recipe.
inline Capabilities Declare(const nlohmann::json& recipe) {
  nlohmann::json j = CapabilitiesToJson(LowpModel(LowpModelSpecs()[1]).capabilities());
  j.erase("profile");
  j["recipe"] = recipe;
  auto caps = CapabilitiesFromJson(j);
  EXPECT_TRUE(caps.ok()) << caps.error().message;
  return caps.ok() ? *caps : Capabilities{};
}

// cpu/mxfp8-pvbf16's model spec (head dims, GQA, varlen) under another name and recipe; the
// spec keeps the views, so both strings must outlive it.
inline LowpModelSpec SpecFor(std::string_view name, std::string_view recipe) {
  LowpModelSpec s = LowpModelSpecs()[1];
  EXPECT_EQ(s.recipe, "mxfp8-pvbf16");
  s.name = name;
  s.recipe = recipe;
  return s;
}

// A kernel that reports the family profile `profile` and no recipe; its answers are the
// inner kernel's.
class FamilyOnly final : public Kernel {
 public:
  FamilyOnly(std::unique_ptr<Kernel> inner, std::string profile)
      : owned_(std::move(inner)), inner_(*owned_), profile_(std::move(profile)),
        name_(inner_.name() + "@" + profile_) {}
  FamilyOnly(Kernel& inner, std::string profile, std::string name)
      : inner_(inner), profile_(std::move(profile)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  Capabilities capabilities() const override {
    Capabilities caps = inner_.capabilities();
    caps.sink = caps.rel_bias = false;  // forwards the plain entry points only
    caps.recipe.clear();
    caps.profile = profile_;
    return caps;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return inner_.Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_.Backward(p, q, k, v, o, lse, dout);
  }
  std::optional<Format> BackwardDpFormat(const Problem& p) const override {
    return inner_.BackwardDpFormat(p);
  }

 private:
  std::unique_ptr<Kernel> owned_;
  Kernel& inner_;
  std::string profile_, name_;
};

}  // namespace attest::recipe_test
