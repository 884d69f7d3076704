// What a suite covers of what a kernel claims (`attest list suites --coverage --kernel K`),
// and the rows that complete it. Two measures, both taken from the rows as instantiated for
// the kernel (run/suite.h Instantiate), never from what the rows were meant to be:
//   feature pairs  every two problem features the capabilities claim (causal, window,
//                  softcap, ALiBi, varlen, GQA, per-token documents, prefix-LM, block-sparse,
//                  Dv != D) appear together in at least one row, unless the problem
//                  semantics forbid the pair (reference/problem/problem.cc Validate);
//   boundaries     every length (Sq, Sk, each document's query and key length, D, Dv) takes
//                  its boundary values: 0 where legal, 1, and tile - 1, tile, tile + 1 for the
//                  tiles 64 and 128 (FlashAttention-2's forward 128 x 64 and backward 64 x 128
//                  tiles, kernels/models/flash_engine.h, which most production kernels share);
//                  a head dim list narrows the targets to the claimed values plus the smallest.
// CoverageRows generates, from the capabilities, rows for whatever a suite's table misses:
// pairs by a greedy covering with at most three features per row, boundaries one value per
// length per row. The gate appends them (run/suite.h RowsFor), so its coverage of any
// kernel is complete by construction and this file's measure says so (suite_coverage_test.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/kernel.h"
#include "reference/problem/problem.h"
#include "run/suite.h"

namespace attest {

// A problem feature a kernel may claim: one row per feature (coverage.cc kFeatures).
struct FeatureSpec {
  std::string_view name;                       // "causal", "window", ..., "dv"
  bool (*claimed)(const Capabilities& caps);   // the kernel claims it
  bool (*present)(const Problem& p);           // the problem uses it
};
std::span<const FeatureSpec> AllFeatures();
// The features `caps` claims, in table order.
std::vector<const FeatureSpec*> ClaimedFeatures(const Capabilities& caps);
// Why features a and b cannot share a problem (the Validate rule), or "" when they can.
std::string_view IncompatibleFeatures(std::string_view a, std::string_view b);

// The lengths that must take their boundary values.
enum class LengthKind : uint8_t { kSeqlenQ, kSeqlenK, kDocQ, kDocK, kHeadDim, kHeadDimV };
inline constexpr LengthKind kAllLengths[] = {LengthKind::kSeqlenQ, LengthKind::kSeqlenK,
                                             LengthKind::kDocQ,    LengthKind::kDocK,
                                             LengthKind::kHeadDim, LengthKind::kHeadDimV};
std::string_view Name(LengthKind kind);
// The tiles whose boundaries the targets hold.
inline constexpr int64_t kCoverageTiles[] = {64, 128};
// The values `kind` must take for a kernel with `caps`, ascending; empty when the length does
// not exist for it (document lengths without varlen or per-token documents).
std::vector<int64_t> BoundaryTargets(LengthKind kind, const Capabilities& caps);
// The values `kind` takes in `p`: Sq and Sk of a padded batch; every packed sequence's and
// every per-token document's query and key length (an id on one side only has length 0 on
// the other); D and Dv.
std::vector<int64_t> LengthValues(LengthKind kind, const Problem& p);

struct SuiteCoverage {
  std::string suite;
  size_t rows = 0;            // rows for the kernel (table, generated, fuzz)
  size_t generated_rows = 0;  // CoverageRows
  size_t fuzz_rows = 0;       // the fuzz tail
  size_t judged_cases = 0;    // distinct instantiated cases that count (honesty rows do not)
  std::vector<std::string> claimed;  // ClaimedFeatures' names
  struct Pair {
    std::string a, b;
    std::string reached_by;    // label of the first row with both features, "" if none
    std::string incompatible;  // IncompatibleFeatures(a, b): not required
  };
  std::vector<Pair> pairs;  // every pair of claimed features, in table order
  struct Boundary {
    LengthKind kind;
    std::vector<int64_t> targets;
    std::vector<int64_t> missing;  // targets no row reaches
  };
  std::vector<Boundary> boundaries;  // one per length that exists for the kernel
  // Every combinable pair and every boundary target reached.
  bool complete() const;
};

// The coverage of `suite` (all its rows for the kernel: RowsFor) for a kernel with `caps`.
SuiteCoverage CoverageOf(const Suite& suite, const Capabilities& caps, uint64_t run_seed = 0);
// The coverage of given rows (what CoverageOf measures), e.g. a table without its generated
// rows (suite_coverage_test.cc shows that such a table misses pairs and boundaries).
SuiteCoverage CoverageOfRows(std::string suite_name, std::span<const SuiteRow> rows,
                             const Capabilities& caps, uint64_t run_seed = 0);
nlohmann::json CoverageToJson(const SuiteCoverage& c);
// The listing: claimed features, each pair and the row that reaches it, each length's
// targets and the missing ones.
std::string CoverageToText(const SuiteCoverage& c);

// Rows generated from `caps` that reach what `table` (instantiated for caps) misses: every
// combinable pair of claimed features, then every boundary target. Row seeds start at
// `first_seed`. Pair rows run accuracy, unwritten-outputs, special-values, consistency (for a
// kernel with a backward) and non-interference where a mask feature is on; boundary rows
// accuracy, unwritten-outputs and special-values.
std::vector<SuiteRow> CoverageRows(std::span<const SuiteRow> table, const Capabilities& caps,
                                   uint64_t first_seed);

}  // namespace attest
