// The checks on learnable-sink cases (docs/checks.md "What the gate covers": learnable sink):
// special-values' exact relation of a sink of -inf (sink_relation.h) fails a kernel that reads
// -inf as a finite sink and passes the correct model on the gate's special-value sink row;
// non-interference with a sink fails a kernel whose sink path lets a hidden key in; the checks
// whose rules do not model the sink skip a sink case naming problem.sink; a kernel that does
// not claim sinks skips the sink rows as outside its capabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/models/flash_models.h"
#include "kernels/mutants/mutants.h"
#include "verify/checks/check_test_util.h"

namespace attest {
namespace {

using suite_test::Failures;
using suite_test::Flash2;

// cpu/flash2-bf16, except that a sink of -inf reaches the engine as 0: a -inf lost on the
// way (a conversion that saturates, a clamp of the sink parameter).
class MinusInfSinkAsZero final : public Kernel {
 public:
  MinusInfSinkAsZero() : inner_(Flash2()) {}
  std::string name() const override { return "test/minus-inf-sink-as-zero"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return inner_->Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }
  KernelAnswer<ForwardResult> ForwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& sink) override {
    return inner_->ForwardSink(p, q, k, v, Finite(sink));
  }
  KernelAnswer<BackwardResult> BackwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& o, const Tensor& lse,
                                            const Tensor& dout, const Tensor& sink) override {
    return inner_->BackwardSink(p, q, k, v, o, lse, dout, Finite(sink));
  }

 private:
  static Tensor Finite(const Tensor& sink) {
    Tensor w = ToF64(sink).Clone();
    for (double& x : w.span<double>()) {
      if (std::isinf(x)) x = 0;
    }
    return w;
  }
  std::unique_ptr<Kernel> inner_;
};

// cpu/flash2-bf16 whose sink path drops the causal mask (a sink variant of a kernel that was
// written for dense attention only): future keys leak into every row.
class SinkPathUnmasked final : public Kernel {
 public:
  SinkPathUnmasked() : inner_(Flash2()) {}
  std::string name() const override { return "test/sink-path-unmasked"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return inner_->Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }
  KernelAnswer<ForwardResult> ForwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& sink) override {
    return inner_->ForwardSink(Dense(p), q, k, v, sink);
  }
  KernelAnswer<BackwardResult> BackwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& o, const Tensor& lse,
                                            const Tensor& dout, const Tensor& sink) override {
    return inner_->BackwardSink(Dense(p), q, k, v, o, lse, dout, sink);
  }

 private:
  static Problem Dense(Problem p) {
    p.causal = false;
    return p;
  }
  std::unique_ptr<Kernel> inner_;
};

// The gate's rows whose label starts with `label`.
Suite GateRowsLabelled(const std::string& label) {
  const Suite* gate = FindSuite("gate");
  Suite s{gate->name, gate->description, {}};
  for (const SuiteRow& r : gate->rows) {
    if (r.case_template.label.rfind(label, 0) == 0) s.rows.push_back(r);
  }
  EXPECT_FALSE(s.rows.empty()) << label;
  return s;
}

RunResult RunRows(Kernel& kernel, const Suite& suite) {
  RunOptions o;
  o.kernel_spec = kernel.name();
  auto r = RunSuite(kernel, suite, o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : RunResult{};
}

constexpr std::string_view kRelation = "a head whose sink is -inf is bitwise the call without a sink";

int RelationVerdicts(const RunResult& r, bool failing) {
  int n = 0;
  for (const Verdict& v : r.report.verdicts) {
    if (v.check == "special-values" && v.policy == kRelation && v.pass != failing) ++n;
  }
  return n;
}

TEST(SinkChecks, MinusInfinitySinkRelationFailsAKernelThatMakesItFiniteAndPassesTheModel) {
  const Suite row = GateRowsLabelled("sink 1e30, -inf");
  auto model = Flash2();
  const RunResult good = RunRows(*model, row);
  EXPECT_TRUE(Failures(good).empty()) << Failures(good).front().message;
  EXPECT_EQ(RelationVerdicts(good, /*failing=*/false), 2);  // o and lse
  MinusInfSinkAsZero bad;
  const RunResult r = RunRows(bad, row);
  EXPECT_EQ(RelationVerdicts(r, /*failing=*/true), 2);
  EXPECT_TRUE(suite_test::AnyFailure(r, "accuracy", "o"));
}

TEST(SinkChecks, NonInterferenceRunsTheSinkPath) {
  Suite s = GateRowsLabelled("sink GQA 8:2");
  std::erase_if(s.rows, [](const SuiteRow& r) { return r.check != "non-interference"; });
  ASSERT_EQ(s.rows.size(), 1u);
  auto model = Flash2();
  const RunResult good = RunRows(*model, s);
  EXPECT_TRUE(Failures(good).empty());
  EXPECT_FALSE(good.report.verdicts.empty());
  SinkPathUnmasked leaky;
  EXPECT_TRUE(suite_test::AnyFailure(RunRows(leaky, s), "non-interference", "o"));
}

TEST(SinkChecks, RelationsWithoutTheSinkSkipASinkCaseAndKernelsWithoutSinksSkipTheRows) {
  auto model = Flash2();
  Suite s = GateRowsLabelled("sink GQA 8:2");
  const std::string label = s.rows.front().case_template.label;
  for (const char* check : {"bias", "permutation", "gqa-mha"}) {
    SuiteRow extra = s.rows.front();
    extra.check = check;
    s.rows.push_back(extra);
  }
  const RunResult r = RunRows(*model, s);
  EXPECT_TRUE(Failures(r).empty());
  int skipped_for_sink = 0;
  for (const SkippedRow& row : r.report.skipped) {
    skipped_for_sink += row.reason.find("problem.sink") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(skipped_for_sink, 3);
  // A kernel without Capabilities::sink: every sink row skipped as unclaimed, nothing failed.
  suite_test::Wrapper plain("test/no-sink");
  const RunResult q = RunRows(plain, GateRowsLabelled("sink "));
  EXPECT_TRUE(Failures(q).empty());
  EXPECT_TRUE(q.report.verdicts.empty() ||
              std::all_of(q.report.verdicts.begin(), q.report.verdicts.end(),
                          [](const Verdict& v) { return v.check == kCoverageCheck; }));
  for (const SkippedRow& row : q.report.skipped) {
    EXPECT_NE(row.reason.find("sink"), std::string::npos) << row.label << ": " << row.reason;
  }
}

// Consistency on sink cases (docs/checks.md "Consistency"): the identities read P from the
// kernel's lse, which includes the sink, so Σ_j P_ij = 1 - p_sink,i enters every prediction.
// The correct model passes both gate sink rows; a forward whose lse leaves the sink out, or
// whose o does, breaks the delta identity (D = rowsum(dO∘O) against Σ_j P_ij dP_ij).
TEST(SinkChecks, ConsistencyJudgesSinkCases) {
  Suite s = GateRowsLabelled("sink ");
  std::erase_if(s.rows, [](const SuiteRow& r) { return r.check != "consistency"; });
  ASSERT_EQ(s.rows.size(), 2u);
  auto model = Flash2();
  const RunResult good = RunRows(*model, s);
  EXPECT_TRUE(Failures(good).empty()) << Failures(good).front().message;
  EXPECT_GE(good.report.verdicts.size(), 10u);
  for (const char* name : {"sink-not-in-lse", "sink-after-normalisation"}) {
    MutantKernel bad(*FindMutant(name));
    EXPECT_TRUE(suite_test::AnyFailure(RunRows(bad, s), "consistency", "delta")) << name;
  }
}

// splits-agree with a sink (the gate's split-KV sink decode row): the split-KV model adds the
// sink once and passes; a combine that adds it once per split (ROCm/ROCm issue 12227,
// deviations.h SplitKvSinkPerSplitHooks) fails it on o and lse.
TEST(SinkChecks, SplitsAgreeWithASinkFailsTheSinkPerSplitCombine) {
  auto made = Kernels().Create(kSplitKvModelName);
  ASSERT_TRUE(made.ok());
  std::unique_ptr<Kernel> model = std::move(made).value();
  const Suite* gate = FindSuite("gate");
  Suite s{gate->name, gate->description, {}};
  for (const SuiteRow& r : RowsFor(*gate, model->capabilities(), 0)) {
    if (r.check == "splits-agree" &&
        r.case_template.label.rfind("split-KV decode sink", 0) == 0) {
      s.rows.push_back(r);
    }
  }
  ASSERT_EQ(s.rows.size(), 1u);
  const RunResult good = RunRows(*model, s);
  EXPECT_TRUE(Failures(good).empty()) << Failures(good).front().message;
  EXPECT_FALSE(good.report.verdicts.empty());
  MutantKernel bad(*FindMutant("splitkv-sink-per-split"));
  const RunResult r = RunRows(bad, s);
  EXPECT_TRUE(suite_test::AnyFailure(r, "splits-agree", "o"));
  EXPECT_TRUE(suite_test::AnyFailure(r, "splits-agree", "lse"));
}

}  // namespace
}  // namespace attest
