// The CPU numerics models built on the tiled engine (flash_engine.h): cpu/flash2-bf16,
// cpu/flash2-fp16 (FlashAttention-2, arXiv 2307.08691) and cpu/feather-fp16 (the RDNA3 hybrid:
// FA2 forward, a fused no-atomics fp16 backward for dense non-causal MHA at head dim 64/128,
// every other case routed to the FA2 backward). docs/kernels.md documents their rounding
// points and sources.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/models/flash_engine.h"
#include "reference/recipes/recipe.h"

namespace attest {

// A FlashAttention-2 model: the engine with one recipe and tile configuration.
class Flash2Model : public Kernel {
 public:
  Flash2Model(std::string name, const Recipe& recipe, DType dtype, EngineOptions options = {});
  std::string name() const override { return name_; }
  Capabilities capabilities() const override;
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override;
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override;
  // The learnable sink through the engine (EngineOptions::sink; docs/semantics.md).
  KernelAnswer<ForwardResult> ForwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& sink) override;
  KernelAnswer<BackwardResult> BackwardSink(const Problem& p, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& o, const Tensor& lse,
                                            const Tensor& dout, const Tensor& sink) override;
  // The learnable relative bias (with or without a sink) through the engine
  // (EngineOptions::rel_bias; docs/semantics.md).
  KernelAnswer<ForwardResult> ForwardRelBias(const Problem& p, const Tensor& q, const Tensor& k,
                                             const Tensor& v, const Tensor& rel_bias,
                                             const Tensor& sink) override;
  KernelAnswer<BackwardResult> BackwardRelBias(const Problem& p, const Tensor& q,
                                               const Tensor& k, const Tensor& v, const Tensor& o,
                                               const Tensor& lse, const Tensor& dout,
                                               const Tensor& rel_bias,
                                               const Tensor& sink) override;
  std::string last_route() const override { return route_; }
  std::optional<Format> BackwardDpFormat(const Problem& p) const override;
  const EngineOptions& options() const { return options_; }
  // The split-KV counts the model declares (Capabilities::num_splits; empty: none, every call
  // one pass). The engine runs a problem's num_splits as flash-decoding does (flash_engine.h
  // CombineKvSplits); 0, the kernel's choice, is one pass.
  void set_num_splits(std::vector<int64_t> counts) { num_splits_ = std::move(counts); }

 protected:
  std::string name_;
  const Recipe* recipe_;
  DType dtype_;
  EngineOptions options_;
  std::string route_;
  std::vector<int64_t> num_splits_;
};

// cpu/flash2-splitkv-bf16: cpu/flash2-bf16 with split-KV (FlashAttention's num_splits): it
// declares the counts 1, 2, 3 and 8, and each splits the key tiles as
// compute_attn_1rowblock_splitkv does, the partials combined in fp32 (the learnable sink once).
inline constexpr const char* kSplitKvModelName = "cpu/flash2-splitkv-bf16";
std::unique_ptr<Flash2Model> MakeSplitKvModel();

// cpu/feather-fp16: Flash2Model's forward; Backward takes the fused path only where
// FusedBackwardUnsupported() is empty, and reports "fused" or "fallback: <reason>".
class FeatherModel : public Flash2Model {
 public:
  explicit FeatherModel(EngineOptions options = {});
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override;
  // Why the fused backward does not apply to `p` ("" when it does): head_dim not 64/128,
  // head_dim_v != head_dim, any mask (causal, window, documents, prefix-LM, block-sparse),
  // GQA, varlen, softcap or ALiBi.
  static std::string FusedBackwardUnsupported(const Problem& p);
  // f16 on the fused route (its fp16-output dP GEMM), nullopt on the FA2 fallback.
  std::optional<Format> BackwardDpFormat(const Problem& p) const override;

 private:
  // The engine options Backward uses on `p` (the fused or the FA2 variant).
  EngineOptions BackwardOptions(const Problem& p) const;
};

// cpu/tile64-bf16: a kernel of the shape every Triton user starts from (triton-lang/triton
// python/tutorials/06-fused-attention.py): one fused tile loop over 64 x 64 tiles, forward and
// backward, and its ordinary limits declared as capabilities: Sq = Sk, both a multiple of 64,
// head dims 16..256 in powers of two (Dv = D), causal or no mask, MHA, bf16. Its numerics are
// the engine's (fp32 online softmax with exp2, P and dS rounded to bf16); what it adds is a
// kernel whose refusals outside those limits are honest, and the parent of the tiled-kernel
// mutants (kernels/mutants/mutants.cc).
class Tile64Model : public Flash2Model {
 public:
  Tile64Model();
  Capabilities capabilities() const override;
  static constexpr const char* kName = "cpu/tile64-bf16";
};

// Registers cpu/flash2-bf16, cpu/flash2-fp16, cpu/flash2-splitkv-bf16, cpu/feather-fp16 and
// cpu/tile64-bf16.
void RegisterFlashModels(KernelRegistry& registry);

}  // namespace attest
