// Case files: parsing, canonical text and path resolution (docs/design.md "Case files").
#include "reference/case/case_file.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "reference/data/generate.h"
#include "reference/io/files.h"
#include "reference/io/json.h"

namespace attest {

using nlohmann::json;

namespace {

constexpr std::string_view kCaseFields[] = {"problem", "inputs", "generator"};
constexpr std::string_view kGeneratorFields[] = {"name", "seed", "params"};
// The order of docs/design.md's example; extensions follow in this order.
constexpr std::string_view kProblemOrder[] = {
    "batch",        "heads_q",        "heads_kv",       "seqlen_q",     "seqlen_k",
    "head_dim",     "head_dim_v",     "dtype",          "scale",        "causal",
    "causal_align", "window",         "softcap",        "alibi_slopes", "cu_seqlens_q",
    "cu_seqlens_k", "document_ids_q", "document_ids_k", "prefix_lm",    "block_sparse",
    "mask_form",    "sink",           "rel_bias",       "num_splits",   "page_size",
    "num_pages",    "page_table",     "seqused_q",      "seqused_k",
};

template <size_t N>
Status CheckFields(const json& obj, std::string_view where, const std::string_view (&known)[N]) {
  for (const auto& item : obj.items()) {
    if (std::find(std::begin(known), std::end(known), item.key()) == std::end(known)) {
      return Error{fmt::format("{}: unknown field {}", where, QuotedExcerpt(item.key()))};
    }
  }
  return {};
}

Expected<GeneratorSpec> GeneratorFromJson(const json& g) {
  if (!g.is_object())
    return Error{fmt::format("generator: expected an object, got {}", JsonExcerpt(g))};
  if (Status s = CheckFields(g, "generator", kGeneratorFields); !s) return s.error();
  GeneratorSpec spec;
  if (!g.contains("name") || !g.at("name").is_string()) {
    return Error{"generator.name: missing or not a string"};
  }
  spec.name = g.at("name").get<std::string>();
  // The seed must be explicit: a defaulted seed would make every case share one stream.
  if (!g.contains("seed")) return Error{"generator.seed: missing"};
  const json& seed = g.at("seed");
  // Parsed non-negative literals are unsigned; ones built in code may be signed.
  const bool non_negative_int =
      seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0);
  if (!non_negative_int) {
    return Error{
        fmt::format("generator.seed: expected an integer in [0, 2^64), got {}", JsonExcerpt(seed))};
  }
  spec.seed = seed.get<uint64_t>();
  if (g.contains("params")) {
    if (!g.at("params").is_object()) {
      return Error{
          fmt::format("generator.params: expected an object, got {}", JsonExcerpt(g.at("params")))};
    }
    spec.params = g.at("params");
  }
  return spec;
}

}  // namespace

Expected<Case> CaseFromJson(const json& j, const std::filesystem::path& base_dir) {
  if (!j.is_object()) return Error{fmt::format("case: expected an object, got {}", JsonExcerpt(j))};
  if (Status s = CheckFields(j, "case", kCaseFields); !s) return s.error();
  if (!j.contains("problem")) return Error{"problem: missing"};
  auto problem = ProblemFromJson(j.at("problem"));
  if (!problem) return problem.error();

  Case c;
  c.problem = std::move(*problem);
  const bool has_inputs = j.contains("inputs") && !j.at("inputs").is_null();
  const bool has_generator = j.contains("generator") && !j.at("generator").is_null();
  if (has_inputs == has_generator) {
    return Error{has_inputs ? "case: has both \"inputs\" and \"generator\" (give exactly one)"
                            : "case: has neither \"inputs\" nor \"generator\" (give exactly one)"};
  }
  if (has_inputs) {
    const json& in = j.at("inputs");
    if (!in.is_string() || in.get<std::string>().empty()) {
      return Error{
          fmt::format("inputs: expected a non-empty path string, got {}", JsonExcerpt(in))};
    }
    std::filesystem::path path(in.get<std::string>());
    if (path.is_relative() && !base_dir.empty()) path = base_dir / path;
    c.inputs = path.lexically_normal().string();
  } else {
    auto spec = GeneratorFromJson(j.at("generator"));
    if (!spec) return spec.error();
    if (Status s = ValidateGeneratorSpec(c.problem, *spec); !s) return s.error();
    c.generator = std::move(*spec);
  }
  return c;
}

Expected<Case> ParseCaseText(std::string_view text, std::string_view source,
                             const std::filesystem::path& base_dir) {
  auto j = ParseJson(text, source);
  if (!j) return j.error();
  auto c = CaseFromJson(*j, base_dir);
  if (!c) return Error{fmt::format("{}: {}", source, c.error().message)};
  return c;
}

Expected<Case> LoadCase(const std::filesystem::path& path) {
  ReadLimits limits;
  limits.max_bytes = kMaxCaseFileBytes;
  limits.what = "case file";
  auto text = ReadRegularFile(path.string(), limits);
  if (!text) return text.error();
  return ParseCaseText(*text, path.string(), path.parent_path());
}

json CaseToJson(const Case& c) {
  json j = {{"problem", ProblemToJson(c.problem)}};
  if (c.inputs) j["inputs"] = *c.inputs;
  if (c.generator) {
    j["generator"] = {
        {"name", c.generator->name}, {"seed", c.generator->seed}, {"params", c.generator->params}};
  }
  return j;
}

std::string CaseToText(const Case& c) {
  // Hand-laid so that the order follows docs/design.md (nlohmann::json sorts keys) and arrays stay
  // on one line; every value is nlohmann's compact dump (shortest round-trip doubles, sorted
  // object keys), so the text is a pure function of the case.
  const json j = CaseToJson(c);
  const json& p = j.at("problem");
  std::string out = "{\n  \"problem\": {\n";
  bool first = true;
  for (std::string_view key : kProblemOrder) {
    const std::string k(key);
    if (!p.contains(k)) continue;
    out += fmt::format("{}    \"{}\": {}", first ? "" : ",\n", k, p.at(k).dump());
    first = false;
  }
  // A field the order above does not list yet still reaches the text (after the listed ones,
  // sorted), so that a saved case never drops part of its problem.
  for (const auto& item : p.items()) {
    if (std::find(std::begin(kProblemOrder), std::end(kProblemOrder), item.key()) !=
        std::end(kProblemOrder)) {
      continue;
    }
    out += fmt::format("{}    \"{}\": {}", first ? "" : ",\n", item.key(), item.value().dump());
    first = false;
  }
  out += "\n  }";
  if (j.contains("inputs")) out += ",\n  \"inputs\": " + j.at("inputs").dump();
  if (j.contains("generator")) {
    const json& g = j.at("generator");
    out += fmt::format(",\n  \"generator\": {{\"name\": {}, \"seed\": {}, \"params\": {}}}",
                       g.at("name").dump(), g.at("seed").dump(), g.at("params").dump());
  }
  out += "\n}\n";
  return out;
}

Status SaveCase(const std::filesystem::path& path, const Case& c) {
  Case copy = c;
  if (copy.inputs) {
    // Relative to the new file's directory, so that LoadCase resolves it to the same file.
    const auto dir = std::filesystem::absolute(path).parent_path();
    const auto target = std::filesystem::absolute(*copy.inputs).lexically_normal();
    const auto rel = target.lexically_relative(dir);
    copy.inputs = (rel.empty() ? target : rel).generic_string();
  }
  return WriteFileAtomic(path, CaseToText(copy));
}

}  // namespace attest
