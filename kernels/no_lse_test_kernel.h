// Test-only: a kernel whose forward returns no lse (kernels/kernel.h Capabilities::lse), made
// from any kernel that does, as PyTorch's F.scaled_dot_product_attention returns the output
// alone. Its backward gets no lse and takes the statistics the inner forward computed: kept
// from the last forward when the backward's problem and inputs are bitwise that forward's (as
// autograd keeps its saved tensors), else recomputed by the inner kernel. Used by
// verify/checks/no_lse_test.cc (the suites honour the flag) and
// kernels/exec/exec_kernel_test.cc (the protocol carries it).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "kernels/kernel.h"

namespace attest {

class NoLseTestKernel final : public Kernel {
 public:
  // `declare` false: drops lse but keeps claiming it (a broken kernel, which must fail).
  explicit NoLseTestKernel(std::unique_ptr<Kernel> inner, bool declare = true)
      : inner_(std::move(inner)), declare_(declare) {}
  std::string name() const override { return "no-lse(" + inner_->name() + ")"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
    c.lse = !declare_;
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto a = inner_->Forward(p, q, k, v);
    if (auto* r = std::get_if<ForwardResult>(&a)) {
      saved_ = Saved{ProblemToJson(p).dump(), q.Clone(), k.Clone(), v.Clone(), r->lse};
      r->lse = Tensor();
    }
    return a;
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    if (lse.defined()) return Error{name() + ": the backward was given an lse it never returned"};
    if (saved_ && saved_->problem == ProblemToJson(p).dump() && saved_->q.BitwiseEqual(q) &&
        saved_->k.BitwiseEqual(k) && saved_->v.BitwiseEqual(v)) {
      return inner_->Backward(p, q, k, v, o, saved_->lse, dout);
    }
    auto f = inner_->Forward(p, q, k, v);
    if (auto* u = std::get_if<Unsupported>(&f)) return *u;
    if (auto* e = std::get_if<Error>(&f)) return *e;
    return inner_->Backward(p, q, k, v, o, std::get<ForwardResult>(f).lse, dout);
  }
  std::optional<Format> BackwardDpFormat(const Problem& p) const override {
    return inner_->BackwardDpFormat(p);
  }

 private:
  struct Saved {
    std::string problem;
    Tensor q, k, v, lse;
  };
  std::unique_ptr<Kernel> inner_;
  bool declare_;
  std::optional<Saved> saved_;
};

}  // namespace attest
