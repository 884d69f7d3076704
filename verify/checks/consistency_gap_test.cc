// The requirement on forward/backward consistency, as a test: on EVERY
// row of the gate suite that runs `consistency`, the correct low-precision models
// cpu/mxfp8-pvbf16 and cpu/nvfp4-mixed (and cpu/mxfp8-cudnn, whose only permitted gate failure
// is non-interference) pass the check, and every mutant whose bug class is "consistency"
// (kernels/mutants MutantsByClass) fails it with a consistency metric (the largest margin of
// its verdicts) at least 10x the correct models' largest. A mutant whose fault cannot act on a
// row (the softcap derivative on a row without softcap) is exempt there: its answers are the
// parent's bit for bit. Every metric is printed, so the log is the evidence table.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "kernels/kernel.h"
#include "kernels/mutants/mutants.h"
#include "reference/case/inputs.h"
#include "reference/problem/paged.h"
#include "verify/checks/consistency.h"
#include "run/suite.h"

namespace attest {
namespace {

double Metric(const std::vector<Verdict>& vs) {
  double m = 0;
  for (const Verdict& v : vs) m = std::max(m, v.margin);
  return m;
}

// Whether the mutant's fault can change anything on problem p.
bool Acts(const MutantSpec& spec, const Problem& p) {
  if (spec.hooks == &SoftcapNoDerivativeHooks()) return p.softcap > 0;
  return true;
}

TEST(ConsistencyGap, GateRowsSeparateMutantsFromCorrectModelsTenfold) {
  const Suite* gate = FindSuite("gate");
  ASSERT_NE(gate, nullptr);
  const std::vector<std::string> correct = {"cpu/mxfp8-pvbf16", "cpu/nvfp4-mixed",
                                            "cpu/mxfp8-cudnn"};
  // The gap is asserted against the two leak-free-by-recipe models of the requirement;
  // cpu/mxfp8-cudnn must pass but is reported only.
  const size_t gap_models = 2;
  const std::vector<const MutantSpec*> mutants = MutantsByClass("consistency");
  ASSERT_GE(mutants.size(), 3u);
  int rows = 0;
  for (const SuiteRow& row : gate->rows) {
    if (row.check != "consistency") continue;
    // The models and mutants here claim no learnable sink; the sink rows' consistency is
    // sink_checks_test's (ConsistencyJudgesSinkCases).
    if (row.case_template.problem.sink) continue;
    // Nor paged KV or seqused (logical_view_test judges those rows on the CPU models that
    // claim them).
    if (HasLogicalView(row.case_template.problem)) continue;
    ++rows;
    double worst_correct = 0;
    std::string label;
    for (size_t n = 0; n < correct.size(); ++n) {
      auto kernel = Kernels().Create(correct[n]);
      ASSERT_TRUE(kernel.ok()) << correct[n];
      const InstantiatedCase inst = Instantiate(row, (*kernel)->capabilities(), 0);
      ASSERT_TRUE(inst.c) << inst.label << ": " << inst.skipped;
      label = inst.label;
      auto in = MakeCaseInputs(*inst.c);
      ASSERT_TRUE(in.ok()) << in.error().message;
      const auto vs = CheckConsistency(**kernel, inst.c->problem, *in);
      ASSERT_FALSE(vs.empty()) << correct[n] << " " << inst.label;
      const double m = Metric(vs);
      std::printf("  %-40s %-34s metric %.3g\n", inst.label.c_str(), correct[n].c_str(), m);
      for (const Verdict& v : vs) EXPECT_TRUE(v.pass) << correct[n] << ": " << v.message;
      if (n < gap_models) worst_correct = std::max(worst_correct, m);
    }
    for (const MutantSpec* spec : mutants) {
      const std::string name = "mutant/" + std::string(spec->name);
      auto kernel = Kernels().Create(name);
      ASSERT_TRUE(kernel.ok()) << name;
      const InstantiatedCase inst = Instantiate(row, (*kernel)->capabilities(), 0);
      // A mutant of a kernel with narrower claims (cpu/tile64-bf16: MHA, Sq = Sk) meets only
      // the rows inside them.
      if (!inst.c && std::string(spec->parent) == "cpu/tile64-bf16") continue;
      ASSERT_TRUE(inst.c) << inst.label << ": " << inst.skipped;
      if (!Acts(*spec, inst.c->problem)) continue;
      auto in = MakeCaseInputs(*inst.c);
      ASSERT_TRUE(in.ok()) << in.error().message;
      const double m = Metric(CheckConsistency(**kernel, inst.c->problem, *in));
      std::printf("  %-40s %-34s metric %.3g (gap %.0fx)\n", inst.label.c_str(), name.c_str(), m,
                  m / worst_correct);
      EXPECT_GT(m, 1) << name << " on " << inst.label;
      EXPECT_GE(m, 10 * worst_correct) << name << " on " << inst.label << ": gap "
                                       << m / worst_correct;
    }
  }
  EXPECT_GE(rows, 5) << "the gate runs consistency on at least five rows";
}

}  // namespace
}  // namespace attest
