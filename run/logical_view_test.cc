// The checks on paged and seqused cases (run/logical_view.h): every correct CPU model passes
// accuracy, special-values, determinism and the paged-vs-contiguous relation (layouts); each
// paged mutant fails accuracy and the relation; a kernel that breaks a defined value outside
// the used rows fails special-values, naming it.
#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "kernels/mutants/mutants.h"
#include "reference/problem/paged.h"
#include "run/fuzz.h"
#include "run/logical_view.h"

namespace attest {
namespace {

// GQA, causal and window, sequences that end inside a page and queries past seqused_q (the
// gate's paged rows, run/suite.cc PagedRows, smaller).
Case PagedCase(DType dtype) {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 24;
  p.seqlen_k = 40;
  p.head_dim = p.head_dim_v = 32;
  p.dtype = dtype;
  p.window_left = 12;
  p.window_right = 4;
  p.page_size = 8;
  p.seqused_q = std::vector<int32_t>{24, 9};
  p.seqused_k = std::vector<int32_t>{21, 40};
  FillPagedDefaults(p);
  Case c;
  c.problem = p;
  c.generator = GeneratorSpec{"gaussian", 5, nlohmann::json::object()};
  return c;
}

CheckOutcome RunCheck(Kernel& kernel, const std::string& spec, const Case& c, std::string_view check) {
  const CheckInfo* info = FindCheck(check);
  EXPECT_NE(info, nullptr) << check;
  auto r = RunCheckOnCase(kernel, spec, c, *info);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : CheckOutcome{};
}

TEST(LogicalView, CorrectModelsPassEveryCheckThatJudgesPagedCases) {
  for (const auto& [spec, dtype] : {std::pair{"cpu/flash2-bf16", DType::kBF16},
                                    std::pair{"cpu/flash2-fp16", DType::kF16},
                                    std::pair{"cpu/feather-fp16", DType::kF16}}) {
    auto kernel = Kernels().Create(spec);
    ASSERT_TRUE(kernel.ok()) << kernel.error().message;
    for (std::string_view check : {"accuracy", "special-values", "determinism", "layouts",
                                   "unwritten-outputs", "consistency"}) {
      const CheckOutcome o = RunCheck(**kernel, spec, PagedCase(dtype), check);
      EXPECT_TRUE(o.applicable) << spec << " " << check;
      EXPECT_FALSE(o.failed()) << spec << " " << check << ": "
                               << (o.failed() ? o.failing.front().message : "");
    }
  }
}

TEST(LogicalView, PagedMutantsFailAccuracyAndThePagedContiguousRelation) {
  for (const char* name : {"page-index-off-by-one", "last-page-overread",
                           "seqused-k-ignored-in-backward"}) {
    auto kernel = Kernels().Create(std::string("mutant/") + name);
    ASSERT_TRUE(kernel.ok()) << kernel.error().message;
    for (std::string_view check : {"accuracy", "layouts"}) {
      const CheckOutcome o = RunCheck(**kernel, name, PagedCase(DType::kBF16), check);
      EXPECT_TRUE(o.failed()) << name << " passes " << check;
    }
  }
}

// cpu/flash2-bf16 with 0.5 written into o at the last query row, past seqused_q.
class WritesPastSeqused : public Kernel {
 public:
  WritesPastSeqused() : inner_(std::move(Kernels().Create("cpu/flash2-bf16")).value()) {}
  std::string name() const override { return "writes-past-seqused"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto r = inner_->Forward(p, q, k, v);
    if (auto* f = std::get_if<ForwardResult>(&r)) {
      Tensor o = ToF64(f->o).Clone();
      o.span<double>().back() = 0.5;  // the last row of sequence 1 (seqused_q 9 of 24)
      f->o = o;
    }
    return r;
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }

 private:
  std::unique_ptr<Kernel> inner_;
};

TEST(LogicalView, AValueWrittenPastSequsedFailsSpecialValues) {
  WritesPastSeqused kernel;
  const CheckOutcome o = RunCheck(kernel, "writes-past-seqused", PagedCase(DType::kBF16),
                             "special-values");
  ASSERT_TRUE(o.failed());
  EXPECT_NE(o.failing.front().message.find("past seqused_q"), std::string::npos)
      << o.failing.front().message;
  // The logical rows alone are right: accuracy judges and passes.
  const CheckOutcome acc = RunCheck(kernel, "writes-past-seqused", PagedCase(DType::kBF16),
                                    "accuracy");
  EXPECT_TRUE(acc.applicable);
  EXPECT_FALSE(acc.failed());
}

}  // namespace
}  // namespace attest
