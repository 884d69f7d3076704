// The check framework end to end: the quick suite passes a
// correct model (cpu/flash2-bf16), and test-only broken kernels defined here fail with the
// check that names their bug and the (b, h, i, d) where it is. Every broken kernel wraps the
// correct model, so the only difference is the seeded bug.
#include <cmath>
#include <limits>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "kernels/models/flash_models.h"
#include "reference/recipes/recipe.h"
#include "reference/formats/format.h"
#include "verify/checks/check.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

std::unique_ptr<Kernel> Flash2() {
  auto k = Kernels().Create("cpu/flash2-bf16");
  EXPECT_TRUE(k.ok());
  return std::move(k).value();
}

// f64 copy of a kernel output, modified by `edit(values, problem)`, stored back as bf16
// (or left f64 when `keep_f64`: HeadMixer's leak is not rounded to bf16).
template <class Edit>
Tensor EditOutput(const Tensor& t, Edit&& edit, bool keep_f64 = false) {
  Tensor w = ToF64(t).Clone();
  edit(w.span<double>());
  if (keep_f64) return w;
  auto back = FromF64(w, t.dtype());
  EXPECT_TRUE(back.ok());
  return std::move(back).value();
}

// o [B, Sq, H, Dv] flat index.
int64_t OIndex(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t d) {
  return ((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim_v + d;
}

// A wrapper whose forward output can be edited; everything else is the correct model.
class Wrapper : public Kernel {
 public:
  explicit Wrapper(std::string name) : name_(std::move(name)), inner_(Flash2()) {}
  std::string name() const override { return name_; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto a = inner_->Forward(p, q, k, v);
    if (auto* r = std::get_if<ForwardResult>(&a)) Edit(p, *r);
    return a;
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }
  virtual void Edit(const Problem&, ForwardResult&) {}

 protected:
  std::string name_;
  std::unique_ptr<Kernel> inner_;
};

// Adds 0.1 to o at (b=1, h=3, i=5, d=7) of padded problems with B >= 2 and Hq >= 4.
class OffByOneElement : public Wrapper {
 public:
  OffByOneElement() : Wrapper("test/off-by-one-element") {}
  void Edit(const Problem& p, ForwardResult& r) override {
    if (p.varlen() || p.batch < 2 || p.heads_q < 4 || p.seqlen_q < 6) return;
    r.o = EditOutput(r.o, [&](std::span<double> o) { o[OIndex(p, 1, 3, 5, 7)] += 0.1; });
  }
};

// Leaves row (b=0, h=1, i=3) of o as the harness poisoned it (all-ones bytes,
// kOutputPoisonByte): a row the kernel never wrote. With `computed`, the row holds the NaN
// that arithmetic gives instead (0 * inf), which is a wrong value, not an unwritten one.
class NanRow : public Wrapper {
 public:
  explicit NanRow(bool computed = false) : Wrapper("test/nan-row"), computed_(computed) {}
  void Edit(const Problem& p, ForwardResult& r) override {
    if (p.varlen() || p.heads_q < 2 || p.seqlen_q < 4) return;
    r.o = EditOutput(r.o, [&](std::span<double> o) {
      for (int64_t d = 0; d < p.head_dim_v; ++d) o[OIndex(p, 0, 1, 3, d)] = 0.0;
    });
    ASSERT_EQ(r.o.dtype(), DType::kBF16);
    uint16_t* codes = r.o.data<uint16_t>();
    const double inf = std::numeric_limits<double>::infinity();
    const Tensor computed_nan = *FromF64(Tensor::FromF64({1}, {0.0 * inf}), DType::kBF16);
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      codes[OIndex(p, 0, 1, 3, d)] = computed_ ? computed_nan.data<uint16_t>()[0] : 0xFFFF;
    }
  }

 private:
  bool computed_;
};

// Every other call moves o[0] by a bf16 step (a race in a reduction, say).
class Flaky : public Wrapper {
 public:
  explicit Flaky(bool claims) : Wrapper("test/flaky"), claims_(claims) {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.deterministic = claims_;
    return c;
  }
  void Edit(const Problem&, ForwardResult& r) override {
    if (++calls_ % 2 == 0) {
      // At least one bf16 step (8 significant bits: relative spacing 2^-7 to 2^-8).
      r.o = EditOutput(r.o, [](std::span<double> o) { o[0] += std::fabs(o[0]) * 0x1p-7; });
    }
  }

 private:
  bool claims_;
  int calls_ = 0;
};

// Leaks 6e-3 of the next head's output into each head: about 1.5 bf16 ULPs of the row, below
// the accuracy tolerance (2x the baseline + 2 ULPs), but a difference of up to twice that
// between a head and its permuted copy, over the relation's 2 ULPs. ULPs are counted in the
// kernel's declared bf16 (metamorphic.cc UlpFormat), so o returned in f64 earns no finer
// floor than in bf16; it is returned in f64 so that the leak is not rounded away.
class HeadMixer : public Wrapper {
 public:
  // `inner`: the kernel whose output leaks (default cpu/flash2-bf16).
  explicit HeadMixer(std::unique_ptr<Kernel> inner = nullptr) : Wrapper("test/head-mixer") {
    if (inner) inner_ = std::move(inner);
  }
  void Edit(const Problem& p, ForwardResult& r) override {
    if (p.varlen()) return;
    const Tensor base = ToF64(r.o);
    const auto src = base.span<const double>();
    r.o = EditOutput(
        r.o,
        [&](std::span<double> o) {
          for (int64_t b = 0; b < p.batch; ++b)
            for (int64_t i = 0; i < p.seqlen_q; ++i)
              for (int64_t h = 0; h < p.heads_q; ++h)
                for (int64_t d = 0; d < p.head_dim_v; ++d) {
                  o[OIndex(p, b, h, i, d)] += 6e-3 * src[OIndex(p, b, (h + 1) % p.heads_q, i, d)];
                }
        },
        /*keep_f64=*/true);
  }
};

// Moves o of packed sequence b by b * 1e-4 of itself (a per-sequence bias far below the
// accuracy tolerance that depends on where the sequence sits in the batch), in f64. With
// `by_count`, moves every row by 1e-4 * (number of sequences) instead.
class SequenceBias : public Wrapper {
 public:
  explicit SequenceBias(bool by_count) : Wrapper("test/sequence-bias"), by_count_(by_count) {}
  void Edit(const Problem& p, ForwardResult& r) override {
    if (!p.varlen()) return;
    r.o = EditOutput(
        r.o,
        [&](std::span<double> o) {
          const int64_t row = p.heads_q * p.head_dim_v;
          for (int64_t b = 0; b < p.batch; ++b) {
            const Sequence s = SequenceOf(p, b);
            const double f = 1 + 1e-4 * static_cast<double>(by_count_ ? p.batch : b);
            for (int64_t e = s.q_begin * row; e < (s.q_begin + s.q_len) * row; ++e) o[e] *= f;
          }
        },
        /*keep_f64=*/true);
  }

 private:
  bool by_count_;
};

// Writes lse = +inf for empty rows (FlashAttention's convention), declaring it or not.
class PlusInfLse : public Wrapper {
 public:
  explicit PlusInfLse(bool declares) : Wrapper("test/plus-inf-lse"), declares_(declares) {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    if (declares_) c.empty_row_lse = "+inf";
    return c;
  }
  void Edit(const Problem&, ForwardResult& r) override {
    r.lse = EditOutput(r.lse, [](std::span<double> l) {
      for (double& x : l) {
        if (std::isinf(x) && x < 0) x = std::numeric_limits<double>::infinity();
      }
    });
  }

 private:
  bool declares_;
};

// Softcap through an approximate tanh: every finite lse of a softcap problem moved by
// `shift` x softcap x the tanh error `error` (the largest a score error of softcap x error can
// move lse), declaring that error or not.
class ApproxTanh : public Wrapper {
 public:
  ApproxTanh(double error, double shift, bool declares)
      : Wrapper("test/approx-tanh"), error_(error), shift_(shift), declares_(declares) {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    if (declares_) c.softcap_tanh_abs_error = error_;
    return c;
  }
  void Edit(const Problem& p, ForwardResult& r) override {
    if (p.softcap <= 0) return;
    r.lse = EditOutput(r.lse, [&](std::span<double> l) {
      for (double& x : l) {
        if (std::isfinite(x)) x += shift_ * p.softcap * error_;
      }
    });
  }

 private:
  double error_, shift_;
  bool declares_;
};

// fp32 throughout: fp32 inputs, no rounding point, fp32 outputs. Only the tests build it; its
// name is the f32 tolerance profile's.
const Recipe& F32Recipe() {
  static const Recipe r = [] {
    Recipe x;
    x.name = "f32";
    x.description = "fp32 inputs, accumulation and outputs (tests)";
    x.input_dtypes = {DType::kF32};
    return x;
  }();
  return r;
}

// A correct FlashAttention-2 bf16 model whose key tile follows the key count (block_n 32 for
// an even Sk, 48 for an odd one, forward and backward): padding by 9 keys retiles every real
// row, so lse moves by fp32 ulps and P, dS round the other way here and there -- what the
// H200's flex-triton did under padding.
// With F32Recipe() and f32, the same for an fp32 kernel: its sums end in another order, and
// the fp32 output shows it (what PyTorch's CPU flash attention in f32 does when padding or a
// GQA call reaches its BLAS with other shapes).
class Retiled : public Kernel {
 public:
  explicit Retiled(const Recipe& recipe = *FindRecipe("bf16"), DType dtype = DType::kBF16) {
    EngineOptions even, odd;
    even.fwd_block_n = even.bwd_block_n = 32;
    odd.fwd_block_n = odd.bwd_block_n = 48;
    even_ = std::make_unique<Flash2Model>("test/retiled", recipe, dtype, even);
    odd_ = std::make_unique<Flash2Model>("test/retiled", recipe, dtype, odd);
  }
  std::string name() const override { return "test/retiled"; }
  Capabilities capabilities() const override { return even_->capabilities(); }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return Pick(p).Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return Pick(p).Backward(p, q, k, v, o, lse, dout);
  }

 private:
  Flash2Model& Pick(const Problem& p) { return p.seqlen_k % 2 == 0 ? *even_ : *odd_; }
  std::unique_ptr<Flash2Model> even_, odd_;
};

// Claims softcap but refuses it.
class Refuser : public Wrapper {
 public:
  Refuser() : Wrapper("test/refuser") {}
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    if (p.softcap > 0) return Unsupported{"softcap not implemented"};
    return Wrapper::Forward(p, q, k, v);
  }
};

// Does not claim softcap, answers anyway, and ignores the cap.
class Liar : public Wrapper {
 public:
  Liar() : Wrapper("test/liar") {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.softcap = false;
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    Problem no_cap = p;
    no_cap.softcap = 0;
    return inner_->Forward(no_cap, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    Problem no_cap = p;
    no_cap.softcap = 0;
    return inner_->Backward(no_cap, q, k, v, o, lse, dout);
  }
};

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

RunResult RunQuick(Kernel& kernel, const std::string& suite = "quick", uint64_t seed = 0,
              const std::string& only = "") {
  RunOptions o;
  o.kernel_spec = kernel.name();
  o.seed = seed;
  o.only_check = only;
  auto r = RunSuite(kernel, *FindSuite(suite), o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return std::move(r).value();
}

std::vector<Verdict> Failures(const RunResult& r) {
  std::vector<Verdict> out;
  for (const Verdict& v : r.report.verdicts) {
    if (!v.pass) out.push_back(v);
  }
  return out;
}

bool AnyFailure(const RunResult& r, std::string_view check, std::string_view tensor) {
  for (const Verdict& v : r.report.verdicts) {
    if (!v.pass && v.check == check && v.tensor == tensor) return true;
  }
  return false;
}

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

TEST(Run, OffByOneElementFailsAccuracyAtItsLocation) {
  OffByOneElement k;
  RunResult r = RunQuick(k, "quick", 0, "accuracy");
  ASSERT_FALSE(r.report.passed());
  const auto fails = Failures(r);
  ASSERT_EQ(fails.size(), 1u) << ToConsole(r.report);
  const Verdict& v = fails[0];
  EXPECT_EQ(v.check, "accuracy");
  EXPECT_EQ(v.tensor, "o");
  EXPECT_EQ(v.worst.b, 1);
  EXPECT_EQ(v.worst.h, 3);
  EXPECT_EQ(v.worst.i, 5);
  EXPECT_EQ(v.worst.d, 7);
  EXPECT_GT(v.margin, 1);
  EXPECT_TRUE(std::isfinite(v.margin));
  EXPECT_NE(v.message.find("(b=1, h=3, i=5, d=7)"), std::string::npos) << v.message;
}

TEST(Run, NanRowFailsUnwrittenOutputsAndAccuracyAtTheRow) {
  NanRow k;
  RunResult acc = RunQuick(k, "quick", 0, "accuracy");
  EXPECT_TRUE(AnyFailure(acc, "accuracy", "o"));
  // Nothing else about the kernel's forward is wrong: lse passes.
  EXPECT_FALSE(AnyFailure(acc, "accuracy", "lse"));
  RunResult r = RunQuick(k, "quick", 0, "unwritten-outputs");
  bool found = false;
  // (The backward consumes the poisoned o, but its NaNs are computed ones: only o is
  // unwritten.)
  for (const Verdict& v : Failures(r)) {
    EXPECT_EQ(v.tensor, "o") << v.message;
    if (v.check != "unwritten-outputs" || v.tensor != "o") continue;
    found = true;
    EXPECT_EQ(v.worst.b, 0);
    EXPECT_EQ(v.worst.h, 1);
    EXPECT_EQ(v.worst.i, 3);
    EXPECT_EQ(v.worst.d, 0);
    EXPECT_EQ(v.observed, 64);  // one row of Dv = 64
    EXPECT_NE(v.message.find("poison"), std::string::npos);
  }
  EXPECT_TRUE(found) << ToConsole(r.report);
  // The whole quick suite names the unwritten row first.
  RunResult all = RunQuick(k);
  ASSERT_NE(FirstFailure(all.report), nullptr);
  EXPECT_EQ(FirstFailure(all.report)->check, "unwritten-outputs");
}

TEST(Run, AComputedNanIsAWrongValueNotAnUnwrittenOne) {
  NanRow k(/*computed=*/true);
  RunResult r = RunQuick(k, "quick", 0, "unwritten-outputs");
  EXPECT_TRUE(r.report.passed()) << ToConsole(r.report);
  RunResult acc = RunQuick(k, "quick", 0, "accuracy");
  EXPECT_TRUE(AnyFailure(acc, "accuracy", "o"));
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
  // The forward of that case was judged, and no row of it is listed as skipped.
  bool forward_judged = false;
  for (const Verdict& v : r.report.verdicts) {
    forward_judged = forward_judged || (v.check == "accuracy" && v.tensor == "o" &&
                                        v.case_ && v.case_->problem.varlen() && v.pass);
  }
  EXPECT_TRUE(forward_judged);
  EXPECT_TRUE(r.report.skipped.empty());
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

TEST(Run, NondeterminismFailsOnlyWhenClaimed) {
  Flaky claims(true), honest(false);
  RunResult a = RunQuick(claims, "quick", 0, "determinism");
  const auto fails = Failures(a);
  ASSERT_FALSE(fails.empty());
  EXPECT_EQ(fails[0].check, "determinism");
  EXPECT_EQ(fails[0].tensor, "o");
  EXPECT_EQ(fails[0].observed, 1);
  EXPECT_EQ(fails[0].worst.flat, 0);
  RunResult b = RunQuick(honest, "quick", 0, "determinism");
  EXPECT_TRUE(b.report.passed()) << ToConsole(b.report);
  bool noted = false;
  for (const Verdict& v : b.report.verdicts) {
    noted = noted || v.message.find("differs") != std::string::npos;
  }
  EXPECT_TRUE(noted);  // the variation is reported, not hidden
}

TEST(Run, PermutationCatchesAKernelThatMixesHeads) {
  HeadMixer k;
  RunResult acc = RunQuick(k, "quick", 0, "accuracy");
  EXPECT_FALSE(AnyFailure(acc, "accuracy", "o")) << "the leak is meant to be below tolerance";
  RunResult r = RunQuick(k, "quick", 0, "permutation");
  EXPECT_TRUE(AnyFailure(r, "permutation", "o")) << ToConsole(r.report);
}

TEST(Run, PermutationPermutesPackedSequences) {
  SequenceBias k(/*by_count=*/false);
  RunResult acc = RunQuick(k, "quick", 0, "accuracy");  // (its varlen row)
  EXPECT_FALSE(AnyFailure(acc, "accuracy", "o")) << "the bias is meant to be below tolerance";
  RunResult r = RunQuick(k, "gate", 0, "permutation");
  bool packed = false;
  for (const Verdict& v : Failures(r)) {
    packed = packed || v.message.find("packed sequences reversed") != std::string::npos;
  }
  EXPECT_TRUE(packed) << ToConsole(r.report);
}

TEST(Run, PaddingSequencesMustNotMoveRealTokens) {
  auto good = Flash2();
  RunResult ok = RunQuick(*good, "gate", 0, "padding");
  EXPECT_TRUE(ok.report.passed()) << ToConsole(ok.report);
  size_t packed = 0, padded = 0;
  for (const Verdict& v : ok.report.verdicts) {
    packed += v.message.find("padding sequences") != std::string::npos;
    padded += v.message.find("masked by document ids") != std::string::npos;
    EXPECT_EQ(v.margin, 0) << v.message;  // deterministic: bitwise (packed) or exact anyway
  }
  EXPECT_GT(packed, 0u);
  EXPECT_GT(padded, 0u);
  SequenceBias bad(/*by_count=*/true);
  RunResult r = RunQuick(bad, "gate", 0, "padding");
  EXPECT_TRUE(AnyFailure(r, "padding", "o")) << ToConsole(r.report);
}

TEST(Run, PlusInfLseOnEmptyRowsPassesOnlyWhenDeclared) {
  for (const char* check : {"special-values", "accuracy"}) {
    PlusInfLse declared(true), silent(false);
    RunResult a = RunQuick(declared, "quick", 0, check);
    EXPECT_TRUE(a.report.passed()) << ToConsole(a.report);
    RunResult b = RunQuick(silent, "quick", 0, check);
    EXPECT_TRUE(AnyFailure(b, check, "lse")) << check << "\n" << ToConsole(b.report);
  }
  // And a kernel that declares +inf but writes -inf breaks its own declaration.
  class Declares : public Wrapper {
   public:
    Declares() : Wrapper("test/declares-plus-inf") {}
    Capabilities capabilities() const override {
      Capabilities c = inner_->capabilities();
      c.empty_row_lse = "+inf";
      return c;
    }
  } liar;
  EXPECT_TRUE(AnyFailure(RunQuick(liar, "quick", 0, "special-values"), "special-values", "lse"));
}

// A declared tanh approximation widens lse's bound on softcap problems by softcap x its error,
// and by no more: tanh.approx.f32's measured 7.98e-6 (kernels/kernel.h).
TEST(Run, DeclaredTanhErrorWidensLseBySoftcapTimesTheError) {
  Case c;
  c.problem.batch = 1;
  c.problem.heads_q = c.problem.heads_kv = 2;
  c.problem.seqlen_q = 40;
  c.problem.seqlen_k = 5;
  c.problem.head_dim = c.problem.head_dim_v = 32;
  c.problem.dtype = DType::kBF16;
  c.problem.softcap = 2.5;
  c.generator = GeneratorSpec{"gaussian", 7, nlohmann::json::object()};
  const CheckInfo* check = FindCheck("accuracy");
  RunOptions o;
  auto lse_fails = [&](Kernel& k) {
    auto r = RunCase(k, c, std::span<const CheckInfo* const>(&check, 1), o, "softcap 2.5");
    EXPECT_TRUE(r.ok());
    return AnyFailure(*r, "accuracy", "lse");
  };
  constexpr double kError = 7.984215021017427e-06;
  ApproxTanh within(kError, 0.9, true), beyond(kError, 1.6, true), silent(kError, 0.9, false);
  EXPECT_FALSE(lse_fails(within));
  EXPECT_TRUE(lse_fails(beyond));
  EXPECT_TRUE(lse_fails(silent));
  // No softcap, no allowance: the same declaration admits nothing else.
  c.problem.softcap = 0;
  class Shifted : public ApproxTanh {
   public:
    Shifted() : ApproxTanh(kError, 0.9, true) {}
    void Edit(const Problem& p, ForwardResult& r) override {
      Problem capped = p;
      capped.softcap = 2.5;
      ApproxTanh::Edit(capped, r);
    }
  } shifted;
  EXPECT_TRUE(lse_fails(shifted));
}

// A kernel whose blocking follows the padding is judged by what each run may round, not by
// ulps of a possibly cancelled row; a padding leak still fails (SequenceBias, mutants).
TEST(Run, RetiledByPaddingPassesPadding) {
  Retiled k;
  RunResult r = RunQuick(k, "gate", 0, "padding");
  EXPECT_TRUE(r.report.passed()) << ToConsole(r.report);
  size_t judged = 0;
  for (const Verdict& v : r.report.verdicts) judged += v.check == "padding" && v.tensor == "dk";
  EXPECT_GT(judged, 0u);
}

// The H200's flex-triton (bf16) under padding, replayed on the correct model: on
// golden/findings/flex-triton-padding-gradient-rounding.case.json (constant rows: every exact
// dS is 0) the padded run returned dq[b0, i26, h4, d0] = -1.5553087e-7 where the unpadded one
// returned 0 -- fp32 noise of dP - D, which a retiled kernel computes in another order. The
// same noise 1000 times larger is no rounding and fails.
TEST(Run, PaddingAdmitsTheRetiledKernelsRoundingNotMore) {
  auto c = LoadCase("golden/findings/flex-triton-padding-gradient-rounding.case.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  class PaddedNoise : public Wrapper {
   public:
    explicit PaddedNoise(double noise) : Wrapper("test/padded-noise"), noise_(noise) {}
    KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& o, const Tensor& lse,
                                          const Tensor& dout) override {
      auto a = Wrapper::Backward(p, q, k, v, o, lse, dout);
      auto* r = std::get_if<BackwardResult>(&a);
      if (r != nullptr && p.document_ids_q) {  // the padded run (the case has no documents)
        const int64_t flat = ((0 * p.seqlen_q + 26) * p.heads_q + 4) * p.head_dim + 0;
        r->dq = EditOutput(r->dq, [&](std::span<double> d) { d[flat] += noise_; }, true);
      }
      return a;
    }

   private:
    double noise_;
  };
  const CheckInfo* check = FindCheck("padding");
  RunOptions o;
  auto dq_fails = [&](Kernel& k) {
    auto r = RunCase(k, *c, std::span<const CheckInfo* const>(&check, 1), o, "finding");
    EXPECT_TRUE(r.ok());
    size_t judged = 0;
    for (const Verdict& v : r->report.verdicts) judged += v.check == "padding" && v.tensor == "dq";
    EXPECT_EQ(judged, 1u);
    return AnyFailure(*r, "padding", "dq");
  };
  PaddedNoise observed(-1.5553087e-7), larger(-1.5553087e-4);
  EXPECT_FALSE(dq_fails(observed));
  EXPECT_TRUE(dq_fails(larger));
}

// An fp32 kernel whose sums end in another order when padding, a permutation, a window or
// the MHA counterpart changes its shapes: "2 fp32 ulps of the row" is below what reordering
// an fp32 sum moves, and SumOrderBound (relation_bounds.h) admits it. Every relation judges o
// and dv in f32 here; the same relations still catch a head leak of 6e-3 in f32.
TEST(Run, Fp32KernelSummingInAnotherOrderPassesTheRelations) {
  Retiled k(F32Recipe(), DType::kF32);
  for (const char* check : {"padding", "permutation", "gqa-mha", "window-causal"}) {
    RunResult r = RunQuick(k, "gate", 0, check);
    EXPECT_TRUE(r.report.passed()) << check << "\n" << ToConsole(r.report);
    size_t judged = 0;
    for (const Verdict& v : r.report.verdicts) judged += v.tensor == "o" || v.tensor == "dv";
    EXPECT_GT(judged, 0u) << check;
  }
  HeadMixer leak(std::make_unique<Flash2Model>("test/f32", F32Recipe(), DType::kF32));
  RunResult r = RunQuick(leak, "gate", 0, "permutation");
  EXPECT_TRUE(AnyFailure(r, "permutation", "o")) << ToConsole(r.report);
}

TEST(Run, RefusingAClaimedFeatureAndAnsweringWronglyOutsideFailHonesty) {
  Refuser refuser;
  RunResult a = RunQuick(refuser, "quick", 0, "honesty");
  ASSERT_EQ(Failures(a).size(), 1u) << ToConsole(a.report);
  EXPECT_EQ(Failures(a)[0].check, "honesty");
  EXPECT_NE(Failures(a)[0].message.find("Unsupported"), std::string::npos);

  Liar liar;
  RunResult b = RunQuick(liar, "quick", 0, "honesty");
  EXPECT_TRUE(AnyFailure(b, "honesty", "o")) << ToConsole(b.report);
  EXPECT_NE(Failures(b)[0].message.find("outside its capabilities"), std::string::npos);
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

}  // namespace
}  // namespace attest
