// The checks end to end: the quick and gate suites run test-only broken kernels, defined
// here and in check_test_util.h, and each fails with the check that names its bug and the
// (b, h, i, d) where it is. Every broken kernel wraps the correct model (cpu/flash2-bf16), so
// the only difference is the seeded bug. The framework around the checks (suites, reports,
// kernel errors, the registry) is check_framework_test.cc.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/models/flash_models.h"
#include "reference/recipes/recipe.h"
#include "reference/formats/format.h"
#include "verify/checks/check.h"
#include "verify/checks/check_test_util.h"
#include "verify/report/report.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest {
namespace {

using suite_test::AnyFailure;
using suite_test::EditOutput;
using suite_test::Failures;
using suite_test::Flash2;
using suite_test::NanRow;
using suite_test::OffByOneElement;
using suite_test::OIndex;
using suite_test::RunQuick;
using suite_test::Wrapper;

// Every other call moves o[0] by a bf16 step (a race in a reduction, say).
class Flaky : public Wrapper {
 public:
  explicit Flaky(bool claims) : Wrapper("test/flaky"), claims_(claims) {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
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
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
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
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
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
  Capabilities capabilities() const override {
    Capabilities c = even_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
    return c;
  }
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
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
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
      c.sink = c.rel_bias = false;  // forwards the plain entry points only
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

}  // namespace
}  // namespace attest
