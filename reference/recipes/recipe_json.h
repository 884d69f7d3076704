// Recipes as JSON (docs/protocol.md "Recipes"): the one schema in which a kernel declares its
// low-precision recipe (the exec protocol's and the Python API's capabilities.recipe, the C ABI
// plugin's capabilities JSON) and in which `attest list recipes --json` prints the built-in
// ones. A declared recipe is registered beside the built-in rows, so that every check finds it
// by name (FindRecipe) and judges the kernel exactly as it judges a built-in model.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "reference/recipes/recipe.h"
#include "reference/status.h"

namespace attest {

// Every field of `recipe`, defaults included for the top level; an operand lists only what
// its kind uses (and block options that are set).
nlohmann::json RecipeToJson(const Recipe& recipe);

// Parses and validates a recipe object. Errors name the field from `where` down
// ("capabilities.recipe.gemms.pv.b.scale_mode: unknown scale mode 'x' (floor, ceil, rceil,
// even)"). The result's strings (name, description, block scheme names) point into storage
// that lives as long as the process.
Expected<Recipe> RecipeFromJson(const nlohmann::json& j, std::string_view where);

// Registers a parsed recipe under its name and returns the registered row. A name that is
// already registered (built-in or declared) is accepted when the contents are the same
// (RecipeToJson equal) and refused otherwise, naming the field `where`.
Expected<const Recipe*> DeclareRecipe(const Recipe& recipe, std::string_view where);

// Whether `recipe` is one of the built-in rows (AllRecipes), not a declared one.
bool IsBuiltinRecipe(const Recipe* recipe);

}  // namespace attest
