// Case files (`*.case.json`, docs/design.md "Case files"): a problem plus where its data comes
// from, either a safetensors file of inputs or a deterministic generator and seed. The same
// case file gives bit-identical inputs on any machine (see reference/data/generate.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "reference/data/generator_spec.h"
#include "reference/problem/problem.h"
#include "reference/status.h"

namespace attest {

struct Case {
  Problem problem;
  // Path of a safetensors file holding q, k, v (and do). LoadCase resolves a relative path
  // against the case file's directory, so this is usable as-is after loading.
  std::optional<std::string> inputs;
  std::optional<GeneratorSpec> generator;  // exactly one of inputs and generator is set

  bool operator==(const Case&) const = default;
};

// Parses a case object; a relative "inputs" path is joined to `base_dir` (left as-is when
// base_dir is empty). Errors name the field ("generator.seed: ...", "problem.window: ...").
// The generator name and params are checked against the generator table.
Expected<Case> CaseFromJson(const nlohmann::json& j, const std::filesystem::path& base_dir = {});
// Parses the text of a case file: strict JSON (reference/io/json.h: duplicate keys and deep
// nesting refused), then CaseFromJson. Errors start with `source`.
Expected<Case> ParseCaseText(std::string_view text, std::string_view source,
                             const std::filesystem::path& base_dir = {});
// Case files larger than this are refused before being read (a case with per-token document
// ids for a million tokens is about 8 MB).
inline constexpr uint64_t kMaxCaseFileBytes = uint64_t{64} << 20;
// Reads and parses a case file: a regular file of at most kMaxCaseFileBytes, then
// ParseCaseText. Errors start with the file's path.
Expected<Case> LoadCase(const std::filesystem::path& path);
// The case object with the problem in canonical form (ProblemToJson); `inputs` as stored.
nlohmann::json CaseToJson(const Case& c);
// The canonical text of a case (fixed key order, one problem field per line, shortest
// round-trip numbers, trailing newline): the same case always gives the same bytes.
std::string CaseToText(const Case& c);
// Writes CaseToText to `path` whole or not at all (files.h WriteFileAtomic). `inputs` is
// taken as LoadCase returns it (absolute, or relative to the current directory, NOT to
// `path`) and written relative to the new file's directory, so that LoadCase(path) finds the
// same tensor file: to save a.case.json next to a.inputs.safetensors in dir/, set
// inputs = "dir/a.inputs.safetensors".
Status SaveCase(const std::filesystem::path& path, const Case& c);

}  // namespace attest
