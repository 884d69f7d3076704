// A kernel with ordinary shape limits is judged, not refused: cpu/tile64-bf16 (Sq = Sk,
// multiples of 64, MHA, causal or none; kernels/models/flash_models.h) passes the whole gate
// with its coverage complete and its guard satisfied; every row it runs lies inside its limits
// (moved there by kernels/shape_limits.h FitShape); a row is skipped only when no legal shape
// keeps what it is for, and then the reason says which limit. Its seeded-bug variants fail on
// the check named for each (verify/checks/first_failure_test.cc runs them).
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "kernels/models/flash_models.h"
#include "run/coverage.h"
#include "run/run.h"
#include "run/suite.h"
#include "run/suite_coverage.h"

namespace attest {
namespace {

Capabilities Tile64Caps() { return Tile64Model().capabilities(); }

TEST(ShapeLimitedKernel, EveryGateRowItRunsIsInsideItsLimits) {
  const Capabilities caps = Tile64Caps();
  const Suite& gate = *FindSuite("gate");
  int moved = 0, run = 0, skipped_for_shape = 0;
  std::set<int64_t> lengths;
  for (const SuiteRow& row : RowsFor(gate, caps, 0)) {
    const InstantiatedCase inst = Instantiate(row, caps, 0);
    if (!inst.c) {
      if (inst.skipped.rfind("shape limits: ", 0) == 0) ++skipped_for_shape;
      continue;
    }
    if (!row.case_template.adapt) continue;  // honesty rows ask about what is not claimed
    ++run;
    std::string why;
    EXPECT_TRUE(caps.Covers(inst.c->problem, &why)) << inst.label << ": " << why;
    moved += inst.label.find("moved inside the kernel's shape limits") != std::string::npos;
    lengths.insert(inst.c->problem.seqlen_q);
  }
  EXPECT_GT(run, 40);
  EXPECT_GT(moved, 10);
  // Rows for Sq < Sk or Sq > Sk cannot be kept at Sq = Sk; they say so.
  EXPECT_GT(skipped_for_shape, 5);
  // The tile boundaries of 64 and 128 land on one, two and three 64-tiles.
  for (int64_t l : {64, 128, 192}) EXPECT_TRUE(lengths.count(l)) << l;
}

TEST(ShapeLimitedKernel, TheGatesCoverageOfItIsComplete) {
  const Capabilities caps = Tile64Caps();
  const SuiteCoverage c = CoverageOf(*FindSuite("gate"), caps, 0);
  EXPECT_TRUE(c.complete()) << CoverageToText(c);
  // The boundaries are those of its own block.
  for (const auto& b : c.boundaries) {
    if (b.kind == LengthKind::kSeqlenQ) {
      EXPECT_EQ(b.targets, (std::vector<int64_t>{0, 64, 128, 192})) << CoverageToText(c);
    }
  }
}

TEST(ShapeLimitedKernel, PassesTheGateWithItsCoverageGuard) {
  auto kernel = Kernels().Create(Tile64Model::kName);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  RunOptions options;
  options.kernel_spec = Tile64Model::kName;
  auto r = RunSuite(**kernel, *FindSuite("gate"), options);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ApplyCoverageGuard(r->report, CoveragePolicy{});
  std::string failures;
  for (const Verdict& v : r->report.verdicts) {
    if (!v.pass) failures += v.check + " " + v.tensor + " " + v.case_label + ": " + v.message + "\n";
  }
  EXPECT_TRUE(r->report.passed()) << failures;
  EXPECT_GT(r->report.verdicts.size(), 300u);
  // Refusals outside the limits are honest: the honesty rows that break them pass.
  int honesty = 0;
  for (const Verdict& v : r->report.verdicts) honesty += v.check == "honesty";
  EXPECT_GT(honesty, 0);
}

}  // namespace
}  // namespace attest
