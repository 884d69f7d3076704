// Verdicts and reports (issue "verify/" items 2 and 5; DESIGN.md "Checks"): every check
// reports a margin (observed / allowed) and the worst location, not just pass/fail, and
// every failure carries the one line that reproduces it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verify/metrics.h"

namespace attest {

struct Verdict {
  std::string check;   // "accuracy", "non-interference", ...
  std::string tensor;  // "o", "lse", "dq", ... ("" when the check is not about one tensor)
  std::string policy;  // the rule applied, e.g. "err <= 2x baseline + 2 bf16 ulp(row)"
  bool pass = false;
  double observed = 0;  // the quantity measured at the worst location
  double allowed = 0;   // its bound there
  double margin = 0;    // observed / allowed: ≤ 1 passes; inf when allowed is 0 or the
                        // failure is categorical (NaN where the oracle is finite)
  Location worst;
  std::string message;  // one line for a person
  std::string repro;    // one command line reproducing the check ("" when it passed)
};

// observed / allowed, with 0/0 = 0 and x/0 = inf.
double Margin(double observed, double allowed);

struct Timing {
  std::string name;  // "oracle", "kernel forward", ...
  double seconds = 0;
};

struct Report {
  std::string kernel;
  std::string suite;
  uint64_t seed = 0;
  std::vector<Verdict> verdicts;
  std::vector<Timing> timings;

  bool passed() const;
  int failures() const;
};

}  // namespace attest
