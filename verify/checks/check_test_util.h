// Test-only kernels and helpers shared by the check tests that run the suite runner of run/
// (check_test.cc, check_framework_test.cc): the correct model (cpu/flash2-bf16), a wrapper
// whose forward output can be edited, the broken kernels both files run, and a quick-suite
// run with its failure filters.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/builtin.h"
#include "reference/formats/format.h"
#include "verify/checks/check.h"
#include "run/run.h"
#include "run/suite.h"

namespace attest::suite_test {

inline std::unique_ptr<Kernel> Flash2() {
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
inline int64_t OIndex(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t d) {
  return ((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim_v + d;
}

// A wrapper whose forward output can be edited; everything else is the correct model.
class Wrapper : public Kernel {
 public:
  explicit Wrapper(std::string name) : name_(std::move(name)), inner_(Flash2()) {}
  std::string name() const override { return name_; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
    return c;
  }
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

inline RunResult RunQuick(Kernel& kernel, const std::string& suite = "quick", uint64_t seed = 0,
              const std::string& only = "") {
  RunOptions o;
  o.kernel_spec = kernel.name();
  o.seed = seed;
  o.only_check = only;
  auto r = RunSuite(kernel, *FindSuite(suite), o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return std::move(r).value();
}

inline std::vector<Verdict> Failures(const RunResult& r) {
  std::vector<Verdict> out;
  for (const Verdict& v : r.report.verdicts) {
    if (!v.pass) out.push_back(v);
  }
  return out;
}

inline bool AnyFailure(const RunResult& r, std::string_view check, std::string_view tensor) {
  for (const Verdict& v : r.report.verdicts) {
    if (!v.pass && v.check == check && v.tensor == tensor) return true;
  }
  return false;
}

}  // namespace attest::suite_test
