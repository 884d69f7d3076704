// The low-precision CPU models (see lowp_models.h, docs/kernels.md "Low-precision models"):
// a table of specs and one Kernel that runs the tiled engine on the spec's recipe.
#include "kernels/models/lowp_models.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

#include "reference/recipes/recipe_json.h"

namespace attest {
namespace {

// Head dims (D and Dv) a recipe supports. MX blocks along D need D % 32 == 0 (cuDNN's MXFP8
// SDPA pads D to whole 32-blocks; a partial block would be a different quantisation); NVFP4
// needs D % 16 == 0; both up to 256 (the largest head dim of the modelled kernels). FA3 runs
// any D <= 256 (a multiple of 8, its alignment rule) in the kernel of the next instantiated
// size (hopper/flash_api.cpp round_up_headdim: 64, 96, 128, 192, 256); the zero padding does
// not change the per-(batch, head) amax, so the numerics are those of D itself.
std::vector<int64_t> Multiples(int64_t step) {
  std::vector<int64_t> out;
  for (int64_t d = step; d <= 256; d += step) out.push_back(d);
  return out;
}

const std::vector<LowpModelSpec>& Specs() {
  static const std::vector<LowpModelSpec> specs = {
      {"cpu/mxfp8-cudnn",
       "mxfp8-cudnn",
       "cuDNN MXFP8 SDPA numerics (mxfp8_ref.py): MXFP8 Q, K along D, V along S, P x16 -> "
       "E4M3; dS MXFP8 both ways in backward; leaks across causal/document boundaries by "
       "construction",
       Multiples(32),
       true,
       true,
       {},
       {}},
      {"cpu/mxfp8-pvbf16",
       "mxfp8-pvbf16",
       "MXFP8 only for Q.K^T and dO.V^T (blocks along D); P.V and the sequence-contracting "
       "backward products in bf16: leak-free",
       Multiples(32),
       true,
       true,
       {},
       {}},
      {"cpu/nvfp4-mixed",
       "nvfp4-mixed",
       "NVFP4 Q, K (E2M1, E4M3 scale per 16 along D, fp32 scale per token), FP8 E4M3 V with "
       "a per-token-head scale, P x16 -> E4M3; backward at the forward's quantised operands",
       Multiples(16),
       true,
       true,
       {},
       {}},
      {"cpu/fp8-e4m3-tensor", "fp8-e4m3-tensor",
       "FlashAttention-3 FP8 forward: E4M3 Q, K, V with static fp32 descales per (batch, "
       "head) (vLLM's default 1.0), P x256 -> E4M3; forward only",
       Multiples(8), false, false,
       "FlashAttention-3 has no FP8 backward (flash_attn_interface.py: the fp8 path is "
       "forward-only); recipe fp8-e4m3-tensor defines no backward GEMMs",
       "GQA and varlen are not modelled: FA3 shares one q_descale per (batch, kv head) across "
       "the query heads of a group and per sequence in a packed batch, and the recipe's "
       "per-(batch, head) blocks of [B, S, H, D] can express neither"},
  };
  return specs;
}

}  // namespace

std::span<const LowpModelSpec> LowpModelSpecs() { return Specs(); }

std::string LowpModel::Refusal(const std::string& why) const {
  std::string out = name() + ": " + why;
  if (!spec_->limits.empty()) out += " (" + std::string(spec_->limits) + ")";
  return out;
}

LowpModel::LowpModel(const LowpModelSpec& spec, EngineOptions options)
    : spec_(&spec), recipe_(FindRecipe(spec.recipe)), options_(options) {}

Capabilities LowpModel::capabilities() const {
  Capabilities caps;
  caps.dtypes = {DType::kBF16};  // every recipe here takes bf16 inputs and quantises them
  caps.head_dims = spec_->head_dims;
  caps.head_dims_v = spec_->head_dims;
  // Masks and score modifiers: the engine implements them all (flash_models.cc says why the
  // models extend the modelled kernels' numerics to them); GQA and varlen per spec.
  caps.causal = caps.window = caps.softcap = caps.alibi = true;
  caps.documents = caps.prefix_lm = caps.block_sparse = true;
  caps.gqa = spec_->gqa;
  caps.varlen = spec_->varlen;
  caps.backward = spec_->no_backward.empty();
  caps.deterministic = true;  // fixed tile order; quantisation is a pure function of the data
  caps.strides = "any";      // the engine reads every input through its strides
  // verify/tolerance/tolerance.cc has one profile row per recipe: the bf16 baseline-ratio rule against
  // the reference implementation of the recipe (verify/tolerance/baseline.h RecipeReference*;
  // docs/tolerances.md has the measured headroom).
  caps.profile = std::string(spec_->recipe);
  caps.recipe = std::string(spec_->recipe);
  return caps;
}

KernelAnswer<ForwardResult> LowpModel::Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                               const Tensor& v) {
  route_ = "forward " + std::string(spec_->recipe);
  std::string why;
  if (recipe_ == nullptr)
    return Error{name() + ": recipe " + std::string(spec_->recipe) + " missing"};
  if (!capabilities().Covers(p, &why)) return Unsupported{Refusal(why)};
  return FlashForward(p, *recipe_, q, k, v, options_);
}

KernelAnswer<BackwardResult> LowpModel::Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& o,
                                                 const Tensor& lse, const Tensor& dout) {
  if (!spec_->no_backward.empty()) {
    route_ = "unsupported";
    return Unsupported{name() + ": " + std::string(spec_->no_backward)};
  }
  route_ = "backward " + std::string(spec_->recipe);
  std::string why;
  if (recipe_ == nullptr)
    return Error{name() + ": recipe " + std::string(spec_->recipe) + " missing"};
  if (!capabilities().Covers(p, &why)) return Unsupported{Refusal(why)};
  return FlashBackward(p, *recipe_, q, k, v, o, lse, dout, options_);
}

namespace {

// A spec built at run time for `recipe:<file>`: its strings live here, beside the spec that
// points into them, for the process's life (LowpModel keeps a pointer to its spec).
struct OwnedSpec {
  std::string name, recipe, description;
  LowpModelSpec spec;
};

// The head dims a declared recipe's blocks along D allow: whole blocks of the largest block
// size along D (MX 32, NVFP4 16), else multiples of 8, up to 256 as for the built-in rows.
int64_t HeadDimStep(const Recipe& r) {
  int64_t step = 8;
  for (const GemmQuant* g : {&r.qk, &r.pv, &r.dov, &r.pdo, &r.dsk, &r.dsq}) {
    for (const OperandQuant* o : {&g->a, &g->b}) {
      if (o->scheme.kind != OperandKind::kBlock || o->axis != QuantAxis::kHeadDim) continue;
      const std::string_view s = o->scheme.block;
      const int64_t size = o->scheme.block_options.block_size.value_or(
          s.starts_with("mx") ? 32 : s == "nvfp4" ? 16 : 0);
      step = std::max(step, size);
    }
  }
  return step;
}

// `recipe:<file>`: the tiled engine on a recipe declared as data (docs/protocol.md "Recipes"):
// the file holds the recipe object, or a capabilities object (a worker's describe reply's
// "capabilities") whose "recipe" is one. The same numerics a GPU kernel declaring that recipe
// is judged by, run on the CPU.
Expected<std::unique_ptr<Kernel>> RecipeModelFromFile(std::string_view path_view) {
  const std::string path(path_view);
  std::ifstream in(path);
  if (!in) return Error{"recipe:" + path + ": cannot open the file"};
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return Error{"recipe:" + path + ": not valid JSON"};
  std::string where = path;
  if (j.is_object() && j.contains("capabilities")) {
    j = j["capabilities"];
    where += ".capabilities";
  }
  if (j.is_object() && j.contains("recipe") && j["recipe"].is_object()) {
    j = j["recipe"];
    where += ".recipe";
  }
  Expected<Recipe> parsed = RecipeFromJson(j, where);
  if (!parsed.ok()) return parsed.error();
  Expected<const Recipe*> declared = DeclareRecipe(*parsed, where);
  if (!declared.ok()) return declared.error();
  const Recipe& r = **declared;
  static std::mutex mu;
  static std::deque<OwnedSpec> owned;
  const std::lock_guard<std::mutex> lock(mu);
  OwnedSpec& o = owned.emplace_back();
  o.name = "recipe:" + path;
  o.recipe = std::string(r.name);
  o.description = "CPU model of declared recipe " + o.recipe + ": " + std::string(r.description);
  o.spec = {o.name, o.recipe, o.description, Multiples(HeadDimStep(r)), true, true, {}, {}};
  return std::unique_ptr<Kernel>(std::make_unique<LowpModel>(o.spec));
}

}  // namespace

void RegisterLowpModels(KernelRegistry& registry) {
  for (const LowpModelSpec& spec : Specs()) {
    registry.Register(std::string(spec.name), std::string(spec.description),
                      [&spec](std::string_view) -> Expected<std::unique_ptr<Kernel>> {
                        return std::unique_ptr<Kernel>(std::make_unique<LowpModel>(spec));
                      });
  }
  registry.RegisterPrefix("recipe:", RecipeModelFromFile);
}

}  // namespace attest
