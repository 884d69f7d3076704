// RapidCheck glue for the case generators of case_gen.h (docs/fuzz.md): the drawing
// code runs inside gen::exec with every pick a gen::inRange, so RapidCheck records the picks
// and shrinks them (toward the first, simplest choice of each: tiny lengths, one head, no
// mask, gaussian). Arbitrary<Problem> and Arbitrary<GeneratorSpec> draw for a kernel that
// claims every feature; GenCase(caps) draws inside a given kernel's capabilities.
#pragma once

#include <rapidcheck.h>

#include <ostream>
#include <string>
#include <vector>

#include "kernels/builtin.h"
#include "run/case_gen.h"
#include "run/fuzz.h"
#include "reference/case/case_file.h"

namespace attest {

class RcPicker final : public Picker {
 public:
  int64_t Int(int64_t lo, int64_t hi) override { return *rc::gen::inRange<int64_t>(lo, hi + 1); }
};

inline rc::Gen<Case> GenCase(const Capabilities& caps, const DrawLimits& limits = {}) {
  return rc::gen::exec([caps, limits] {
    RcPicker pick;
    return DrawCase(caps, pick, limits);
  });
}

// Capabilities that claim every feature the generators know (any dtype and head dim).
inline Capabilities EverythingCapabilities() {
  Capabilities caps;
  caps.causal = caps.window = caps.softcap = caps.alibi = caps.varlen = caps.gqa = true;
  caps.documents = caps.prefix_lm = caps.block_sparse = caps.backward = true;
  caps.deterministic = true;
  return caps;
}

// The built-in CPU numerics models (`cpu/...`), sorted.
inline std::vector<std::string> CpuModelNames() {
  std::vector<std::string> out;
  for (const auto& n : Kernels().Names()) {
    if (n.rfind("cpu/", 0) == 0) out.push_back(n);
  }
  return out;
}

// Counterexamples print as case files.
inline void showValue(const Case& c, std::ostream& os) { os << CaseToText(c); }
inline void showValue(const Problem& p, std::ostream& os) { os << ProblemToJson(p).dump(); }
inline void showValue(const GeneratorSpec& g, std::ostream& os) {
  os << g.name << " seed " << g.seed << " " << g.params.dump();
}

}  // namespace attest

namespace rc {

template <>
struct Arbitrary<attest::Problem> {
  static Gen<attest::Problem> arbitrary() {
    return gen::exec([] {
      attest::RcPicker pick;
      return attest::DrawProblem(attest::EverythingCapabilities(), pick);
    });
  }
};

template <>
struct Arbitrary<attest::GeneratorSpec> {
  static Gen<attest::GeneratorSpec> arbitrary() {
    return gen::exec([] {
      attest::RcPicker pick;
      attest::DrawLimits all;
      all.generators = attest::GeneratorNames();
      return attest::DrawGenerator(attest::Problem{}, pick, all);
    });
  }
};

}  // namespace rc
