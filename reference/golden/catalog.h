// The list of golden cases: small problems that together cover
// every feature of reference/problem (masks, GQA, Dv != D, softcap, ALiBi, packed varlen with
// zero-length sequences, empty rows, Sk = 1, dtypes, odd head dims, batch > 1). The catalogue
// is the source of truth for `attest golden regen`; the manifest records what was written.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "reference/case/case_file.h"
#include "reference/problem/problem.h"

namespace attest {

struct GoldenCaseSpec {
  std::string name;     // file stem, [a-z0-9_]+
  std::string covers;   // one line: which feature this case pins
  Problem problem;
  GeneratorSpec generator;  // inputs: this generator, rounded to problem.dtype
};

// Every golden case, in name order. Built once.
std::span<const GoldenCaseSpec> GoldenCatalog();
const GoldenCaseSpec* FindGoldenCase(std::string_view name);

}  // namespace attest
