// Each sampled check (verify/checks/check.h CheckContext::sample) fails on a mutant whose bug
// shows at the sampled rows of an 8k-token case (kernels/mutants/mutants.cc; docs/kernels.md),
// and the mutant's parent passes where the check has no other way to fail. About 20 s on two
// cores: labelled slow.
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "run/run.h"

namespace attest {
namespace {

std::unique_ptr<Kernel> Make(const std::string& spec) {
  auto k = Kernels().Create(spec);
  EXPECT_TRUE(k.ok()) << spec;
  return std::move(k).value();
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

bool Fails(const Report& r, std::string_view check, std::string_view tensor = {}) {
  return std::any_of(r.verdicts.begin(), r.verdicts.end(), [&](const Verdict& v) {
    return !v.pass && v.check == check && (tensor.empty() || v.tensor == tensor);
  });
}

std::string FirstFailure(const Report& r) {
  for (const Verdict& v : r.verdicts) {
    if (!v.pass) return v.check + "/" + v.tensor + ": " + v.message;
  }
  return "";
}

TEST(LongSuiteMutants, SampledChecksCatchMutantsAtLongLengths) {
  // accuracy: the last partial query tile never written (its rows keep the poison); the
  // sample holds the tensor's last rows, and the rows outside the sample are checked finite.
  {
    auto m = Make("mutant/last-tile-unwritten");
    const Report r = RunSampled(*m, MakeCase(Shape(1, 1, 8192 + 77, 8192 + 77)), {"accuracy"});
    EXPECT_TRUE(Fails(r, "accuracy", "o")) << FirstFailure(r);
    bool outside = false;
    for (const Verdict& v : r.verdicts) {
      outside = outside || (!v.pass && v.policy.find("outside the sampled") != std::string::npos);
    }
    EXPECT_TRUE(outside);
  }
  // accuracy: split-KV partials combined with the wrong weights, at a split-KV shape.
  {
    auto m = Make("mutant/split-kv-combine");
    Problem p = Shape(2, 1, 16, 16384);
    p.causal = true;
    const Report r = RunSampled(*m, MakeCase(p), {"accuracy"});
    EXPECT_TRUE(Fails(r, "accuracy", "o")) << FirstFailure(r);
  }
  // special-values: NaN in empty rows (causal Sq > Sk: the first 4096 rows see nothing).
  {
    auto m = Make("mutant/empty-row-nan");
    Problem p = Shape(1, 1, 8192, 4096);
    p.causal = true;
    const Report r = RunSampled(*m, MakeCase(p), {"special-values"});
    EXPECT_TRUE(Fails(r, "special-values", "o")) << FirstFailure(r);
  }
  // non-interference: V in MXFP8 blocks of 32 along the sequence, straddling the causal
  // diagonal: a hidden key moves the scale of visible ones, and the pivot (a tile's first row)
  // and its protected neighbours are sampled. The parent, with V in bf16, passes.
  {
    Problem p = Shape(1, 1, 8192, 8192);
    p.causal = true;
    auto m = Make("mutant/v-scale-crosses-causal");
    const Report bad = RunSampled(*m, MakeCase(p), {"non-interference"});
    EXPECT_TRUE(Fails(bad, "non-interference", "o")) << FirstFailure(bad);
    auto parent = Make("cpu/mxfp8-pvbf16");
    const Report good = RunSampled(*parent, MakeCase(p), {"non-interference"});
    EXPECT_FALSE(Fails(good, "non-interference")) << FirstFailure(good);
  }
}

}  // namespace
}  // namespace attest
