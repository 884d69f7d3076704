// The low-precision CPU numerics models (docs/kernels.md): cpu/mxfp8-cudnn
// (cuDNN's MXFP8 SDPA, cudnn-frontend test/python/sdpa/mxfp8_ref.py), cpu/mxfp8-pvbf16 (its
// leak-free variant: MXFP8 only in the head-dim-contracting products), cpu/nvfp4-mixed
// (NVFP4 Q, K; FP8 V and P) and cpu/fp8-e4m3-tensor (FlashAttention-3's FP8 forward with
// per-(batch, head) descales). Each is the tiled engine (flash_engine.h) run on one row of
// the recipe table (reference/recipes/recipe.cc); docs/kernels.md "Low-precision models"
// lists their rounding points, sources and measured errors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/models/flash_engine.h"
#include "reference/recipes/recipe.h"

namespace attest {

// One low-precision model as data: its registry name, the recipe row it runs, and what it
// supports beyond what every model of the engine supports.
struct LowpModelSpec {
  std::string_view name;           // "cpu/mxfp8-cudnn"
  std::string_view recipe;         // a row of AllRecipes()
  std::string_view description;    // for `attest list kernels`
  std::vector<int64_t> head_dims;  // D and Dv values the recipe's blocks along D allow
  bool gqa = true;
  bool varlen = true;
  // Empty: backward runs the recipe's backward. Otherwise Backward answers Unsupported with
  // this reason and capabilities().backward is false.
  std::string_view no_backward;
  // Empty: every problem the capabilities cover. Otherwise why GQA / varlen are excluded.
  std::string_view limits;
};

// Every low-precision model, in a fixed order.
std::span<const LowpModelSpec> LowpModelSpecs();

class LowpModel : public Kernel {
 public:
  // `spec` must outlive the model (LowpModelSpecs() rows do); its recipe must exist.
  explicit LowpModel(const LowpModelSpec& spec, EngineOptions options = {});
  std::string name() const override { return std::string(spec_->name); }
  Capabilities capabilities() const override;
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override;
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override;
  std::string last_route() const override { return route_; }
  const Recipe& recipe() const { return *recipe_; }
  const EngineOptions& options() const { return options_; }

 private:
  // The Unsupported reason for a problem outside the capabilities, with the spec's limits.
  std::string Refusal(const std::string& why) const;

  const LowpModelSpec* spec_;
  const Recipe* recipe_;
  EngineOptions options_;
  std::string route_;
};

// Registers every row of LowpModelSpecs().
void RegisterLowpModels(KernelRegistry& registry);

}  // namespace attest
