// The gate covers what a kernel claims (run/suite_coverage.h): for every registered kernel the
// gate reaches every combinable pair of claimed features and every length boundary; the
// gate's table alone does not (so the measure can fail), and the rows generated for what the
// table misses catch a pair-only and a boundary-only bug that no table row exercises.
#include "run/suite_coverage.h"

#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "reference/case/case_file.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

const Suite& Gate() { return *FindSuite("gate"); }

TEST(Coverage, TheGateReachesEveryClaimedPairAndBoundaryOfEveryKernel) {
  for (const std::string& name : Kernels().Names()) {
    auto k = Kernels().Create(name);
    ASSERT_TRUE(k.ok()) << name;
    const Capabilities caps = (*k)->capabilities();
    const SuiteCoverage c = CoverageOf(Gate(), caps);
    EXPECT_TRUE(c.complete()) << name << "\n" << CoverageToText(c);
    // The claim is measured, not assumed: every claimed feature appears in some pair row.
    EXPECT_EQ(c.claimed.size(), ClaimedFeatures(caps).size());
    EXPECT_FALSE(c.boundaries.empty());
  }
}

TEST(Coverage, TheTableAloneMissesPairsAndBoundaries) {
  auto k = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(k.ok());
  const Capabilities caps = (*k)->capabilities();
  const SuiteCoverage c = CoverageOfRows("gate table", Gate().rows, caps);
  EXPECT_FALSE(c.complete());
  std::set<std::string> missing_pairs;
  for (const auto& p : c.pairs) {
    if (p.reached_by.empty() && p.incompatible.empty()) missing_pairs.insert(p.a + " x " + p.b);
  }
  EXPECT_TRUE(missing_pairs.count("window x softcap")) << CoverageToText(c);
  EXPECT_TRUE(missing_pairs.count("documents x window")) << CoverageToText(c);
  bool sq0_missing = false;
  for (const auto& b : c.boundaries) {
    if (b.kind == LengthKind::kSeqlenQ) {
      sq0_missing = std::find(b.missing.begin(), b.missing.end(), 0) != b.missing.end();
    }
  }
  EXPECT_TRUE(sq0_missing) << CoverageToText(c);
  const std::string text = CoverageToText(c);
  EXPECT_NE(text.find("MISSING"), std::string::npos);
  EXPECT_NE(text.find("coverage INCOMPLETE"), std::string::npos);
}

TEST(Coverage, NarrowCapabilitiesGetTheirOwnTargets) {
  // Head-dim lists narrow the targets to claimed values (and the smallest); documents without
  // varlen get their lengths from per-token ids; a plain kernel has no pairs at all.
  Capabilities caps;
  caps.dtypes = {DType::kF16};
  caps.head_dims = {32, 64, 96, 128};
  caps.head_dims_v = {64, 128};
  caps.causal = caps.window = caps.documents = caps.backward = true;
  EXPECT_EQ(BoundaryTargets(LengthKind::kHeadDim, caps), (std::vector<int64_t>{32, 64, 128}));
  EXPECT_EQ(BoundaryTargets(LengthKind::kHeadDimV, caps), (std::vector<int64_t>{64, 128}));
  const SuiteCoverage c = CoverageOf(Gate(), caps);
  EXPECT_TRUE(c.complete()) << CoverageToText(c);
  EXPECT_EQ(c.claimed, (std::vector<std::string>{"dv", "documents", "causal", "window"}));
  Capabilities plain;
  plain.dtypes = {DType::kBF16};
  const SuiteCoverage p = CoverageOf(Gate(), plain);
  EXPECT_TRUE(p.pairs.empty());
  EXPECT_TRUE(p.complete()) << CoverageToText(p);
  EXPECT_TRUE(BoundaryTargets(LengthKind::kDocQ, plain).empty());
}

// A kernel that claims no mask (no causal, window, documents, varlen, ALiBi; dense attention
// only, as cuDNN's FP8 forward on an H100, docs/gpu-results.md) still gets non-interference
// rows in the gate: a dense batch whose other sequences are protected.
TEST(Coverage, AKernelWithoutMasksStillGetsNonInterferenceRows) {
  Capabilities dense;
  dense.dtypes = {DType::kBF16};
  dense.head_dims = dense.head_dims_v = {64, 128};
  dense.gqa = true;
  int rows = 0;
  for (const SuiteRow& r : Gate().rows) {
    if (r.check == "non-interference" && r.case_template.problem.batch > 1 &&
        dense.Covers(r.case_template.problem)) {
      ++rows;
    }
  }
  EXPECT_GE(rows, 1);
}

TEST(Coverage, RowsAreTheSameForTheSameSeedAndTheFuzzTailFollowsTheSeed) {
  auto k = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(k.ok());
  const Capabilities caps = (*k)->capabilities();
  auto texts = [&](uint64_t seed) {
    std::vector<std::string> out;
    for (const SuiteRow& r : RowsFor(Gate(), caps, seed)) {
      const InstantiatedCase c = Instantiate(r, caps, seed);
      out.push_back(r.check + " " + (c.c ? CaseToText(*c.c) : c.skipped));
    }
    return out;
  };
  const auto a = texts(3), b = texts(3), other = texts(4);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), other.size());
  EXPECT_NE(a, other);
  EXPECT_EQ(a.size(), Gate().rows.size() + CoverageRows(Gate().rows, caps, 0).size() +
                          static_cast<size_t>(Gate().fuzz_cases));
  EXPECT_GT(Gate().fuzz_cases, 0);
}

// cpu/flash2-bf16 with a defect that needs two features, or one length, at once.
class Defect : public Kernel {
 public:
  enum Kind { kSoftcapIgnoredUnderWindow, kLastColumnDroppedAtD65 };
  explicit Defect(Kind kind) : kind_(kind) {
    auto k = Kernels().Create("cpu/flash2-bf16");
    EXPECT_TRUE(k.ok());
    inner_ = std::move(k).value();
  }
  std::string name() const override { return "test/defect"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = false;  // forwards the plain entry points only
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto a = inner_->Forward(Read(p), q, k, v);
    if (auto* r = std::get_if<ForwardResult>(&a); r && kind_ == kLastColumnDroppedAtD65 &&
                                                   p.head_dim_v == 65 && r->o.numel() > 0) {
      Tensor o = ToF64(r->o).Clone();
      auto s = o.span<double>();
      for (size_t e = 64; e < s.size(); e += 65) s[e] = 0;  // the column past a 64 tile
      r->o = *FromF64(o, r->o.dtype());
    }
    return a;
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(Read(p), q, k, v, o, lse, dout);
  }

 private:
  // The problem as the defective kernel reads it.
  Problem Read(const Problem& p) const {
    Problem r = p;
    const bool window = p.window_left >= 0 || p.window_right >= 0;
    if (kind_ == kSoftcapIgnoredUnderWindow && window) r.softcap = 0;
    return r;
  }
  Kind kind_;
  std::unique_ptr<Kernel> inner_;
};

TEST(Coverage, GeneratedRowsCatchWhatNoTableRowExercises) {
  for (Defect::Kind kind : {Defect::kSoftcapIgnoredUnderWindow, Defect::kLastColumnDroppedAtD65}) {
    Defect kernel(kind);
    const Capabilities caps = kernel.capabilities();
    // No table row has the defect's trigger ...
    for (const SuiteRow& row : Gate().rows) {
      const InstantiatedCase c = Instantiate(row, caps, 0);
      if (!c.c || !row.case_template.adapt) continue;
      const Problem& p = c.c->problem;
      const bool window = p.window_left >= 0 || p.window_right >= 0;
      EXPECT_FALSE(kind == Defect::kSoftcapIgnoredUnderWindow && window && p.softcap > 0)
          << c.label;
      EXPECT_FALSE(kind == Defect::kLastColumnDroppedAtD65 && p.head_dim_v == 65) << c.label;
    }
    // ... and the generated rows fail it on accuracy.
    Suite generated{"generated", "", CoverageRows(Gate().rows, caps, 1)};
    RunOptions o;
    o.kernel_spec = kernel.name();
    o.only_check = "accuracy";
    auto r = RunSuite(kernel, generated, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_FALSE(r->report.passed()) << "defect " << kind;
    bool o_fails = false;
    for (const Verdict& v : r->report.verdicts) o_fails |= !v.pass && v.tensor == "o";
    EXPECT_TRUE(o_fails) << ToConsole(r->report);
  }
}

}  // namespace
}  // namespace attest
