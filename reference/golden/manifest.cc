// Golden manifest JSON <-> GoldenManifest (format described in manifest.h).
#include "reference/golden/manifest.h"

#include <algorithm>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "reference/io/files.h"
#include "reference/io/json.h"

namespace attest {
namespace {

// A manifest lists a few dozen cases; anything near this size is not one.
constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;

}  // namespace

using nlohmann::json;

const GoldenEntry* GoldenManifest::Find(std::string_view name) const {
  for (const auto& e : cases) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void GoldenManifest::Upsert(GoldenEntry entry) {
  auto it = std::lower_bound(cases.begin(), cases.end(), entry.name,
                             [](const GoldenEntry& e, const std::string& n) { return e.name < n; });
  if (it != cases.end() && it->name == entry.name) {
    *it = std::move(entry);
  } else {
    cases.insert(it, std::move(entry));
  }
}

std::string GoldenCaseFile(std::string_view name) { return fmt::format("{}.case.json", name); }
std::string GoldenInputsFile(std::string_view name) {
  return fmt::format("{}.inputs.safetensors", name);
}
std::string GoldenOutputsFile(std::string_view name) {
  return fmt::format("{}.mp256.safetensors", name);
}

namespace {

bool IsHexDigest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// A case name becomes file names: keep it to a portable alphabet.
bool IsCaseName(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

Expected<std::string> GetString(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || !obj[key].is_string()) {
    return Error{fmt::format("{}.{}: missing or not a string", where, key)};
  }
  return obj[key].get<std::string>();
}

Expected<GoldenEntry> EntryFromJson(const json& j, const std::string& where) {
  if (!j.is_object()) return Error{where + ": not an object"};
  GoldenEntry e;
  auto name = GetString(j, "name", where);
  if (!name) return name.error();
  if (!IsCaseName(*name)) {
    return Error{fmt::format("{}.name: '{}' is not [a-z0-9_-]+", where, *name)};
  }
  e.name = *name;
  if (!j.contains("problem")) return Error{where + ".problem: missing"};
  auto problem = ProblemFromJson(j["problem"]);
  if (!problem) return Error{fmt::format("{}: {}", where, problem.error().message)};
  e.problem = *problem;

  const std::string pw = where + ".provenance";
  if (!j.contains("provenance") || !j["provenance"].is_object()) {
    return Error{pw + ": missing or not an object"};
  }
  const json& pj = j["provenance"];
  for (auto [key, field] : {std::pair{"generator", &e.provenance.generator},
                            std::pair{"attest_version", &e.provenance.attest_version},
                            std::pair{"commit", &e.provenance.commit},
                            std::pair{"precision", &e.provenance.precision},
                            std::pair{"date", &e.provenance.date}}) {
    auto s = GetString(pj, key, pw);
    if (!s) return s.error();
    *field = *s;
  }
  if (!pj.contains("seed") || !pj["seed"].is_number_unsigned()) {
    return Error{pw + ".seed: missing or not a non-negative integer"};
  }
  e.provenance.seed = pj["seed"].get<uint64_t>();
  if (pj.contains("params")) {
    if (!pj["params"].is_object()) return Error{pw + ".params: not an object"};
    e.provenance.params = pj["params"];
  }

  if (!j.contains("sha256") || !j["sha256"].is_object() || j["sha256"].empty()) {
    return Error{where + ".sha256: missing, empty or not an object"};
  }
  for (const auto& [file, digest] : j["sha256"].items()) {
    if (file.empty() || file.find('/') != std::string::npos || file.find("..") == 0) {
      return Error{fmt::format("{}.sha256: '{}' is not a plain file name", where, file)};
    }
    if (!digest.is_string() || !IsHexDigest(digest.get<std::string>())) {
      return Error{fmt::format("{}.sha256.{}: not 64 lower-case hex digits", where, file)};
    }
    e.sha256[file] = digest.get<std::string>();
  }
  return e;
}

}  // namespace

Expected<GoldenManifest> ManifestFromJson(const json& j, std::string_view source) {
  const std::string src(source);
  if (!j.is_object()) return Error{src + ": manifest is not a JSON object"};
  if (j.value("format", "") != kGoldenManifestFormat) {
    return Error{fmt::format("{}: format: expected \"{}\"", src, kGoldenManifestFormat)};
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int>() != kGoldenManifestVersion) {
    return Error{fmt::format("{}: version: expected {}", src, kGoldenManifestVersion)};
  }
  if (!j.contains("cases") || !j["cases"].is_array()) {
    return Error{src + ": cases: missing or not an array"};
  }
  GoldenManifest m;
  std::set<std::string> seen;
  for (size_t i = 0; i < j["cases"].size(); ++i) {
    auto e = EntryFromJson(j["cases"][i], fmt::format("{}: cases[{}]", src, i));
    if (!e) return e.error();
    if (!seen.insert(e->name).second) {
      return Error{fmt::format("{}: cases[{}].name: duplicate '{}'", src, i, e->name)};
    }
    m.Upsert(std::move(*e));
  }
  return m;
}

json ManifestToJson(const GoldenManifest& m) {
  json cases = json::array();
  for (const auto& e : m.cases) {
    json sha = json::object();
    for (const auto& [file, digest] : e.sha256) sha[file] = digest;
    cases.push_back({{"name", e.name},
                     {"problem", ProblemToJson(e.problem)},
                     {"provenance",
                      {{"generator", e.provenance.generator},
                       {"seed", e.provenance.seed},
                       {"params", e.provenance.params},
                       {"attest_version", e.provenance.attest_version},
                       {"commit", e.provenance.commit},
                       {"precision", e.provenance.precision},
                       {"date", e.provenance.date}}},
                     {"sha256", sha}});
  }
  return {{"format", kGoldenManifestFormat},
          {"version", kGoldenManifestVersion},
          {"cases", cases}};
}

Expected<GoldenManifest> LoadManifest(const std::filesystem::path& path) {
  ReadLimits limits;
  limits.max_bytes = kMaxManifestBytes;
  limits.what = "manifest";
  auto text = ReadRegularFile(path.string(), limits);
  if (!text) return text.error();
  auto j = ParseJson(*text, path.string());
  if (!j) return j.error();
  return ManifestFromJson(*j, path.string());
}

Status SaveManifest(const std::filesystem::path& path, const GoldenManifest& m) {
  return WriteFileAtomic(path, ManifestToJson(m).dump(2) + "\n");
}

}  // namespace attest
