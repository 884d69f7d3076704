// Suites as data (docs/design.md "CLI contract" `attest check --suite`):
// a suite is a list of rows (check, case template, seed). A case template is a Problem and a
// generator spec written for a generic kernel; Instantiate adapts it to the kernel under test
// (its first dtype, a head dim it supports) and skips rows that need features the kernel does
// not claim, except honesty rows, which exist to ask exactly that.
//   quick: a few cases per check family, < 30 s for a CPU model on 2 cores;
//   gate:  the merge gate: Sq != Sk both ways, tile boundaries +-1 of 64/128 tiles, GQA,
//          Dv != D, varlen with a zero-length document, windows, softcap, ALiBi, causal in
//          both alignments, batch > 1, special values; then rows generated from the kernel's
//          capabilities until every claimed feature pair and every length boundary is reached
//          (run/suite_coverage.h), then a fixed-seed fuzz tail: `attest fuzz --seed S --cases N`'s
//          cases (run/fuzz.h), drawn inside the capabilities; < 5 min for a CPU
//          model;
//   full:  gate plus longer sequences, head dim 128 and more seeds;
//   long:  8k-128k tokens on sampled rows (verify/metrics/sample.h), forward judged; not in the
//          default test run (docs/long-suite.md has its times).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "reference/case/case_file.h"
#include "reference/status.h"

namespace attest {

struct CaseTemplate {
  std::string label;          // what the case is for: "tile+1", "zero-length doc", ...
  Problem problem;            // dtype and head dims are adapted to the kernel (when adapt)
  GeneratorSpec generator;    // its seed is replaced by the row's (mixed with the run seed)
  // Adjusts the instantiated case (after adaptation), e.g. generator params that depend on
  // the dtype's range. May be empty.
  std::function<void(Case&)> finish;
  // Adapt dtype and head dims to the kernel's capabilities and skip rows outside them. Off
  // for honesty rows, whose point is a problem the kernel may not claim.
  bool adapt = true;
  // What the row's shape is for, kept when a kernel's shape limits move it (kernels/
  // shape_limits.h FitShape): a batch and zero-length sequences by default; the order of Sq
  // and Sk only where the label states it ("Sq<Sk", "Sq>Sk", "empty rows": Builder in
  // suite.cc sets it).
  ShapeIntent intent{.order = false};
};

struct SuiteRow {
  std::string check;  // a name of AllChecks()
  CaseTemplate case_template;
  uint64_t seed = 0;
};

struct Suite {
  std::string name;
  std::string description;
  std::vector<SuiteRow> rows;  // the table, the same for every kernel
  // After the table: rows generated from the kernel's capabilities for the feature pairs and
  // length boundaries the table misses (run/suite_coverage.h CoverageRows), then, for a kernel
  // that declares two split counts or more (Capabilities::num_splits), the split-KV rows: each
  // at every declared count, and splits-agree (run/suite.cc SplitRows).
  bool cover_capabilities = false;
  // Then this many fuzz cases: case n is `attest fuzz --seed S`'s case n for the run seed S
  // (run/case_gen.h DrawCase from PhiloxPicker(MixSeed(S, n)), its check drawn
  // first from AllChecks(), as run/fuzz.cc DrawFuzzCase does).
  int64_t fuzz_cases = 0;
  // Judges the forward only (the long suite: sampled cases judge o and lse; CheckContext in
  // verify/checks/check.h): the coverage guard does not require the backward's families.
  bool forward_only = false;
};

// Every row of `suite` for a kernel with `caps` under `run_seed`: the table, the generated
// coverage rows, the fuzz tail. RunSuite runs exactly these.
std::vector<SuiteRow> RowsFor(const Suite& suite, const Capabilities& caps, uint64_t run_seed);
// The fuzz tail alone (RowsFor's last `cases` rows).
std::vector<SuiteRow> FuzzTailRows(const Capabilities& caps, uint64_t run_seed, int64_t cases);

// "quick", "gate", "full", "long", built once.
std::span<const Suite> AllSuites();
const Suite* FindSuite(std::string_view name);

// The generator seed of a row under a run seed (SplitMix64 of both): the same (run seed, row
// seed) always gives the same case.
uint64_t MixSeed(uint64_t run_seed, uint64_t row_seed);

// A row's case for a kernel, or why the row does not apply to it. For a kernel with shape
// limits (Capabilities::shapes) the row's problem is first moved to the nearest legal shape
// that keeps its intent (honesty rows: any legal shape, or their own when none is); a row no
// legal shape keeps is skipped with the reason.
struct InstantiatedCase {
  std::optional<Case> c;
  std::string skipped;  // set when c is empty
  std::string label;    // template label plus a short problem description
};
InstantiatedCase Instantiate(const SuiteRow& row, const Capabilities& caps, uint64_t run_seed);

// "B2 H4:2 Sq77 Sk130 D64 bf16 causal": the features of a problem in one short line.
std::string DescribeProblem(const Problem& p);

}  // namespace attest
