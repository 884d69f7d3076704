// The check framework end to end (issue "verify/" items 3-5): the quick suite passes a
// correct model (cpu/flash2-bf16), and test-only broken kernels defined here fail with the
// check that names their bug and the (b, h, i, d) where it is. Every broken kernel wraps the
// correct model, so the only difference is the seeded bug.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/formats/format.h"
#include "verify/checks/check.h"
#include "verify/report.h"
#include "verify/run.h"
#include "verify/suite.h"

namespace attest {
namespace {

std::unique_ptr<Kernel> Flash2() {
  auto k = Kernels().Create("cpu/flash2-bf16");
  EXPECT_TRUE(k.ok());
  return std::move(k).value();
}

// f64 copy of a kernel output, modified by `edit(values, problem)`, stored back as bf16
// (or left f64 when `keep_f64`: the leak of HeadMixer is below bf16 resolution).
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

// Writes NaN over row (b=0, h=1, i=3) of o, as an unwritten (NaN-poisoned) buffer would be.
class NanRow : public Wrapper {
 public:
  NanRow() : Wrapper("test/nan-row") {}
  void Edit(const Problem& p, ForwardResult& r) override {
    if (p.varlen() || p.heads_q < 2 || p.seqlen_q < 4) return;
    r.o = EditOutput(r.o, [&](std::span<double> o) {
      for (int64_t d = 0; d < p.head_dim_v; ++d) o[OIndex(p, 0, 1, 3, d)] = std::nan("");
    });
  }
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

// Leaks 1e-4 of the next head's output into each head: far below the accuracy tolerance, a
// plain bug for the permutation relation. o is returned in f64 to keep the leak visible.
class HeadMixer : public Wrapper {
 public:
  HeadMixer() : Wrapper("test/head-mixer") {}
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
                  o[OIndex(p, b, h, i, d)] += 1e-4 * src[OIndex(p, b, (h + 1) % p.heads_q, i, d)];
                }
        },
        /*keep_f64=*/true);
  }
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
  EXPECT_TRUE(r.skipped.empty());
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
  // (The backward consumes the poisoned o, so dq, dk, dv fail too; o is where it starts.)
  for (const Verdict& v : Failures(r)) {
    if (v.check != "unwritten-outputs" || v.tensor != "o") continue;
    found = true;
    EXPECT_EQ(v.tensor, "o");
    EXPECT_EQ(v.worst.b, 0);
    EXPECT_EQ(v.worst.h, 1);
    EXPECT_EQ(v.worst.i, 3);
    EXPECT_EQ(v.worst.d, 0);
    EXPECT_EQ(v.observed, 64);  // one row of Dv = 64
    EXPECT_NE(v.message.find("NaN"), std::string::npos);
  }
  EXPECT_TRUE(found) << ToConsole(r.report);
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
  EXPECT_EQ(AllChecks()[0].name, "accuracy");
  for (const CheckInfo& c : AllChecks()) {
    EXPECT_EQ(FindCheck(c.name), &c);
    EXPECT_FALSE(c.description.empty());
  }
  EXPECT_EQ(FindCheck("no-such-check"), nullptr);
}

}  // namespace
}  // namespace attest
