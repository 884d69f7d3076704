// The check framework around the checks: every suite row instantiates for the models and
// skips what a kernel does not claim, the quick suite passes the correct model (cpu/flash2-bf16)
// with the same report for the same seed, reports list verdicts in diagnosis order, a kernel
// error is one verdict naming it, failing cases are saved and reproduce, and the registry and
// the capabilities the checks read. The checks on broken kernels are check_test.cc.
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "verify/checks/check.h"
#include "verify/checks/check_test_util.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

using suite_test::Failures;
using suite_test::Flash2;
using suite_test::NanRow;
using suite_test::OffByOneElement;
using suite_test::RunQuick;
using suite_test::Wrapper;

// A device error in every backward of a varlen problem (a CUDA adapter's illegal address):
// an Error answer, not outputs. With `throws`, the backward throws instead.
class FailingBackward : public Wrapper {
 public:
  explicit FailingBackward(bool throws = false)
      : Wrapper("test/failing-backward"), throws_(throws) {}
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    if (!p.varlen()) return Wrapper::Backward(p, q, k, v, o, lse, dout);
    if (throws_) throw std::runtime_error("std::bad_alloc in the backward's workspace");
    return Error{"test/failing-backward: backward: cudaErrorIllegalAddress: an illegal memory "
                 "access was encountered; stderr: launch dq kernel | sync failed"};
  }

 private:
  bool throws_;
};

TEST(Suites, EveryRowInstantiatesForTheModels) {
  for (const char* name : {"cpu/flash2-bf16", "cpu/flash2-fp16", "cpu/feather-fp16"}) {
    auto k = Kernels().Create(name);
    ASSERT_TRUE(k.ok());
    const Capabilities caps = (*k)->capabilities();
    for (const Suite& s : AllSuites()) {
      EXPECT_FALSE(s.rows.empty());
      for (const SuiteRow& row : s.rows) {
        EXPECT_NE(FindCheck(row.check), nullptr) << s.name << ": " << row.check;
        InstantiatedCase c = Instantiate(row, caps, 7);
        // A mask-form row asks an API that takes masks as tensors; the models take none.
        if (!row.case_template.problem.mask_form.empty()) {
          EXPECT_FALSE(c.c.has_value()) << name << " " << c.label;
          continue;
        }
        EXPECT_TRUE(c.c.has_value()) << name << " " << s.name << " " << c.label << ": "
                                     << c.skipped;
      }
    }
  }
}

TEST(Suites, RowsOutsideTheCapabilitiesAreSkippedExceptHonesty) {
  Capabilities caps;
  caps.dtypes = {DType::kF16};
  caps.head_dims = {128};
  caps.backward = true;  // no masks, no GQA, no varlen, no softcap
  int skipped = 0, honesty = 0;
  for (const SuiteRow& row : FindSuite("gate")->rows) {
    InstantiatedCase c = Instantiate(row, caps, 0);
    if (row.check == "honesty") {
      ++honesty;
      EXPECT_TRUE(c.c.has_value()) << c.label;
      continue;
    }
    if (!c.c) {
      ++skipped;
      EXPECT_NE(c.skipped.find("does not claim"), std::string::npos) << c.skipped;
    } else {
      EXPECT_EQ(c.c->problem.dtype, DType::kF16);
      EXPECT_EQ(c.c->problem.head_dim, 128);
    }
  }
  EXPECT_GT(skipped, 10);
  EXPECT_GT(honesty, 5);
}

TEST(Run, QuickSuitePassesTheCorrectModel) {
  auto k = Flash2();
  RunResult r = RunQuick(*k);
  EXPECT_TRUE(r.report.passed()) << ToConsole(r.report);
  EXPECT_TRUE(r.report.skipped.empty());
  // Every check of the registry that the quick suite names produced verdicts.
  for (const char* check : {"accuracy", "unwritten-outputs", "special-values", "determinism",
                            "honesty", "gqa-mha", "permutation", "window-causal"}) {
    bool seen = false;
    for (const Verdict& v : r.report.verdicts) seen = seen || v.check == check;
    EXPECT_TRUE(seen) << check;
  }
}

TEST(Run, SameSeedSameReportOtherSeedOtherCases) {
  auto k = Flash2();
  // (The whole suite's report is compared byte for byte by check_cli_test.)
  const std::string a = ToJson(RunQuick(*k, "quick", 5, "accuracy").report).dump();
  const std::string b = ToJson(RunQuick(*k, "quick", 5, "accuracy").report).dump();
  const std::string c = ToJson(RunQuick(*k, "quick", 6, "accuracy").report).dump();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Run, ReportsListVerdictsInDiagnosisOrder) {
  NanRow k;
  RunResult r = RunQuick(k);
  size_t last = 0;
  for (const Verdict& v : r.report.verdicts) {
    const size_t rank = DiagnosisRank(v.check, v.tensor);
    EXPECT_GE(rank, last) << v.check << "/" << v.tensor;
    last = rank;
  }
  const nlohmann::json j = ToJson(r.report);
  EXPECT_EQ(j["first_failure"]["check"], "unwritten-outputs");
  EXPECT_NE(VerdictLine(r.report).find("; diagnosis: unwritten-outputs o"), std::string::npos)
      << VerdictLine(r.report);
}

TEST(Run, AKernelErrorIsOneVerdictPerCaseNamingTheError) {
  FailingBackward k;
  RunResult r = RunQuick(k);
  // The quick suite's one varlen case: every check that runs a backward on it meets the error,
  // and the report holds it once, first (the diagnosis), with the error's line.
  std::vector<const Verdict*> errors;
  for (const Verdict& v : r.report.verdicts) {
    if (v.check == kKernelErrorCheck) errors.push_back(&v);
    if (!v.pass) {
      EXPECT_EQ(v.check, kKernelErrorCheck) << "a kernel error became a numerical verdict: "
                                            << v.check << " " << v.message;
    }
  }
  ASSERT_EQ(errors.size(), 1u) << ToConsole(r.report);
  const Verdict& e = *errors[0];
  EXPECT_EQ(&r.report.verdicts.front(), &e);
  EXPECT_EQ(FirstFailure(r.report), &e);
  EXPECT_TRUE(std::isinf(e.margin));
  EXPECT_NE(e.message.find("backward: cudaErrorIllegalAddress: an illegal memory access"),
            std::string::npos)
      << e.message;
  EXPECT_EQ(e.message.find("test/failing-backward:"), std::string::npos) << e.message;
  // Of the stderr tail, the last line alone (a Python traceback's exception line).
  EXPECT_NE(e.message.find("; last stderr line: sync failed"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("launch dq kernel"), std::string::npos) << "stderr in the message";
  EXPECT_NE(e.detail.find("launch dq kernel\nsync failed"), std::string::npos) << e.detail;
  EXPECT_NE(e.detail.find("the checks that met it: accuracy, "), std::string::npos) << e.detail;
  ASSERT_TRUE(e.case_.has_value());
  EXPECT_TRUE(e.case_->problem.varlen());
  // The forward of that case was judged, and no row of it is listed as skipped (the only
  // skipped rows are the learnable-sink ones, which the wrapper does not claim).
  bool forward_judged = false;
  for (const Verdict& v : r.report.verdicts) {
    forward_judged = forward_judged || (v.check == "accuracy" && v.tensor == "o" &&
                                        v.case_ && v.case_->problem.varlen() && v.pass);
  }
  EXPECT_TRUE(forward_judged);
  for (const SkippedRow& s : r.report.skipped) {
    EXPECT_NE(s.label.find(" sink"), std::string::npos) << s.label << ": " << s.reason;
  }
  // A throwing kernel is the same class.
  FailingBackward t(/*throws=*/true);
  RunResult rt = RunQuick(t);
  const Verdict* f = FirstFailure(rt.report);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->check, kKernelErrorCheck);
  EXPECT_NE(f->message.find("std::bad_alloc in the backward's workspace"), std::string::npos)
      << f->message;
  EXPECT_EQ(rt.report.failures(), 1) << ToConsole(rt.report);
}

TEST(Run, ErrorSummaryKeepsTheLineThatSaysWhatWentWrong) {
  // A relayed exception: its line, without the kernel's name and the stderr tail.
  EXPECT_EQ(ErrorSummary("exec:w", "exec:w: forward: worker reported an error: TypeError: f() "
                                   "got an unexpected keyword argument 'x'; stderr: Traceback "
                                   "(most recent call last): | TypeError: f() got ..."),
            "forward: worker reported an error: TypeError: f() got an unexpected keyword "
            "argument 'x'");
  // A worker that died: the last stderr line (a Python traceback's exception line) added.
  EXPECT_EQ(ErrorSummary("exec:w", "exec:w: forward: worker exited with code 1 before "
                                   "replying; stderr: Traceback (most recent call last): |   "
                                   "File \"w.py\", line 3 | ValueError: bad shape"),
            "forward: worker exited with code 1 before replying; last stderr line: "
            "ValueError: bad shape");
  EXPECT_EQ(ErrorSummary("k", "forward: forward: k: timed out"), "forward: timed out");
  EXPECT_EQ(ErrorSummary("k", "line one\nline two"), "line one");
}

TEST(Run, FailingCasesAreSavedAndReproduceTheSameVerdict) {
  OffByOneElement k;
  const auto dir = std::filesystem::temp_directory_path() / "attest_check_test_failures";
  std::filesystem::remove_all(dir);
  RunOptions o;
  o.kernel_spec = "test/off-by-one-element";
  o.failure_dir = dir;
  o.only_check = "accuracy";
  auto r = RunSuite(k, *FindSuite("quick"), o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->failure_cases.size(), 1u);
  const Verdict failed = Failures(*r)[0];
  EXPECT_NE(failed.repro.find("attest repro --kernel test/off-by-one-element --case "),
            std::string::npos);
  EXPECT_NE(failed.repro.find("--check accuracy"), std::string::npos);

  auto c = LoadCase(r->failure_cases[0]);
  ASSERT_TRUE(c.ok());
  const CheckInfo* check = FindCheck("accuracy");
  auto again = RunCase(k, *c, std::span<const CheckInfo* const>(&check, 1), o, "saved");
  ASSERT_TRUE(again.ok());
  const auto fails = Failures(*again);
  ASSERT_EQ(fails.size(), 1u);
  EXPECT_EQ(fails[0].tensor, failed.tensor);
  EXPECT_EQ(fails[0].observed, failed.observed);
  EXPECT_EQ(fails[0].allowed, failed.allowed);
  EXPECT_EQ(fails[0].worst.Coordinates(), failed.worst.Coordinates());
  std::filesystem::remove_all(dir);
}

TEST(Checks, RegistryIsOrderedAndNamed) {
  ASSERT_FALSE(AllChecks().empty());
  EXPECT_EQ(AllChecks()[0].name, "unwritten-outputs");
  for (const CheckInfo& c : AllChecks()) {
    EXPECT_EQ(FindCheck(c.name), &c);
    EXPECT_FALSE(c.description.empty());
  }
  EXPECT_EQ(FindCheck("no-such-check"), nullptr);
  // Every check has a diagnosis step, every step names a check, and the registry lists the
  // checks in the order of their first step.
  size_t last = 0;
  for (const CheckInfo& c : AllChecks()) {
    size_t rank = DiagnosisOrder().size();
    for (size_t i = 0; i < DiagnosisOrder().size() && rank == DiagnosisOrder().size(); ++i) {
      if (DiagnosisOrder()[i].check == c.name) rank = i;
    }
    EXPECT_LT(rank, DiagnosisOrder().size()) << c.name;
    EXPECT_GE(rank, last) << c.name;
    last = rank;
  }
  for (const DiagnosisStep& s : DiagnosisOrder()) {
    if (s.check == kKernelErrorCheck || s.check == kCoverageCheck) continue;
    EXPECT_NE(FindCheck(s.check), nullptr) << s.check;
  }
  // A kernel error explains everything else; coverage explains nothing about the kernel.
  EXPECT_EQ(DiagnosisOrder().front().check, kKernelErrorCheck);
  EXPECT_EQ(DiagnosisOrder().back().check, kCoverageCheck);
  // Accuracy of the forward comes before consistency, of the gradients after.
  EXPECT_LT(DiagnosisRank("accuracy", "o"), DiagnosisRank("consistency", "dq"));
  EXPECT_GT(DiagnosisRank("accuracy", "dq"), DiagnosisRank("consistency", "dq"));
}

TEST(Checks, EmptyRowLseIsMinusInfUnlessPlusInfIsDeclared) {
  Capabilities c;
  EXPECT_EQ(EmptyRowLse(c), -std::numeric_limits<double>::infinity());
  c.empty_row_lse = "+inf";
  EXPECT_EQ(EmptyRowLse(c), std::numeric_limits<double>::infinity());
  auto round = CapabilitiesFromJson(CapabilitiesToJson(c));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->empty_row_lse, "+inf");
  nlohmann::json j = CapabilitiesToJson(Capabilities{});
  EXPECT_FALSE(j.contains("empty_row_lse"));  // the default is not written
  j["empty_row_lse"] = "nan";
  EXPECT_FALSE(CapabilitiesFromJson(j).ok());
}

TEST(Checks, SoftcapTanhErrorRoundTripsAndIsValidated) {
  Capabilities c;
  EXPECT_FALSE(CapabilitiesToJson(c).contains("softcap_tanh_abs_error"));  // 0 is not written
  c.softcap_tanh_abs_error = 7.984215021017427e-06;
  auto round = CapabilitiesFromJson(CapabilitiesToJson(c));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->softcap_tanh_abs_error, c.softcap_tanh_abs_error);
  for (const nlohmann::json& bad : {nlohmann::json(-1e-6), nlohmann::json(0.5), nlohmann::json("8e-6")}) {
    nlohmann::json j = CapabilitiesToJson(Capabilities{});
    j["softcap_tanh_abs_error"] = bad;
    auto r = CapabilitiesFromJson(j);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("capabilities.softcap_tanh_abs_error"), std::string::npos);
  }
}

TEST(Checks, AContextPassesTheCaseSinkToTheOracleAndTheKernelsSinkEntryPoints) {
  // check.h CheckContext: a case with a learnable sink gives the oracle the case's sink
  // (OracleOptions::sink) and the kernel its ForwardSink / BackwardSink; a kernel whose
  // plain calls would run it without the sink never gets the case.
  Case c;
  c.problem.batch = 2;
  c.problem.heads_q = 4;
  c.problem.heads_kv = 2;
  c.problem.seqlen_q = 40;
  c.problem.seqlen_k = 30;
  c.problem.head_dim = c.problem.head_dim_v = 64;
  c.problem.causal = true;  // Sq > Sk: empty rows, whose lse is the sink
  c.problem.sink = true;
  c.generator = GeneratorSpec{"gaussian", 5, {{"sink", {{"values", {1.5, "-inf", 30, -1}}}}}};
  auto in = MakeCaseInputs(c);
  ASSERT_TRUE(in.ok()) << in.error().message;
  std::unique_ptr<Kernel> kernel = Flash2();
  CheckContext ctx;
  ctx.kernel = kernel.get();
  ctx.case_ = c;
  ctx.inputs = *in;
  const BackwardOut& ref = ctx.OracleBackward();
  ASSERT_TRUE(ref.dsink.defined());
  EXPECT_EQ(ref.lse.data<double>()[0], 1.5);  // head 0, row 0: empty, lse = the sink
  ASSERT_TRUE(ctx.WantsBackward());
  const auto* f = std::get_if<ForwardResult>(&ctx.KernelForward());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(ToF64(f->lse).data<double>()[0], 1.5);
  const auto* b = std::get_if<BackwardResult>(&ctx.KernelBackward());
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->dsink.defined());
  EXPECT_EQ(ToF64(b->dsink).data<double>()[1], 0.0);  // the -inf sink
  EXPECT_LT(std::abs(ToF64(b->dsink).data<double>()[0] - ref.dsink.data<double>()[0]),
            0.05 * std::abs(ref.dsink.data<double>()[0]));
  EXPECT_TRUE(std::holds_alternative<Unsupported>(
      kernel->Forward(c.problem, ctx.inputs.q, ctx.inputs.k, ctx.inputs.v)));
}

}  // namespace
}  // namespace attest
