// Which generator fills a case's inputs: a row of the generator table (generate.h), its seed
// and its parameters, as a case file's "generator" object spells it (docs/design.md "Case
// files"). Here, not in reference/case/case_file.h, so that the generators need not know
// about case files: reference/case/ reads and writes this object, reference/data/ runs it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace attest {

// {"name": "gaussian", "seed": 12345, "params": {}}: a row of reference/data's generator table.
struct GeneratorSpec {
  std::string name;
  uint64_t seed = 0;
  nlohmann::json params = nlohmann::json::object();

  bool operator==(const GeneratorSpec&) const = default;
};

}  // namespace attest
