// Test-only kernels for the non-interference and consistency tests (noninterference_test.cc,
// consistency_test.cc): a correct FlashAttention-2 bf16 model (kernels/models/flash_models.h)
// wrapped with one seeded defect each, and the case builder both tests use.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/models/flash_models.h"
#include "reference/formats/format.h"
#include "reference/case/inputs.h"
#include "reference/recipes/recipe.h"

namespace attest::check_test {

inline std::unique_ptr<Flash2Model> MakeFlash2Bf16() {
  return std::make_unique<Flash2Model>("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
}

// A kernel that forwards to a correct model, with hooks for the defect.
class Wrapped : public Kernel {
 public:
  explicit Wrapped(std::string name) : name_(std::move(name)), inner_(MakeFlash2Bf16()) {}
  std::string name() const override { return name_; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return inner_->Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }

 protected:
  std::string name_;
  std::unique_ptr<Flash2Model> inner_;
};

// V quantised up front with MX (mxfp8-e4m3, 32-blocks) along the SEQUENCE axis, then a correct
// forward and backward: one E8M0 scale is shared by 32 consecutive keys, across the causal
// diagonal (the published shared-scale leak).
class MxVAlongSequence : public Wrapped {
 public:
  MxVAlongSequence() : Wrapped("test/mx-v-sequence") {}
  static OperandScheme Scheme() {
    OperandScheme s;
    s.kind = OperandKind::kBlock;
    s.block = "mxfp8-e4m3";
    return s;
  }
  // The recipe this kernel implements, for the check's message (not in AllRecipes()).
  static Recipe AsRecipe() {
    Recipe r = *FindRecipe("bf16");
    r.name = "test-mx-v-sequence";
    r.pv.b.scheme = Scheme();
    r.pv.b.axis = QuantAxis::kSequence;
    return r;
  }
  static Tensor Quantised(const Problem& p, const Tensor& v) {
    const Tensor wide = ToF64(v);
    const auto span = wide.span<const double>();
    std::vector<float> f(span.begin(), span.end());
    auto r = QuantizeOperand(f, wide.shape(), p.varlen() ? 0 : 1, Scheme());
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (!r.ok()) return wide;
    return Tensor::FromF64(wide.shape(), std::vector<double>(r->begin(), r->end()));
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    return inner_->Forward(p, q, k, Quantised(p, v));
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, Quantised(p, v), o, lse, dout);
  }
};

// The backward forms D = rowsum(dO∘O) from an O one bf16 ulp away (away from zero) from the
// O the forward returned.
class DeltaFromOtherO : public Wrapped {
 public:
  DeltaFromOtherO() : Wrapped("test/delta-from-other-o") {}
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    Tensor bumped = o.Clone();
    EXPECT_EQ(bumped.dtype(), DType::kBF16);
    for (uint16_t& code : bumped.span<uint16_t>()) {
      if ((code & 0x7F80u) != 0x7F80u) ++code;  // next magnitude up; Inf/NaN left alone
    }
    return inner_->Backward(p, q, k, v, bumped, lse, dout);
  }
};

// The backward ignores the causal mask within 63 keys past the diagonal (the diagonal tile of
// a 64-row backward block): it differentiates a wider mask than the forward ran.
class BackwardIgnoresDiagonalMask : public Wrapped {
 public:
  BackwardIgnoresDiagonalMask() : Wrapped("test/backward-ignores-diagonal-mask") {}
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    Problem wide = p;
    if (p.causal) {
      wide.causal = false;
      wide.window_right = 63;
    }
    return inner_->Backward(wide, q, k, v, o, lse, dout);
  }
};

// Claims nondeterminism and flips the last bit of o's first element on every second call:
// a run-to-run spread the check must learn and allow (and only that).
class Jittery : public Wrapped {
 public:
  explicit Jittery(bool claim_deterministic)
      : Wrapped("test/jittery"), claim_(claim_deterministic) {}
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.sink = c.rel_bias = false;  // forwards the plain entry points only
    c.deterministic = claim_;
    return c;
  }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    auto r = inner_->Forward(p, q, k, v);
    if (auto* f = std::get_if<ForwardResult>(&r); f != nullptr && (++calls_ % 2 == 0)) {
      f->o = f->o.Clone();
      f->o.span<uint16_t>()[0] ^= 1u;
    }
    return r;
  }

 private:
  bool claim_;
  int calls_ = 0;
};

// Problems the tests run (small: every check runs dozens of kernel calls).
inline Problem BaseProblem(int64_t sq, int64_t sk, int64_t d = 64) {
  Problem p;
  p.batch = 1;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = d;
  p.head_dim_v = d;
  p.dtype = DType::kBF16;
  return p;
}

inline Problem CausalProblem() {
  Problem p = BaseProblem(96, 96);
  p.causal = true;
  return p;
}
inline Problem WindowProblem() {
  Problem p = BaseProblem(80, 112);
  p.window_left = 20;
  p.window_right = 5;
  return p;
}
inline Problem DocumentProblem() {
  Problem p = BaseProblem(72, 72);
  std::vector<int32_t> ids(72);
  for (int64_t i = 0; i < 72; ++i) ids[static_cast<size_t>(i)] = i < 23 ? 0 : i < 50 ? 1 : 2;
  p.document_ids_q = std::vector<std::vector<int32_t>>{ids};
  p.document_ids_k = p.document_ids_q;
  return p;
}
inline Problem VarlenProblem() {
  Problem p = BaseProblem(50, 60);
  p.batch = 3;
  p.causal = true;
  p.cu_seqlens_q = std::vector<int32_t>{0, 17, 50, 81};
  p.cu_seqlens_k = std::vector<int32_t>{0, 29, 89, 120};
  p.seqlen_q = 33;
  p.seqlen_k = 60;
  return p;
}

inline CaseInputs Inputs(const Problem& p, uint64_t seed) {
  Case c;
  c.problem = p;
  c.generator = GeneratorSpec{"gaussian", seed, nlohmann::json::object()};
  auto in = MakeCaseInputs(c);
  EXPECT_TRUE(in.ok()) << (in.ok() ? "" : in.error().message);
  return in.ok() ? *in : CaseInputs{};
}

}  // namespace attest::check_test
