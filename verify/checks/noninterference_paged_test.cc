// The non-interference check on paged and seqused problems (noninterference.cc
// LogicalPerturbSets; docs/semantics.md "Paged KV and seqused"): a correct FlashAttention-2
// model leaves every output bitwise unchanged when pages no sequence reads, slots past
// seqused_k, queries past seqused_q and other sequences' pages are perturbed; the three paged
// mutants (a page index off by one page, a last page read whole past seqused_k, seqused_k
// ignored in the backward) fail it.
#include <gtest/gtest.h>

#include <string>

#include "kernels/mutants/mutants.h"
#include "reference/case/inputs.h"
#include "reference/problem/paged.h"
#include "verify/checks/check_test_kernels.h"
#include "verify/checks/noninterference.h"

namespace attest {
namespace {

std::vector<Problem> Problems() {
  std::vector<Problem> out;
  Problem a = check_test::BaseProblem(40, 48);
  a.batch = 2;
  a.causal = true;
  a.page_size = 16;
  a.seqused_q = std::vector<int32_t>{40, 9};
  a.seqused_k = std::vector<int32_t>{48, 20};
  out.push_back(a);
  Problem b = check_test::BaseProblem(30, 50);
  b.batch = 3;
  b.page_size = 8;
  b.cu_seqlens_q = std::vector<int32_t>{0, 30, 41, 41};
  b.cu_seqlens_k = std::vector<int32_t>{0, 50, 67, 100};
  b.seqused_k = std::vector<int32_t>{45, 13, 29};
  out.push_back(b);
  Problem c = check_test::BaseProblem(33, 33);  // seqused alone, contiguous
  c.batch = 2;
  c.window_left = 5;
  c.window_right = 0;
  c.seqused_q = std::vector<int32_t>{20, 33};
  c.seqused_k = std::vector<int32_t>{33, 17};
  out.push_back(c);
  for (Problem& p : out) FillPagedDefaults(p);
  return out;
}

CaseInputs Generated(const Problem& p) {
  Case c;
  c.problem = p;
  c.generator = GeneratorSpec{"gaussian", 5, nlohmann::json::object()};
  auto in = MakeCaseInputs(c);
  EXPECT_TRUE(in.ok()) << in.error().message;
  return std::move(*in);
}

TEST(NonInterferencePaged, Flash2LeavesEveryOutputBitwiseUnchanged) {
  auto kernel = check_test::MakeFlash2Bf16();
  for (const Problem& p : Problems()) {
    NonInterferenceOptions options;
    options.seed = 3;
    const auto verdicts = CheckNonInterference(*kernel, p, Generated(p), options);
    ASSERT_EQ(verdicts.size(), 5u);
    for (const Verdict& v : verdicts) {
      EXPECT_TRUE(v.pass) << v.tensor << ": " << v.message;
      EXPECT_EQ(v.margin, 0) << v.tensor;
    }
  }
}

TEST(NonInterferencePaged, PagedMutantsFail) {
  const Problem p = Problems()[0];
  const CaseInputs in = Generated(p);
  for (const char* name : {"page-index-off-by-one", "last-page-overread",
                           "seqused-k-ignored-in-backward"}) {
    const MutantSpec* spec = FindMutant(name);
    ASSERT_NE(spec, nullptr) << name;
    MutantKernel kernel(*spec);
    NonInterferenceOptions options;
    options.seed = 3;
    const auto verdicts = CheckNonInterference(kernel, p, in, options);
    bool failed = false;
    std::string first;
    for (const Verdict& v : verdicts) {
      if (!v.pass && first.empty()) first = v.tensor + ": " + v.message;
      failed = failed || !v.pass;
    }
    EXPECT_TRUE(failed) << name;
    std::printf("  %-32s %s\n", name, first.substr(0, 160).c_str());
  }
}

}  // namespace
}  // namespace attest
