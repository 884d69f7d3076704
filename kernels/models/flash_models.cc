// The FlashAttention-2 and feather (RDNA3) CPU models (see flash_models.h, docs/kernels.md).
#include "kernels/models/flash_models.h"

#include <utility>

#include "reference/problem/paged.h"

namespace attest {

Flash2Model::Flash2Model(std::string name, const Recipe& recipe, DType dtype, EngineOptions options)
    : name_(std::move(name)), recipe_(&recipe), dtype_(dtype), options_(options) {}

Capabilities Flash2Model::capabilities() const {
  Capabilities caps;
  caps.dtypes = {dtype_};
  // Every head dim, mask family and score modifier: the engine implements them all through
  // reference/problem/mask.h (FlashAttention-2 itself caps head dims at 256 and has no
  // document / prefix / block-sparse masks; the model extends its numerics to them).
  caps.causal = caps.window = caps.softcap = caps.alibi = caps.varlen = caps.gqa = true;
  caps.documents = caps.prefix_lm = caps.block_sparse = true;
  caps.sink = true;  // the learnable sink joins each finished row (flash_engine.h)
  caps.rel_bias = true;  // and the relative bias each score (EngineOptions::rel_bias)
  caps.paged = caps.seqused = true;  // the logical problem, gathered (flash_engine_paged.cc)
  caps.backward = true;
  caps.deterministic = true;  // fixed tile order, thread-count independent
  caps.strides = "any";      // the engine reads every input through its strides
  caps.profile = std::string(recipe_->name);
  caps.recipe = std::string(recipe_->name);
  caps.num_splits = num_splits_;
  return caps;
}

std::unique_ptr<Flash2Model> MakeSplitKvModel() {
  auto m = std::make_unique<Flash2Model>(kSplitKvModelName, *FindRecipe("bf16"), DType::kBF16);
  m->set_num_splits({1, 2, 3, 8});
  return m;
}

KernelAnswer<ForwardResult> Flash2Model::Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                                 const Tensor& v) {
  route_ = "flash2 forward";
  std::string why;
  if (!capabilities().Covers(p, &why)) return Unsupported{name_ + ": " + why};
  return FlashForward(p, *recipe_, q, k, v, options_);
}

KernelAnswer<BackwardResult> Flash2Model::Backward(const Problem& p, const Tensor& q,
                                                   const Tensor& k, const Tensor& v,
                                                   const Tensor& o, const Tensor& lse,
                                                   const Tensor& dout) {
  route_ = "flash2 backward";
  std::string why;
  if (!capabilities().Covers(p, &why)) return Unsupported{name_ + ": " + why};
  return FlashBackward(p, *recipe_, q, k, v, o, lse, dout, options_);
}

KernelAnswer<ForwardResult> Flash2Model::ForwardSink(const Problem& p, const Tensor& q,
                                                     const Tensor& k, const Tensor& v,
                                                     const Tensor& sink) {
  route_ = "flash2 forward, sink";
  std::string why;
  if (!capabilities().Covers(p, &why)) return Unsupported{name_ + ": " + why};
  EngineOptions options = options_;
  options.sink = &sink;
  return FlashForward(p, *recipe_, q, k, v, options);
}

KernelAnswer<BackwardResult> Flash2Model::BackwardSink(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& o, const Tensor& lse,
                                                       const Tensor& dout, const Tensor& sink) {
  route_ = "flash2 backward, sink";
  std::string why;
  if (!capabilities().Covers(p, &why)) return Unsupported{name_ + ": " + why};
  EngineOptions options = options_;
  options.sink = &sink;
  return FlashBackward(p, *recipe_, q, k, v, o, lse, dout, options);
}

KernelAnswer<ForwardResult> Flash2Model::ForwardRelBias(const Problem& p, const Tensor& q,
                                                        const Tensor& k, const Tensor& v,
                                                        const Tensor& rel_bias,
                                                        const Tensor& sink) {
  route_ = "flash2 forward, relative bias";
  std::string why;
  if (!capabilities().Covers(p, &why)) return Unsupported{name_ + ": " + why};
  EngineOptions options = options_;
  options.rel_bias = &rel_bias;
  if (p.sink) options.sink = &sink;
  return FlashForward(p, *recipe_, q, k, v, options);
}

KernelAnswer<BackwardResult> Flash2Model::BackwardRelBias(const Problem& p, const Tensor& q,
                                                          const Tensor& k, const Tensor& v,
                                                          const Tensor& o, const Tensor& lse,
                                                          const Tensor& dout,
                                                          const Tensor& rel_bias,
                                                          const Tensor& sink) {
  route_ = "flash2 backward, relative bias";
  std::string why;
  if (!capabilities().Covers(p, &why)) return Unsupported{name_ + ": " + why};
  EngineOptions options = options_;
  options.rel_bias = &rel_bias;
  if (p.sink) options.sink = &sink;
  return FlashBackward(p, *recipe_, q, k, v, o, lse, dout, options);
}

std::optional<Format> Flash2Model::BackwardDpFormat(const Problem& p) const {
  (void)p;
  return attest::BackwardDpFormat(*recipe_, options_);
}

FeatherModel::FeatherModel(EngineOptions options)
    : Flash2Model("cpu/feather-fp16", *FindRecipe("f16"), DType::kF16, options) {}

std::string FeatherModel::FusedBackwardUnsupported(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128) {
    return "head_dim " + std::to_string(p.head_dim) + " (fused path: 64 or 128)";
  }
  if (p.head_dim_v != p.head_dim) return "head_dim_v != head_dim";
  if (p.causal) return "causal";
  if (p.window_left >= 0 || p.window_right >= 0) return "window";
  if (p.document_ids_q || p.document_ids_k) return "documents";
  if (p.prefix_lm > 0) return "prefix_lm";
  if (p.block_sparse) return "block_sparse";
  if (p.heads_q != p.heads_kv) return "gqa";
  if (p.varlen()) return "varlen";
  if (p.softcap > 0) return "softcap";
  if (p.alibi_slopes) return "alibi";
  if (HasLogicalView(p)) return "paged or seqused";
  return {};
}

KernelAnswer<BackwardResult> FeatherModel::Backward(const Problem& p, const Tensor& q,
                                                    const Tensor& k, const Tensor& v,
                                                    const Tensor& o, const Tensor& lse,
                                                    const Tensor& dout) {
  std::string why;
  if (!capabilities().Covers(p, &why)) {
    route_ = "unsupported";
    return Unsupported{name_ + ": " + why};
  }
  const std::string fallback = FusedBackwardUnsupported(p);
  route_ = fallback.empty() ? "fused" : "fallback: " + fallback;
  return FlashBackward(p, *recipe_, q, k, v, o, lse, dout, BackwardOptions(p));
}

EngineOptions FeatherModel::BackwardOptions(const Problem& p) const {
  EngineOptions options = options_;
  options.backward = FusedBackwardUnsupported(p).empty() ? BackwardVariant::kFusedNoAtomics
                                                         : BackwardVariant::kFlash2;
  return options;
}

std::optional<Format> FeatherModel::BackwardDpFormat(const Problem& p) const {
  return attest::BackwardDpFormat(*recipe_, BackwardOptions(p));
}

namespace {
EngineOptions Tile64Options() {
  EngineOptions o;
  o.fwd_block_m = o.fwd_block_n = o.bwd_block_m = o.bwd_block_n = 64;
  return o;
}
}  // namespace

Tile64Model::Tile64Model()
    : Flash2Model(kName, *FindRecipe("bf16"), DType::kBF16, Tile64Options()) {}

Capabilities Tile64Model::capabilities() const {
  Capabilities caps;
  caps.dtypes = {DType::kBF16};
  caps.head_dims = caps.head_dims_v = {16, 32, 64, 128, 256};
  caps.same_head_dim_v = true;
  caps.causal = true;  // with Sq = Sk both alignments are one mask
  caps.backward = true;
  caps.deterministic = true;
  caps.strides = "any";
  caps.profile = caps.recipe = "bf16";
  caps.shapes.seqlen_q_multiple = caps.shapes.seqlen_k_multiple = 64;
  caps.shapes.equal_seqlens = true;
  return caps;
}

void RegisterFlashModels(KernelRegistry& registry) {
  registry.Register("cpu/flash2-bf16",
                    "FlashAttention-2 numerics in bf16 (tiled fp32 online softmax, exp2, P and "
                    "dS rounded to bf16)",
                    [](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
                      return std::unique_ptr<Kernel>(std::make_unique<Flash2Model>(
                          "cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16));
                    });
  registry.Register("cpu/flash2-fp16",
                    "FlashAttention-2 numerics in fp16 (tiled fp32 online softmax, exp2, P and "
                    "dS rounded to fp16)",
                    [](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
                      return std::unique_ptr<Kernel>(std::make_unique<Flash2Model>(
                          "cpu/flash2-fp16", *FindRecipe("f16"), DType::kF16));
                    });
  registry.Register(kSplitKvModelName,
                    "cpu/flash2-bf16 with split-KV (flash-decoding): declares num_splits 1, 2, 3 "
                    "and 8; partial o and lse per split, combined in fp32",
                    [](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
                      return std::unique_ptr<Kernel>(MakeSplitKvModel());
                    });
  registry.Register("cpu/feather-fp16",
                    "RDNA3 hybrid: FA2 fp16 forward; fused no-atomics fp16 backward for dense "
                    "non-causal MHA at head dim 64/128, else the FA2 backward (route reported)",
                    [](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
                      return std::unique_ptr<Kernel>(std::make_unique<FeatherModel>());
                    });
  registry.Register(Tile64Model::kName,
                    "a one-loop tiled kernel with ordinary shape limits (Triton tutorial class): "
                    "64 x 64 tiles, Sq = Sk multiples of 64, D 16..256 powers of two, causal or "
                    "none, MHA, bf16",
                    [](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
                      return std::unique_ptr<Kernel>(std::make_unique<Tile64Model>());
                    });
}

}  // namespace attest
