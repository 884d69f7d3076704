// The checks on learnable relative-bias cases (docs/checks.md "What the gate covers": learnable
// relative bias): special-values' exact relation of a zero table (relbias_relation.h) passes
// the correct model on the gate's GQA bias row and fails a kernel that offsets the table it
// reads; a kernel that does not claim the bias skips the bias rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "verify/checks/check_test_util.h"

namespace attest {
namespace {

using suite_test::Failures;
using suite_test::Flash2;

// cpu/flash2-bf16, except that the bias table reaches the engine offset by 2^-12 (a table
// stored with a bias correction, or a zero that is not one).
class OffsetTable final : public Kernel {
 public:
  OffsetTable() : inner_(Flash2()) {}
  std::string name() const override { return "test/offset-rel-bias-table"; }
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
  KernelAnswer<ForwardResult> ForwardRelBias(const Problem& p, const Tensor& q, const Tensor& k,
                                             const Tensor& v, const Tensor& rel_bias,
                                             const Tensor& sink) override {
    return inner_->ForwardRelBias(p, q, k, v, Offset(rel_bias), sink);
  }
  KernelAnswer<BackwardResult> BackwardRelBias(const Problem& p, const Tensor& q,
                                               const Tensor& k, const Tensor& v, const Tensor& o,
                                               const Tensor& lse, const Tensor& dout,
                                               const Tensor& rel_bias,
                                               const Tensor& sink) override {
    return inner_->BackwardRelBias(p, q, k, v, o, lse, dout, Offset(rel_bias), sink);
  }

 private:
  static Tensor Offset(const Tensor& t) {
    Tensor w = ToF64(t).Clone();
    for (double& x : w.span<double>()) x += 0x1p-12;
    return w;
  }
  std::unique_ptr<Kernel> inner_;
};

Suite GateRowsLabelled(const std::string& label) {
  const Suite* gate = FindSuite("gate");
  Suite s{gate->name, gate->description, {}};
  for (const SuiteRow& r : gate->rows) {
    if (r.case_template.label.rfind(label, 0) == 0 && r.check == "special-values") {
      s.rows.push_back(r);
    }
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

constexpr std::string_view kRelation = "a zero rel_bias table is bitwise the call without the bias";

int RelationVerdicts(const RunResult& r, bool failing) {
  int n = 0;
  for (const Verdict& v : r.report.verdicts) {
    if (v.check == "special-values" && v.policy == kRelation && v.pass != failing) ++n;
  }
  return n;
}

TEST(RelBiasChecks, ZeroTableRelationPassesTheModelAndFailsAnOffsetTable) {
  const Suite row = GateRowsLabelled("rel_bias GQA");
  auto model = Flash2();
  const RunResult good = RunRows(*model, row);
  EXPECT_TRUE(Failures(good).empty());
  EXPECT_EQ(RelationVerdicts(good, /*failing=*/false), 2);  // o and lse
  OffsetTable bad;
  EXPECT_EQ(RelationVerdicts(RunRows(bad, row), /*failing=*/true), 2);
}

TEST(RelBiasChecks, KernelsWithoutTheBiasSkipTheRows) {
  suite_test::Wrapper plain("test/no-rel-bias");
  const RunResult q = RunRows(plain, GateRowsLabelled("rel_bias "));
  EXPECT_TRUE(Failures(q).empty());
  EXPECT_TRUE(std::all_of(q.report.verdicts.begin(), q.report.verdicts.end(),
                          [](const Verdict& v) { return v.check == kCoverageCheck; }));
  EXPECT_FALSE(q.report.skipped.empty());
}

}  // namespace
}  // namespace attest
