// The fuzz engine (fuzz.h): the same seed writes identical case files; shards are disjoint
// and together run exactly the cases of one unsharded run; merged shard reports add up; the
// written case reproduces its verdict through RunCase (the code of `attest repro`).
#include "run/fuzz.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <set>
#include <sstream>

#include "kernels/builtin.h"
#include "reference/case/case_file.h"
#include "run/suite.h"

namespace attest {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  // The pid keeps concurrent runs (several build trees on one machine) apart.
  const fs::path d =
      fs::temp_directory_path() / ("attest_fuzz_test_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> CaseFiles(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().string().ends_with(".case.json")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A mutant the generators kill fast: causal aligned top-left where bottom-right is meant,
// searched against its parent (differential mode), so that only its own bug counts.
FuzzOptions MutantRun(const fs::path& out, Kernel* parent) {
  FuzzOptions o;
  o.kernel_spec = "mutant/causal-top-left";
  o.baseline = parent;
  o.baseline_spec = "cpu/flash2-bf16";
  o.seed = 3;
  o.cases = 200;
  o.checks = {"accuracy"};
  o.out_dir = out;
  return o;
}

TEST(Fuzz, TheSameSeedWritesIdenticalCaseFiles) {
  auto k1 = Kernels().Create("mutant/causal-top-left");
  auto k2 = Kernels().Create("mutant/causal-top-left");
  ASSERT_TRUE(k1.ok() && k2.ok());
  const fs::path a = TempDir("same_a"), b = TempDir("same_b");
  auto parent = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(parent.ok());
  auto ra = RunFuzz(**k1, MutantRun(a, parent->get()));
  auto rb = RunFuzz(**k2, MutantRun(b, parent->get()));
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(ra->failures.size(), 1u);
  const auto fa = CaseFiles(a), fb = CaseFiles(b);
  ASSERT_EQ(fa.size(), 1u);
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_EQ(fa[0].filename(), fb[0].filename());
  EXPECT_EQ(Slurp(fa[0]), Slurp(fb[0]));
  EXPECT_TRUE(fa[0].filename().string().starts_with("accuracy-"));
  // Reports agree except for the directory inside the repro line.
  auto without_repro = [](nlohmann::json j) {
    for (auto& f : j["failures"]) f.erase("repro");
    return j;
  };
  EXPECT_EQ(without_repro(ra->ToJson(false)), without_repro(rb->ToJson(false)));

  // The written case reproduces: loaded as `attest repro` loads it, the check fails again.
  auto c = LoadCase(fa[0]);
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto again = RunCheckOnCase(**k1, "mutant/causal-top-left", *c, *FindCheck("accuracy"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->failed());
  auto on_parent = RunCheckOnCase(**parent, "cpu/flash2-bf16", *c, *FindCheck("accuracy"));
  ASSERT_TRUE(on_parent.ok());
  EXPECT_FALSE(on_parent->failed());
  EXPECT_TRUE(c->problem.causal);  // the bug needs causal: shrinking kept it
  EXPECT_EQ(again->failing.front().message.substr(again->failing.front().message.find(']') + 1),
            ra->failures[0].message.substr(ra->failures[0].message.find(']') + 1));
  // Shrunk: the target bound of 64 holds for this bug.
  EXPECT_LE(c->problem.seqlen_q, 64);
  EXPECT_LE(c->problem.seqlen_k, 64);
  fs::remove_all(a);
  fs::remove_all(b);
}

// A wrong kernel whose every call is slow: o is zero, and each call takes 40 ms.
class SlowZeroKernel final : public Kernel {
 public:
  explicit SlowZeroKernel(std::unique_ptr<Kernel> parent) : parent_(std::move(parent)) {}
  std::string name() const override { return "slow-zero"; }
  Capabilities capabilities() const override {
    Capabilities c = parent_->capabilities();
    c.sink = false;  // forwards the plain entry points only
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    auto r = parent_->Forward(p, q, k, v);
    if (auto* f = std::get_if<ForwardResult>(&r)) f->o = Tensor::Zeros(f->o.dtype(), f->o.shape());
    return r;
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    return parent_->Backward(p, q, k, v, o, lse, dout);
  }

 private:
  std::unique_ptr<Kernel> parent_;
};

// The --time budget covers shrinking: a run whose shrinking would outlast it stops at the
// deadline with the case found so far saved and the report written, saying so.
TEST(Fuzz, ShrinkingStopsAtTheTimeBudgetAndTheReportIsWritten) {
  auto parent = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(parent.ok());
  SlowZeroKernel kernel(std::move(parent).value());
  FuzzOptions o;
  o.kernel_spec = "slow-zero";
  o.seed = 5;
  o.seconds = 0.03;  // less than one case: the first case runs, its shrinking does not
  o.checks = {"accuracy"};
  o.out_dir = TempDir("deadline");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunFuzz(kernel, o);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->failures.size(), 1u);
  const FuzzFailure& f = r->failures[0];
  EXPECT_EQ(f.shrink_cut, "deadline");
  EXPECT_EQ(f.shrink_steps, 0);
  EXPECT_EQ(CaseToText(f.shrunk), CaseToText(f.original));
  ASSERT_TRUE(f.case_file.has_value());
  EXPECT_TRUE(fs::exists(*f.case_file));
  const auto report = nlohmann::json::parse(Slurp(*o.out_dir / kFuzzReportFile));
  EXPECT_EQ(report["failures"][0]["shrink_cut"], "deadline");
  // Without a budget the same failure is shrunk to its end (the field is null).
  EXPECT_LT(wall, 5.0);
  fs::remove_all(*o.out_dir);
  FuzzOptions full = o;
  full.seconds.reset();
  full.cases = 1;
  full.max_shrink_attempts = 3;
  full.out_dir = TempDir("deadline_full");
  auto r2 = RunFuzz(kernel, full);
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  ASSERT_EQ(r2->failures.size(), 1u);
  EXPECT_EQ(r2->failures[0].shrink_cut, "");
  EXPECT_GT(r2->failures[0].shrink_attempts, 0);
  EXPECT_TRUE(r2->ToJson()["failures"][0]["shrink_cut"].is_null());
  fs::remove_all(*full.out_dir);
}

TEST(Fuzz, ShardsAreDisjointAndTogetherRunTheUnshardedCases) {
  const Capabilities caps = (*Kernels().Create("cpu/flash2-bf16"))->capabilities();
  auto checks = ResolveChecks({}, caps);
  ASSERT_TRUE(checks.ok());
  // Shard I of N runs n = I, I + N, ...: a partition of [0, C).
  std::set<std::string> all, union_of_shards;
  for (int64_t n = 0; n < 60; ++n) {
    const FuzzCase f = DrawFuzzCase(caps, 11, n, *checks, {});
    all.insert(std::string(f.check->name) + CaseToText(f.c));
  }
  EXPECT_GT(all.size(), 55u);  // distinct cases, not one case repeated
  auto kernel = Kernels().Create("cpu/flash2-bf16");
  std::vector<fs::path> dirs;
  int64_t total = 0;
  for (int64_t shard = 0; shard < 3; ++shard) {
    FuzzOptions o;
    o.kernel_spec = "cpu/flash2-bf16";
    o.seed = 11;
    o.cases = 10;
    o.shard_index = shard;
    o.shard_count = 3;
    o.checks = {"unwritten-outputs"};
    o.out_dir = TempDir("shard" + std::to_string(shard));
    dirs.push_back(*o.out_dir);
    auto r = RunFuzz(**kernel, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->cases_run, shard == 0 ? 4 : 3);
    total += r->cases_run;
  }
  EXPECT_EQ(total, 10);
  auto merged = MergeFuzzReports(dirs);
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  EXPECT_EQ((*merged)["cases_run"], 10);
  EXPECT_TRUE((*merged)["missing_shards"].empty());
  EXPECT_EQ((*merged)["checks"]["unwritten-outputs"]["cases"], 10);
  auto partial = MergeFuzzReports({dirs[0], dirs[2]});
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ((*partial)["missing_shards"], nlohmann::json::array({1}));
  auto twice = MergeFuzzReports({dirs[0], dirs[0]});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("given twice"), std::string::npos);
  for (const auto& d : dirs) fs::remove_all(d);
}

TEST(Fuzz, TheGatesFuzzTailIsAttestFuzzsCasesOfTheRunSeed) {
  // run/suite.h FuzzTailRows draws without this library; the two must stay one draw.
  for (const char* name : {"cpu/flash2-bf16", "cpu/fp8-e4m3-tensor", "cpu/flash2-splitkv-bf16"}) {
    const Capabilities caps = (*Kernels().Create(name))->capabilities();
    auto checks = ResolveChecks({}, caps);
    ASSERT_TRUE(checks.ok());
    for (uint64_t seed : {0u, 11u}) {
      const std::vector<SuiteRow> tail = FuzzTailRows(caps, seed, 30);
      ASSERT_EQ(tail.size(), 30u);
      for (int64_t n = 0; n < 30; ++n) {
        const FuzzCase f = DrawFuzzCase(caps, seed, n, *checks, {});
        const SuiteRow& row = tail[static_cast<size_t>(n)];
        const InstantiatedCase c = Instantiate(row, caps, seed);
        ASSERT_TRUE(c.c.has_value()) << c.skipped;
        EXPECT_EQ(row.check, f.check->name) << name << " case " << n;
        EXPECT_EQ(CaseToText(*c.c), CaseToText(f.c)) << name << " case " << n;
      }
    }
  }
}

// splits-agree is drawn only for a kernel that declares two split counts or more, so that the
// draws of every other kernel stay those of the checks before it (CheckInfo::drawn_for).
TEST(Fuzz, SplitsAgreeIsDrawnOnlyForKernelsThatDeclareSplitCounts) {
  auto names = [](const Capabilities& caps) {
    std::vector<std::string_view> out;
    for (const CheckInfo* c : DrawnChecks(caps)) out.push_back(c->name);
    return out;
  };
  const Capabilities plain = (*Kernels().Create("cpu/flash2-bf16"))->capabilities();
  const Capabilities split = (*Kernels().Create("cpu/flash2-splitkv-bf16"))->capabilities();
  const auto a = names(plain), b = names(split);
  EXPECT_EQ(std::count(a.begin(), a.end(), "splits-agree"), 0);
  EXPECT_EQ(std::count(b.begin(), b.end(), "splits-agree"), 1);
  EXPECT_EQ(a.size() + 1, AllChecks().size());
  EXPECT_EQ(b.size(), AllChecks().size());
  Capabilities one = split;
  one.num_splits = {4};
  EXPECT_EQ(names(one), a);
}

TEST(Fuzz, RejectsBadOptionsNamingTheOption) {
  auto kernel = Kernels().Create("cpu/flash2-bf16");
  FuzzOptions o;
  o.kernel_spec = "cpu/flash2-bf16";
  EXPECT_EQ(RunFuzz(**kernel, o).error().message, "give exactly one of --cases and --time");
  o.cases = 1;
  o.shard_index = 3;
  o.shard_count = 3;
  EXPECT_EQ(RunFuzz(**kernel, o).error().message, "--shard: 3/3 is not I/N with 0 <= I < N");
  o.shard_index = 0;
  o.checks = {"acuracy"};
  EXPECT_EQ(RunFuzz(**kernel, o).error().message,
            "--check: unknown check 'acuracy' (did you mean 'accuracy'?) (see `attest list "
            "checks`)");
}

TEST(Shrink, ReachesAOneByOneCaseWhenEveryCaseFails) {
  const Capabilities caps = (*Kernels().Create("cpu/flash2-bf16"))->capabilities();
  PhiloxPicker pick(5);
  DrawLimits limits;
  const Case big = DrawCase(caps, pick, limits);
  const ShrinkResult r = Shrink(
      big, caps, [](const Case&) { return true; }, 1000);
  const Problem& p = r.c.problem;
  EXPECT_EQ(p.TotalQ(), 1) << DescribeProblem(p);
  EXPECT_EQ(p.TotalK(), 1);
  EXPECT_EQ(p.heads_q, 1);
  EXPECT_FALSE(p.causal || p.alibi_slopes || p.softcap > 0 || p.varlen() || p.document_ids_q);
  EXPECT_EQ(r.c.generator->name, "gaussian");
  EXPECT_EQ(r.c.generator->seed, big.generator->seed);
  // Deterministic: the same input shrinks the same way.
  EXPECT_EQ(CaseToText(Shrink(
                           big, caps, [](const Case&) { return true; }, 1000)
                           .c),
            CaseToText(r.c));
}

TEST(Shrink, KeepsWhatTheFailureNeeds) {
  // A "bug" that needs causal and Sk >= 40: shrinking keeps both and minimises Sk to 40.
  const Capabilities caps = (*Kernels().Create("cpu/flash2-bf16"))->capabilities();
  Case c;
  c.problem.batch = 2;
  c.problem.heads_q = 4;
  c.problem.heads_kv = 2;
  c.problem.seqlen_q = 100;
  c.problem.seqlen_k = 150;
  c.problem.causal = true;
  c.generator = GeneratorSpec{"ties", 9, nlohmann::json{{"group", 2}}};
  auto needs = [](const Case& x) { return x.problem.causal && x.problem.seqlen_k >= 40; };
  const ShrinkResult r = Shrink(c, caps, needs, 2000);
  EXPECT_TRUE(r.c.problem.causal);
  EXPECT_EQ(r.c.problem.seqlen_k, 40);
  EXPECT_EQ(r.c.problem.seqlen_q, 1);
  EXPECT_EQ(r.c.problem.batch, 1);
}

}  // namespace
}  // namespace attest
