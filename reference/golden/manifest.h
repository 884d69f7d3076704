// The golden manifest (golden/cases/manifest.json): for every pinned case its problem, where
// its data came from (generator, seed, attest version and commit, oracle precision, date) and
// the SHA-256 of each of its files, so that `attest golden verify` can tell a corrupt or
// missing file (infrastructure, exit 2) from numerical drift of the oracle (a finding, exit 1).
// Format: {"format": "attest-golden-manifest", "version": 1, "cases": [{...}, ...]}, cases in
// name order; see golden/README.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/problem/problem.h"
#include "reference/status.h"

namespace attest {

inline constexpr std::string_view kGoldenManifestFormat = "attest-golden-manifest";
inline constexpr int kGoldenManifestVersion = 1;

struct GoldenProvenance {
  std::string generator;  // reference/data generator row, e.g. "gaussian"
  uint64_t seed = 0;
  nlohmann::json params = nlohmann::json::object();  // the generator's params as given
  std::string attest_version;  // PROJECT_VERSION of the attest that wrote the outputs
  std::string commit;          // `git rev-parse HEAD` of that tree, or "unknown"
  std::string precision;       // oracle precision of the outputs: "mp256"
  std::string date;            // UTC, ISO 8601 ("2026-12-02T10:00:00Z")

  bool operator==(const GoldenProvenance&) const = default;
};

struct GoldenEntry {
  std::string name;
  Problem problem;
  GoldenProvenance provenance;
  std::map<std::string, std::string> sha256;  // file name (in the manifest's folder) -> hex
};

struct GoldenManifest {
  std::vector<GoldenEntry> cases;  // sorted by name, names unique

  const GoldenEntry* Find(std::string_view name) const;
  // Inserts or replaces the entry of the same name, keeping the name order.
  void Upsert(GoldenEntry entry);
};

// The three files of case NAME.
std::string GoldenCaseFile(std::string_view name);     // NAME.case.json
std::string GoldenInputsFile(std::string_view name);   // NAME.inputs.safetensors
std::string GoldenOutputsFile(std::string_view name);  // NAME.mp256.safetensors

// Parsing names the source and the field at fault ("manifest.json: cases[3].sha256: ...").
Expected<GoldenManifest> ManifestFromJson(const nlohmann::json& j, std::string_view source);
nlohmann::json ManifestToJson(const GoldenManifest& m);
Expected<GoldenManifest> LoadManifest(const std::filesystem::path& path);
// Writes the JSON (two-space indent, trailing newline): the same manifest gives the same bytes.
Status SaveManifest(const std::filesystem::path& path, const GoldenManifest& m);

}  // namespace attest
