// Mutation-kill properties (docs/fuzz.md; the test that keeps the checks honest): for
// every mutant of kernels/mutants, a bounded search (at most kMaxCases drawn (check, case)
// pairs, fixed seed) finds a case on which some check fails for the mutant AND passes for its
// parent, and shrinks it. Prints, per mutant, the cases needed, the killing check (against
// the mutant's bug_class), and the shrunk Sq, Sk.
//
// With ATTEST_REGEN_BUGS=1 in the environment, also (re)writes golden/bugs/: one shrunk case
// per mutant and manifest.json, which golden_bugs_test replays.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "kernels/builtin.h"
#include "kernels/mutants/mutants.h"
#include "run/fuzz.h"
#include "run/suite.h"

namespace attest {
namespace {

// The target: every mutant is killed within 200 generated cases.
constexpr int64_t kMaxCases = 200;
// Fixed: a change of generators or checks that loses a kill shows here.
constexpr uint64_t kSeed = 20261202;

class MutationKill : public ::testing::TestWithParam<std::string> {};

TEST_P(MutationKill, ABoundedSearchFindsACaseWhereTheMutantFailsAndItsParentPasses) {
  const MutantSpec* spec = FindMutant(GetParam());
  ASSERT_NE(spec, nullptr);
  auto mutant = Kernels().Create("mutant/" + std::string(spec->name));
  ASSERT_TRUE(mutant.ok()) << mutant.error().message;
  std::unique_ptr<Kernel> parent = MakeParent(*spec);

  // Two phases of kMaxCases / 2 cases: first the check family that names the bug (its
  // bug_class: does that family catch it?), then every check (does anything?).
  FuzzOptions o;
  o.kernel_spec = "mutant/" + std::string(spec->name);
  o.baseline = parent.get();
  o.baseline_spec = std::string(spec->parent);
  o.seed = kSeed;
  o.cases = kMaxCases / 2;
  o.max_failures = 1;
  o.max_shrink_attempts = 150;
  // Shrunk records stay at least 2x past their bound (or categorical), so golden/bugs
  // survives small tolerance changes.
  o.shrink_min_margin = 2;
  o.checks = {std::string(spec->bug_class)};
  auto report = RunFuzz(**mutant, o);
  ASSERT_TRUE(report.ok()) << report.error().message;
  int64_t cases_before = 0;
  if (report->failures.empty()) {
    cases_before = report->cases_run;
    o.checks.clear();
    o.seed = kSeed + 1;
    report = RunFuzz(**mutant, o);
    ASSERT_TRUE(report.ok()) << report.error().message;
  }
  ASSERT_EQ(report->failures.size(), 1u)
      << o.kernel_spec << " survived " << kMaxCases << " cases (seed " << kSeed << ")";
  const FuzzFailure& f = report->failures.front();
  const int64_t cases_to_kill = cases_before + f.case_index + 1;
  std::printf(
      "KILL %-28s cases %3lld  check %-17s %-4s (bug_class %s%s)  shrunk Sq %lld Sk %lld  "
      "%s -> %s\n",
      std::string(spec->name).c_str(), static_cast<long long>(cases_to_kill), f.check.c_str(),
      f.tensor.c_str(), std::string(spec->bug_class).c_str(),
      f.check == spec->bug_class ? ", same" : "", static_cast<long long>(f.shrunk.problem.seqlen_q),
      static_cast<long long>(f.shrunk.problem.seqlen_k),
      DescribeProblem(f.original.problem).c_str(), DescribeProblem(f.shrunk.problem).c_str());

  // The shrunk case is a real kill: the mutant fails the check there and the parent passes.
  const CheckInfo* check = FindCheck(f.check);
  ASSERT_NE(check, nullptr);
  auto m = RunCheckOnCase(**mutant, o.kernel_spec, f.shrunk, *check);
  auto p = RunCheckOnCase(*parent, o.baseline_spec, f.shrunk, *check);
  ASSERT_TRUE(m.ok() && p.ok());
  EXPECT_TRUE(m->failed());
  EXPECT_FALSE(p->failed()) << p->failing.front().message;

  if (const char* regen = std::getenv("ATTEST_REGEN_BUGS"); regen && std::string(regen) == "1") {
    const std::filesystem::path dir = std::filesystem::path(ATTEST_SOURCE_DIR) / "golden/bugs";
    std::filesystem::create_directories(dir);
    const std::string file = std::string(spec->name) + ".case.json";
    ASSERT_TRUE(SaveCase(dir / file, f.shrunk).ok());
    nlohmann::json entry = {{"mutant", "mutant/" + std::string(spec->name)},
                            {"parent", std::string(spec->parent)},
                            {"check", f.check},
                            {"tensor", f.tensor},
                            {"bug_class", std::string(spec->bug_class)},
                            {"case", file},
                            {"search_seed", o.seed},
                            {"cases_to_kill", cases_to_kill},
                            {"original", DescribeProblem(f.original.problem)},
                            {"shrunk", DescribeProblem(f.shrunk.problem)}};
    std::ofstream(dir / (std::string(spec->name) + ".entry.json")) << entry.dump(2) << "\n";
  }
}

std::vector<std::string> MutantNames() {
  std::vector<std::string> names;
  for (const MutantSpec& s : MutantCatalogue()) names.emplace_back(s.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryMutant, MutationKill, ::testing::ValuesIn(MutantNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace attest
