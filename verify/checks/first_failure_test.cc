// Keeps the claim of docs/checks.md honest (every mutant fails
// the gate, and the first failing check is the one that names its bug class), cheaply: for
// each mutant of kernels/mutants, the gate's rows of its bug_class check run in gate order up
// to the first that fails (one must), then on that row's case every check diagnosed before
// the bug class (check.h DiagnosisOrder) runs too, and the report's first failure must be
// the bug class. The whole gate on every kernel (the full claim, ~15 min) is what
// tools/docs/checks_table.py runs for docs/checks.md.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "kernels/mutants/mutants.h"
#include "verify/checks/check.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

// The last diagnosis step of `check` (accuracy has two: forward tensors, then gradients).
size_t LastRank(std::string_view check) {
  size_t last = 0;
  const auto order = DiagnosisOrder();
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].check == check) last = i;
  }
  return last;
}

// A suite of the gate's rows for a kernel (table, generated, fuzz: suite.h RowsFor) that
// satisfy `keep`.
Suite GateRows(const std::vector<SuiteRow>& rows,
               const std::function<bool(const SuiteRow&)>& keep) {
  const Suite* gate = FindSuite("gate");
  Suite s{gate->name, gate->description, {}};
  for (const SuiteRow& r : rows) {
    if (keep(r)) s.rows.push_back(r);
  }
  return s;
}

RunResult RunGate(Kernel& kernel, const Suite& suite) {
  RunOptions o;
  o.kernel_spec = kernel.name();
  auto r = RunSuite(kernel, suite, o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : RunResult{};
}

class MutantFirstFailure : public ::testing::TestWithParam<std::string_view> {};

TEST_P(MutantFirstFailure, IsTheMutantsBugClass) {
  const MutantSpec& spec = *FindMutant(GetParam());
  const std::string cls(spec.bug_class);
  ASSERT_NE(FindCheck(cls), nullptr) << "bug_class '" << cls << "' is not a registered check";
  auto kernel = Kernels().Create("mutant/" + std::string(spec.name));
  ASSERT_TRUE(kernel.ok());

  // 1. The bug class's own gate rows catch the mutant: run one row at a time, in gate order,
  // up to the first that fails (its case is where the claim is checked below).
  RunResult own;
  const Verdict* caught = nullptr;
  std::string label;
  const std::vector<SuiteRow> rows = RowsFor(*FindSuite("gate"), (*kernel)->capabilities(), 0);
  for (const SuiteRow& row : rows) {
    if (row.check != cls) continue;
    own = RunGate(**kernel, GateRows(rows, [&](const SuiteRow& r) { return &r == &row; }));
    caught = FirstFailure(own.report);
    if (caught != nullptr) {
      label = row.case_template.label;
      break;
    }
  }
  ASSERT_NE(caught, nullptr) << "the gate's " << cls << " rows do not catch mutant/"
                             << spec.name;
  EXPECT_EQ(caught->check, cls);

  // 2. On that case, nothing diagnosed before the bug class fails.
  const size_t last = LastRank(cls);
  const RunResult all = RunGate(**kernel, GateRows(rows, [&](const SuiteRow& r) {
    return r.case_template.label == label && DiagnosisRank(r.check, "") <= last;
  }));
  const Verdict* first = FirstFailure(all.report);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->check, cls) << "mutant/" << spec.name << " on '" << label
                               << "': first failure " << first->check << "/" << first->tensor
                               << ": " << first->message;
  std::printf("mutant/%s: %s on '%s', %s margin %.3g\n", std::string(spec.name).c_str(),
              cls.c_str(), label.c_str(), first->tensor.c_str(), first->margin);
}

std::vector<std::string_view> Names() {
  std::vector<std::string_view> out;
  for (const MutantSpec& s : MutantCatalogue()) out.push_back(s.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mutants, MutantFirstFailure, ::testing::ValuesIn(Names()),
                         [](const auto& info) {
                           std::string n(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace attest
