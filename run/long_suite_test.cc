// The long suite and sampled checks (verify/metrics/sample.h; docs/checks.md "Sampled rows"), cheaply:
// the suite's rows instantiate and the sampler covers each row's boundaries; a sampled check
// end to end on short problems passes a correct model and says what it judged; the sampled
// baseline is bitwise the whole one on the sampled rows. long_suite_mutants_test.cc shows each
// sampled check failing on a mutant at 8k tokens. The long suite itself is not run here
// (docs/long-suite.md has its times).
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/problem/budget.h"
#include "reference/problem/mask.h"
#include "verify/tolerance/baseline.h"
#include "run/run.h"
#include "verify/metrics/sample.h"
#include "run/suite.h"

namespace attest {
namespace {

std::unique_ptr<Kernel> Make(const std::string& spec) {
  auto k = Kernels().Create(spec);
  EXPECT_TRUE(k.ok()) << spec;
  return std::move(k).value();
}

// Every row of the long suite instantiates for cpu/flash2-bf16 within the memory budget, its
// large rows are sampled, and the sample holds each sequence's edges, every 64/128/256 tile
// boundary, the last rows and exactly the empty rows (checked here from the mask's bounds,
// which are exact for these interval masks: sample_test.cc checks the rules by brute force).
TEST(LongSuite, RowsInstantiateAndTheSampleCoversTheirBoundaries) {
  const Suite* suite = FindSuite("long");
  ASSERT_NE(suite, nullptr);
  EXPECT_TRUE(suite->forward_only);
  EXPECT_FALSE(suite->cover_capabilities);
  EXPECT_EQ(suite->fuzz_cases, 0);
  auto kernel = Make("cpu/flash2-bf16");
  const Capabilities caps = kernel->capabilities();
  int64_t sampled = 0, at_128k = 0;
  for (const SuiteRow& row : RowsFor(*suite, caps, 0)) {
    const InstantiatedCase inst = Instantiate(row, caps, 0);
    ASSERT_TRUE(inst.c.has_value()) << inst.label << ": " << inst.skipped;
    const Problem& p = inst.c->problem;
    SCOPED_TRACE(inst.label);
    EXPECT_TRUE(CheckProblemBudget(p).ok());
    EXPECT_TRUE(p.seqlen_k >= 8192 || p.TotalK() >= 8192);
    at_128k += p.TotalK() >= 131072 ? 1 : 0;
    if (!ShouldSample(p)) {
      // Only the split-KV rows (few queries) are cheap enough for every row.
      EXPECT_LE(p.seqlen_q, 64);
      continue;
    }
    ++sampled;
    const RowSample s = SampleRows(p, {.seed = 1, .query_budget = kSampleBudget,
                                       .key_budget = kSampleBudget});
    EXPECT_LT(s.queries, p.TotalQ() / 2);
    const std::vector<uint8_t> empty = EmptyQueryRows(p);
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskView mask(p, b);
      const Sequence& seq = mask.sequence();
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const auto t = static_cast<size_t>(seq.q_begin + i);
        const bool edge = i == 0 || i == seq.q_len - 1;
        bool tile = false;
        for (int64_t T : {64, 128, 256}) tile = tile || (i > 0 && (i % T == 0 || (i + 1) % T == 0));
        const auto [lo, hi] = mask.KeyBounds(i);
        const bool is_empty = !(lo < hi && mask.Visible(i, lo) && mask.Visible(i, hi - 1));
        ASSERT_EQ(empty[t] != 0, is_empty) << "row " << t;
        if (edge || tile || is_empty) ASSERT_TRUE(s.query_rows[t]) << "row " << t;
      }
      for (int64_t j = 0; j < seq.k_len; ++j) {
        const auto t = static_cast<size_t>(seq.k_begin + j);
        bool tile = j == 0 || j == seq.k_len - 1;
        for (int64_t T : {64, 128, 256}) tile = tile || (j > 0 && (j % T == 0 || (j + 1) % T == 0));
        if (tile) ASSERT_TRUE(s.key_rows[t]) << "key " << t;
      }
    }
    for (int64_t x = 1; x <= kLastRows; ++x) {
      EXPECT_TRUE(s.query_rows[static_cast<size_t>(p.TotalQ() - x)]);
      EXPECT_TRUE(s.key_rows[static_cast<size_t>(p.TotalK() - x)]);
    }
  }
  EXPECT_GE(sampled, 8);
  EXPECT_GE(at_128k, 3);
}

// The sampling rule leaves every row of the other suites' tables whole (their verdicts are
// unchanged by it).
TEST(LongSuite, OtherSuitesAreNotSampled) {
  auto kernel = Make("cpu/flash2-bf16");
  for (const char* name : {"quick", "gate", "full"}) {
    for (const SuiteRow& row : FindSuite(name)->rows) {
      const InstantiatedCase inst = Instantiate(row, kernel->capabilities(), 0);
      if (!inst.c) continue;
      EXPECT_FALSE(ShouldSample(inst.c->problem)) << name << ": " << inst.label;
    }
  }
}

// The sampled (row-wise) baseline is bitwise the whole baseline on the sampled rows.
TEST(LongSuite, SampledBaselineIsTheWholeBaselineOnSampledRows) {
  Case c;
  Problem& p = c.problem;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 300;
  p.seqlen_k = 420;
  p.head_dim = p.head_dim_v = 32;
  p.causal = true;
  p.window_left = 90;
  p.softcap = 20;
  p.alibi_slopes = std::vector<double>{0.5, 0.25, 0.125, 0.0625};
  c.generator = GeneratorSpec{"gaussian", 3, nlohmann::json::object()};
  auto in = MakeCaseInputs(c);
  ASSERT_TRUE(in.ok());
  const Profile* profile = FindProfile("bf16");
  ASSERT_NE(profile, nullptr);
  const RowSample s = SampleRows(p, {.seed = 5, .query_budget = 40, .key_budget = 40});
  auto whole = ProfileBaseline(*profile, p, in->q, in->k, in->v, nullptr);
  auto rows = ProfileBaseline(*profile, p, in->q, in->k, in->v, nullptr, &s.query_rows);
  ASSERT_TRUE(whole.ok() && rows.ok());
  const auto wo = whole->o.span<const double>(), ro = rows->o.span<const double>();
  const int64_t per_row = p.heads_q * p.head_dim_v;
  int64_t compared = 0;
  for (int64_t t = 0; t < p.TotalQ(); ++t) {
    if (!s.query_rows[static_cast<size_t>(t)]) continue;
    for (int64_t e = 0; e < per_row; ++e, ++compared) {
      const auto at = static_cast<size_t>(t * per_row + e);
      ASSERT_EQ(std::memcmp(&wo[at], &ro[at], sizeof(double)), 0) << "row " << t;
    }
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const auto at = static_cast<size_t>(h * p.seqlen_q + t);
      ASSERT_EQ(whole->lse.span<const double>()[at], rows->lse.span<const double>()[at]);
    }
  }
  EXPECT_GT(compared, 0);
  // Sampled rows are a forward of the same-precision path only.
  EXPECT_FALSE(ProfileBaseline(*profile, p, in->q, in->k, in->v, &in->dout, &s.query_rows).ok());
}

Case MakeCase(Problem p, uint64_t seed = 9) {
  Case c;
  c.problem = std::move(p);
  c.problem.dtype = DType::kBF16;
  c.generator = GeneratorSpec{"gaussian", seed, nlohmann::json::object()};
  return c;
}

Problem Shape(int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d = 64) {
  Problem p;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = p.head_dim_v = d;
  return p;
}

// The given checks on one case, sampled (RunOptions::sample_above 0).
Report RunSampled(Kernel& kernel, const Case& c, std::vector<std::string> checks) {
  std::vector<const CheckInfo*> infos;
  for (const std::string& n : checks) infos.push_back(FindCheck(n));
  RunOptions o;
  o.kernel_spec = kernel.name();
  o.sample_above = 0;
  auto r = RunCase(kernel, c, std::span<const CheckInfo* const>(infos), o, "sampled");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r->report : Report{};
}

std::string FirstFailure(const Report& r) {
  for (const Verdict& v : r.verdicts) {
    if (!v.pass) return v.check + "/" + v.tensor + ": " + v.message;
  }
  return "";
}

// A correct model passes every sampled check on short problems of several mask kinds, and the
// verdicts say what was judged.
TEST(LongSuite, SampledChecksPassACorrectModelAndSayWhatTheyJudged) {
  auto kernel = Make("cpu/flash2-bf16");
  Problem causal = Shape(2, 1, 700, 500);
  causal.causal = true;  // Sq > Sk: 200 empty rows
  Problem window = Shape(2, 2, 600, 600, 128);
  window.window_left = 100;
  window.window_right = 30;
  Problem packed = Shape(2, 2, 1, 1);
  packed.batch = 4;
  packed.cu_seqlens_q = packed.cu_seqlens_k = std::vector<int32_t>{0, 1, 3, 520, 523};
  packed.seqlen_q = packed.seqlen_k = 517;
  packed.causal = true;
  for (const Problem& p : {causal, window, packed}) {
    const Report r = RunSampled(*kernel, MakeCase(p),
                                {"accuracy", "special-values", "non-interference"});
    SCOPED_TRACE(DescribeProblem(p));
    EXPECT_EQ(FirstFailure(r), "");
    const RowSample s = SampleRows(p, {.seed = 9, .query_budget = kSampleBudget,
                                       .key_budget = kSampleBudget});
    bool said = false, outside = false, leak = false;
    for (const Verdict& v : r.verdicts) {
      said = said || (v.check == "accuracy" && v.tensor == "o" &&
                      v.message.find("sampled: ") != std::string::npos);
      outside = outside || v.policy.find("outside the sampled rows") != std::string::npos;
      leak = leak || (v.check == "non-interference" &&
                      v.message.find("sampled: ") != std::string::npos);
    }
    EXPECT_TRUE(said);
    EXPECT_TRUE(outside);
    EXPECT_TRUE(leak);
  }
}

// A profile whose baseline is a recipe reference has no sampled baseline: accuracy says so in a
// failing verdict instead of judging without one (docs/checks.md "Sampled rows").
TEST(LongSuite, RecipeBaselinesAreNotSampledAndSaySo) {
  auto kernel = Make("cpu/mxfp8-pvbf16");
  Problem p = Shape(1, 1, 200, 200);
  p.causal = true;
  const Report r = RunSampled(*kernel, MakeCase(p), {"accuracy"});
  bool said = false;
  for (const Verdict& v : r.verdicts) {
    said = said || (!v.pass && v.policy == "a baseline for the profile" &&
                    v.message.find("sampled rows have a baseline only") != std::string::npos);
  }
  EXPECT_TRUE(said) << FirstFailure(r);
}

}  // namespace
}  // namespace attest
