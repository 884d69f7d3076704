// Recipes as JSON (see recipe_json.h).
#include "reference/recipes/recipe_json.h"

#include <cmath>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "reference/dtype.h"
#include "reference/formats/format.h"
#include "reference/formats/quantize.h"

namespace attest {
namespace {

// Strings of parsed recipes and the declared rows: stable addresses for the process's life.
struct Declared {
  std::mutex mu;
  std::deque<std::string> strings;
  std::deque<Recipe> recipes;
};

Declared& Store() {
  static Declared* d = new Declared;  // never destroyed: checks may hold pointers at exit
  return *d;
}

std::string_view Intern(std::string s) {
  Declared& d = Store();
  std::lock_guard<std::mutex> lock(d.mu);
  d.strings.push_back(std::move(s));
  return d.strings.back();
}

constexpr std::pair<const char*, GemmQuant Recipe::*> kGemms[] = {
    {"qk", &Recipe::qk},   {"pv", &Recipe::pv},   {"dov", &Recipe::dov},
    {"pdo", &Recipe::pdo}, {"dsk", &Recipe::dsk}, {"dsq", &Recipe::dsq}};

std::string_view OverflowName(Overflow o) {
  switch (o) {
    case Overflow::kSaturate: return "saturate";
    case Overflow::kInf: return "inf";
    case Overflow::kNan: return "nan";
    case Overflow::kDefault: return "default";
  }
  return "default";
}

std::optional<Overflow> ParseOverflow(std::string_view s) {
  for (Overflow o : {Overflow::kSaturate, Overflow::kInf, Overflow::kNan, Overflow::kDefault}) {
    if (OverflowName(o) == s) return o;
  }
  return std::nullopt;
}

nlohmann::json OperandToJson(const OperandQuant& q) {
  nlohmann::json j;
  const OperandScheme& s = q.scheme;
  switch (s.kind) {
    case OperandKind::kNone:
      j["kind"] = "none";
      break;
    case OperandKind::kElement:
      j["kind"] = "element";
      j["format"] = std::string(Name(s.element));
      j["pre_scale"] = s.pre_scale;
      j["overflow"] = std::string(OverflowName(s.overflow));
      if (s.rounding != Rounding::kNearestEven) j["rounding"] = std::string(Name(s.rounding));
      break;
    case OperandKind::kBlock: {
      const SchemeOptions& o = s.block_options;
      j["kind"] = "block";
      j["scheme"] = std::string(s.block);
      j["axis"] = std::string(Name(q.axis));
      if (o.scale_mode) j["scale_mode"] = std::string(Name(*o.scale_mode));
      if (o.block_size) j["block_size"] = *o.block_size;
      if (o.tensor_amax) j["tensor_amax"] = *o.tensor_amax;
      if (o.pow2_scale) j["pow2_scale"] = *o.pow2_scale;
      if (o.margin != 0) j["margin"] = o.margin;
      if (o.amax_epsilon != 0) j["amax_epsilon"] = o.amax_epsilon;
      if (o.nan != BlockNanPolicy::kPropagateNaN) j["nan"] = std::string(Name(o.nan));
      if (o.nvfp4_variant != Nvfp4Variant::kTransformerEngine) {
        j["nvfp4_variant"] = std::string(Name(o.nvfp4_variant));
      }
      if (o.mx_reciprocal != MxReciprocal::kExact) j["mx_reciprocal"] = "te";
      j["per_vector_tensor_scale"] = s.per_vector_tensor_scale;
      break;
    }
  }
  return j;
}

nlohmann::json FormatOrNull(const std::optional<Format>& f) {
  return f ? nlohmann::json(std::string(Name(*f))) : nlohmann::json(nullptr);
}

// Field readers that name the field on error.
struct Reader {
  const nlohmann::json& j;
  std::string where;

  Status Allowed(std::initializer_list<std::string_view> keys) const {
    for (const auto& [key, value] : j.items()) {
      bool known = false;
      for (std::string_view k : keys) known = known || k == key;
      if (!known) return Error{fmt::format("{}.{}: unknown field", where, key)};
    }
    return Status::Ok();
  }
  Expected<std::string> String(const char* key, bool required = true) const {
    if (!j.contains(key)) {
      if (required) return Error{fmt::format("{}.{}: missing", where, key)};
      return std::string();
    }
    if (!j[key].is_string()) return Error{fmt::format("{}.{}: not a string", where, key)};
    return j[key].get<std::string>();
  }
  Expected<std::optional<Format>> FormatField(const char* key, bool nullable) const {
    if (!j.contains(key) || (nullable && j[key].is_null())) return std::optional<Format>();
    auto s = String(key);
    if (!s.ok()) return s.error();
    auto f = ParseFormat(*s);
    if (!f) {
      return Error{fmt::format("{}.{}: unknown format '{}' (see `attest list formats`)", where,
                               key, *s)};
    }
    return std::optional<Format>(*f);
  }
  Expected<std::optional<double>> Number(const char* key) const {
    if (!j.contains(key)) return std::optional<double>();
    if (!j[key].is_number()) return Error{fmt::format("{}.{}: not a number", where, key)};
    const double x = j[key].get<double>();
    if (!std::isfinite(x)) return Error{fmt::format("{}.{}: not finite", where, key)};
    return std::optional<double>(x);
  }
  Expected<std::optional<bool>> Bool(const char* key) const {
    if (!j.contains(key)) return std::optional<bool>();
    if (!j[key].is_boolean()) return Error{fmt::format("{}.{}: not a boolean", where, key)};
    return std::optional<bool>(j[key].get<bool>());
  }
};

// A rounding direction (format.h ParseRounding: rne, rz, ru, rd, rna); absent: rne.
Expected<Rounding> ParseRoundingField(const Reader& r, const char* key, const std::string& where) {
  auto text = r.String(key, false);
  if (!text.ok()) return text.error();
  if (text->empty()) return Rounding::kNearestEven;
  const std::optional<Rounding> rounding = ParseRounding(*text);
  if (!rounding || *rounding == Rounding::kStochastic) {
    return Error{fmt::format("{}.{}: unknown rounding '{}' (rne, rz, ru, rd, rna)", where, key,
                             *text)};
  }
  return *rounding;
}

// An element operand's "overflow" and "rounding" (both optional).
Status ParseOverflowAndRounding(const Reader& r, const std::string& where, OperandScheme& s) {
  auto ov = r.String("overflow", false);
  if (!ov.ok()) return ov.error();
  if (!ov->empty()) {
    auto o = ParseOverflow(*ov);
    if (!o) {
      return Error{fmt::format("{}.overflow: unknown overflow '{}' (default, saturate, inf, "
                               "nan)", where, *ov)};
    }
    s.overflow = *o;
  }
  auto rounding = ParseRoundingField(r, "rounding", where);
  if (!rounding.ok()) return rounding.error();
  s.rounding = *rounding;
  return Status::Ok();
}

Expected<OperandQuant> OperandFromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Error{where + ": not an object"};
  Reader r{j, where};
  OperandQuant q;
  auto kind = r.String("kind");
  if (!kind.ok()) return kind.error();
  if (*kind == "none") {
    if (Status s = r.Allowed({"kind"}); !s.ok()) return s.error();
    return q;
  }
  if (*kind == "element") {
    if (Status s = r.Allowed({"kind", "format", "pre_scale", "overflow", "rounding"}); !s.ok()) {
      return s.error();
    }
    q.scheme.kind = OperandKind::kElement;
    auto f = r.FormatField("format", false);
    if (!f.ok()) return f.error();
    if (!*f) return Error{where + ".format: missing"};
    q.scheme.element = **f;
    auto pre = r.Number("pre_scale");
    if (!pre.ok()) return pre.error();
    if (*pre) q.scheme.pre_scale = **pre;
    int e = 0;
    if (!(q.scheme.pre_scale > 0) || std::frexp(q.scheme.pre_scale, &e) != 0.5) {
      return Error{fmt::format("{}.pre_scale: {} is not a positive power of two (the scaling "
                               "must be exact)", where, q.scheme.pre_scale)};
    }
    if (Status st = ParseOverflowAndRounding(r, where, q.scheme); !st.ok()) return st.error();
    return q;
  }
  if (*kind != "block") {
    return Error{fmt::format("{}.kind: unknown operand kind '{}' (none, element, block)", where,
                             *kind)};
  }
  if (Status s = r.Allowed({"kind", "scheme", "axis", "scale_mode", "block_size", "tensor_amax",
                            "pow2_scale", "margin", "amax_epsilon", "nan", "nvfp4_variant",
                            "mx_reciprocal", "per_vector_tensor_scale"});
      !s.ok()) {
    return s.error();
  }
  q.scheme.kind = OperandKind::kBlock;
  auto name = r.String("scheme");
  if (!name.ok()) return name.error();
  const Scheme* scheme = FindScheme(*name);
  if (scheme == nullptr) {
    return Error{fmt::format("{}.scheme: unknown block scheme '{}' (see `attest list schemes`)",
                             where, *name)};
  }
  q.scheme.block = scheme->name;  // the registry's own string
  q.scheme.block_options.scheme = std::string(scheme->name);
  auto axis = r.String("axis");
  if (!axis.ok()) return axis.error();
  if (*axis == "head_dim") {
    q.axis = QuantAxis::kHeadDim;
  } else if (*axis == "sequence") {
    q.axis = QuantAxis::kSequence;
  } else {
    return Error{fmt::format("{}.axis: unknown axis '{}' (head_dim, sequence)", where, *axis)};
  }
  SchemeOptions& o = q.scheme.block_options;
  auto mode = r.String("scale_mode", false);
  if (!mode.ok()) return mode.error();
  if (!mode->empty()) {
    if (scheme->kind != SchemeKind::kMx) {
      return Error{fmt::format("{}.scale_mode: only MX schemes have one ({} is not)", where,
                               scheme->name)};
    }
    o.scale_mode = ParseScaleMode(*mode);
    if (!o.scale_mode) {
      return Error{fmt::format("{}.scale_mode: unknown scale mode '{}' (floor, ceil, rceil, "
                               "even)", where, *mode)};
    }
  }
  auto block = r.Number("block_size");
  if (!block.ok()) return block.error();
  if (*block) {
    const double b = **block;
    if (b != std::floor(b) || b < 1 || b > 4096) {
      return Error{fmt::format("{}.block_size: must be an integer in [1, 4096]", where)};
    }
    o.block_size = static_cast<int64_t>(b);
  }
  auto amax = r.Number("tensor_amax");
  if (!amax.ok()) return amax.error();
  if (*amax) {
    if (!(**amax > 0)) return Error{where + ".tensor_amax: must be positive (a static scale)"};
    o.tensor_amax = static_cast<float>(**amax);
  }
  auto pow2 = r.Bool("pow2_scale");
  if (!pow2.ok()) return pow2.error();
  o.pow2_scale = *pow2;
  auto margin = r.Number("margin");
  if (!margin.ok()) return margin.error();
  if (*margin) {
    if (**margin != std::floor(**margin) || std::fabs(**margin) > 64) {
      return Error{where + ".margin: must be an integer in [-64, 64]"};
    }
    o.margin = static_cast<int>(**margin);
  }
  auto eps = r.Number("amax_epsilon");
  if (!eps.ok()) return eps.error();
  if (*eps) {
    if (**eps < 0) return Error{where + ".amax_epsilon: must not be negative"};
    o.amax_epsilon = static_cast<float>(**eps);
  }
  auto nan = r.String("nan", false);
  if (!nan.ok()) return nan.error();
  if (!nan->empty()) {
    auto p = ParseBlockNanPolicy(*nan);
    if (!p) {
      return Error{fmt::format("{}.nan: unknown policy '{}' (propagate, ignore)", where, *nan)};
    }
    o.nan = *p;
  }
  auto variant = r.String("nvfp4_variant", false);
  if (!variant.ok()) return variant.error();
  if (!variant->empty()) {
    auto v = ParseNvfp4Variant(*variant);
    if (!v) {
      return Error{fmt::format("{}.nvfp4_variant: unknown variant '{}' (te, torchao)", where,
                               *variant)};
    }
    o.nvfp4_variant = *v;
  }
  auto rcp = r.String("mx_reciprocal", false);
  if (!rcp.ok()) return rcp.error();
  if (!rcp->empty()) {
    if (*rcp != "exact" && *rcp != "te") {
      return Error{fmt::format("{}.mx_reciprocal: unknown '{}' (exact, te)", where, *rcp)};
    }
    o.mx_reciprocal = *rcp == "te" ? MxReciprocal::kTransformerEngine : MxReciprocal::kExact;
  }
  auto per_vector = r.Bool("per_vector_tensor_scale");
  if (!per_vector.ok()) return per_vector.error();
  q.scheme.per_vector_tensor_scale = per_vector->value_or(false);
  if (q.scheme.per_vector_tensor_scale && q.axis != QuantAxis::kHeadDim) {
    return Error{where + ".per_vector_tensor_scale: needs axis head_dim (one scale per token "
                 "and head, along its innermost axis)"};
  }
  return q;
}

}  // namespace

nlohmann::json RecipeToJson(const Recipe& r) {
  nlohmann::json j;
  j["name"] = std::string(r.name);
  j["description"] = std::string(r.description);
  j["input_dtypes"] = nlohmann::json::array();
  for (DType d : r.input_dtypes) j["input_dtypes"].push_back(std::string(Name(d)));
  nlohmann::json gemms = nlohmann::json::object();
  for (const auto& [key, member] : kGemms) {
    gemms[key] = {{"a", OperandToJson((r.*member).a)}, {"b", OperandToJson((r.*member).b)}};
  }
  j["gemms"] = gemms;
  j["delta"] = r.delta == DeltaSource::kRoundedO ? "rounded_o" : "fp32_o";
  j["delta_do"] = r.delta_do == DeltaDo::kInput ? "input" : "dov_operand";
  j["accumulate"] = std::string(Name(r.accumulate));
  j["output"] = FormatOrNull(r.output);
  j["lse"] = std::string(Name(r.lse));
  j["gradients"] = FormatOrNull(r.gradients);
  j["dp"] = FormatOrNull(r.dp);
  // Written only when set, so that every recipe without scaled outputs prints as before.
  if (r.output_scale != 1.0) j["output_scale"] = r.output_scale;
  if (r.gradient_scales != std::array<double, 3>{1.0, 1.0, 1.0}) {
    j["gradient_scales"] = r.gradient_scales;
  }
  if (r.output_rounding != Rounding::kNearestEven) {
    j["output_rounding"] = std::string(Name(r.output_rounding));
  }
  if (r.gradient_rounding != Rounding::kNearestEven) {
    j["gradient_rounding"] = std::string(Name(r.gradient_rounding));
  }
  return j;
}

Expected<Recipe> RecipeFromJson(const nlohmann::json& j, std::string_view where_view) {
  const std::string where(where_view);
  if (!j.is_object()) return Error{where + ": not an object"};
  Reader r{j, where};
  if (Status s = r.Allowed({"name", "description", "input_dtypes", "gemms", "delta", "delta_do",
                            "accumulate", "output", "lse", "gradients", "dp", "output_scale",
                            "gradient_scales", "output_rounding", "gradient_rounding"});
      !s.ok()) {
    return s.error();
  }
  Recipe out;
  auto name = r.String("name");
  if (!name.ok()) return name.error();
  constexpr std::string_view kNameChars =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
  if (name->empty() || name->size() > 64 ||
      name->find_first_not_of(kNameChars) != std::string::npos) {
    return Error{where + ".name: 1 to 64 characters of [A-Za-z0-9._-]"};
  }
  out.name = Intern(*name);
  auto description = r.String("description", false);
  if (!description.ok()) return description.error();
  out.description = Intern(*description);
  if (!j.contains("input_dtypes") || !j["input_dtypes"].is_array() || j["input_dtypes"].empty()) {
    return Error{where + ".input_dtypes: a non-empty array of dtypes (bf16, f16, f32)"};
  }
  for (const auto& d : j["input_dtypes"]) {
    std::optional<DType> dt = d.is_string() ? ParseDType(d.get<std::string>()) : std::nullopt;
    if (!dt || !(*dt == DType::kBF16 || *dt == DType::kF16 || *dt == DType::kF32)) {
      return Error{where + ".input_dtypes: entries must be bf16, f16 or f32"};
    }
    out.input_dtypes.push_back(*dt);
  }
  if (!j.contains("gemms") || !j["gemms"].is_object()) {
    return Error{where + ".gemms: missing (an object with qk, pv, dov, pdo, dsk, dsq)"};
  }
  const nlohmann::json& gemms = j["gemms"];
  for (const auto& [key, value] : gemms.items()) {
    bool known = false;
    for (const auto& g : kGemms) known = known || key == g.first;
    if (!known) {
      return Error{fmt::format("{}.gemms.{}: unknown GEMM (qk, pv, dov, pdo, dsk, dsq)", where,
                               key)};
    }
  }
  for (const auto& [key, member] : kGemms) {
    if (!gemms.contains(key)) continue;  // missing: both operands used as stored
    const std::string at = fmt::format("{}.gemms.{}", where, key);
    const nlohmann::json& g = gemms[key];
    if (!g.is_object()) return Error{at + ": not an object"};
    Reader gr{g, at};
    if (Status s = gr.Allowed({"a", "b"}); !s.ok()) return s.error();
    for (const char* side : {"a", "b"}) {
      if (!g.contains(side)) continue;
      auto op = OperandFromJson(g[side], at + "." + side);
      if (!op.ok()) return op.error();
      (out.*member).*(std::string_view(side) == "a" ? &GemmQuant::a : &GemmQuant::b) = *op;
    }
  }
  auto delta = r.String("delta", false);
  if (!delta.ok()) return delta.error();
  if (delta->empty() || *delta == "rounded_o") {
    out.delta = DeltaSource::kRoundedO;
  } else if (*delta == "fp32_o") {
    out.delta = DeltaSource::kFp32O;
  } else {
    return Error{fmt::format("{}.delta: unknown source '{}' (rounded_o, fp32_o)", where, *delta)};
  }
  auto delta_do = r.String("delta_do", false);
  if (!delta_do.ok()) return delta_do.error();
  if (delta_do->empty() || *delta_do == "input") {
    out.delta_do = DeltaDo::kInput;
  } else if (*delta_do == "dov_operand") {
    out.delta_do = DeltaDo::kDovOperand;
  } else {
    return Error{fmt::format("{}.delta_do: unknown dO '{}' (input, dov_operand)", where,
                             *delta_do)};
  }
  auto acc = r.FormatField("accumulate", false);
  if (!acc.ok()) return acc.error();
  if (*acc) out.accumulate = **acc;
  auto output = r.FormatField("output", true);
  if (!output.ok()) return output.error();
  out.output = *output;
  auto lse = r.FormatField("lse", false);
  if (!lse.ok()) return lse.error();
  if (*lse) out.lse = **lse;
  auto gradients = r.FormatField("gradients", true);
  if (!gradients.ok()) return gradients.error();
  out.gradients = *gradients;
  auto dp = r.FormatField("dp", true);
  if (!dp.ok()) return dp.error();
  out.dp = *dp;
  auto output_scale = r.Number("output_scale");
  if (!output_scale.ok()) return output_scale.error();
  if (*output_scale) out.output_scale = **output_scale;
  if (j.contains("gradient_scales")) {
    const nlohmann::json& g = j["gradient_scales"];
    if (!g.is_array() || g.size() != 3) {
      return Error{where + ".gradient_scales: an array of three numbers (dq, dk, dv)"};
    }
    for (size_t i = 0; i < 3; ++i) {
      if (!g[i].is_number()) {
        return Error{fmt::format("{}.gradient_scales[{}]: not a number", where, i)};
      }
      out.gradient_scales[i] = g[i].get<double>();
    }
  }
  auto output_rounding = ParseRoundingField(r, "output_rounding", where);
  if (!output_rounding.ok()) return output_rounding.error();
  out.output_rounding = *output_rounding;
  auto gradient_rounding = ParseRoundingField(r, "gradient_rounding", where);
  if (!gradient_rounding.ok()) return gradient_rounding.error();
  out.gradient_rounding = *gradient_rounding;
  if (Status s = ValidateRecipe(out); !s.ok()) return Error{where + ": " + s.error().message};
  return out;
}

bool IsBuiltinRecipe(const Recipe* recipe) {
  for (const Recipe& r : AllRecipes()) {
    if (&r == recipe) return true;
  }
  return false;
}

Expected<const Recipe*> DeclareRecipe(const Recipe& recipe, std::string_view where) {
  const nlohmann::json mine = RecipeToJson(recipe);
  auto clash = [&](const Recipe& known, bool builtin) -> Expected<const Recipe*> {
    if (RecipeToJson(known) == mine) return &known;
    return Error{fmt::format("{}.name: '{}' is already {} with other contents (give the recipe a "
                             "name of its own)", where, recipe.name,
                             builtin ? "a built-in recipe" : "declared")};
  };
  for (const Recipe& r : AllRecipes()) {
    if (r.name == recipe.name) return clash(r, true);
  }
  Declared& d = Store();
  std::lock_guard<std::mutex> lock(d.mu);
  for (const Recipe& r : d.recipes) {
    if (r.name == recipe.name) return clash(r, false);
  }
  d.recipes.push_back(recipe);
  return &d.recipes.back();
}

const Recipe* FindDeclaredRecipe(std::string_view name) {
  Declared& d = Store();
  std::lock_guard<std::mutex> lock(d.mu);
  for (const Recipe& r : d.recipes) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

}  // namespace attest
