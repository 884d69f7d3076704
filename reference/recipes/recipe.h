// Low-precision attention recipes as data (docs/design.md "Formats and recipes"): for each GEMM of
// forward (Q·Kᵀ, P·V) and backward (dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q) how each operand is represented
// before the product, where P and dS are rounded, which O and which dO the backward's
// D = rowsum(dO∘O) reads, and the accumulation / output formats. A new recipe is a new row of
// AllRecipes(). The tiled engine that interprets a recipe is kernels/models/flash_engine.h;
// docs/kernels.md has the table.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "reference/formats/format.h"
#include "reference/formats/quantize.h"
#include "reference/status.h"

namespace attest {

// Which axis the blocks of a block scheme run along. kSequence blocks span positions (keys or
// queries), so one scale is shared across a causal diagonal or a document boundary: that is
// where leakage through shared scales happens, and why such operands are quantised over the
// whole tensor up front, never per tile (see QuantizeOperand).
enum class QuantAxis : uint8_t { kHeadDim, kSequence };
std::string_view Name(QuantAxis axis);  // "head_dim", "sequence"

enum class OperandKind : uint8_t {
  kNone,     // the operand is used as it is (already in the input dtype, or fp32)
  kElement,  // every element rounded to `element` (after multiplying by pre_scale)
  kBlock,    // a block scheme of reference/formats/quantize.h (`block` names its row)
};

// How one operand is represented before a product.
struct OperandScheme {
  OperandKind kind = OperandKind::kNone;
  // kElement: x -> Decode(Encode(x * pre_scale, element)) / pre_scale. pre_scale is a power of
  // two, so the scaling is exact (cuDNN's fp8 reference: P × 16 → e4m3fn → ÷ 16... see docs).
  Format element = Format::kF32;
  double pre_scale = 1.0;
  Overflow overflow = Overflow::kDefault;
  // The rounding direction of kElement (and of output roundings): round-to-nearest-even,
  // or a directed rounding a recipe declares where its kernel rounds so (a truncating
  // conversion, __float2bfloat16_rz). Stochastic rounding is not a recipe's choice here
  // (ValidateRecipe refuses it): its bits would have to be declared too.
  Rounding rounding = Rounding::kNearestEven;
  // kBlock: a scheme name from AllSchemes() ("mxfp8-e4m3", "nvfp4", "fp8-tensor-e4m3",
  // "fp8-block-e4m3") and its options (scale mode etc.; `scheme` and `axis` are set by the
  // engine from `block` and the operand's QuantAxis).
  std::string_view block;
  SchemeOptions block_options;
  // kBlock schemes with a tensor-level scale (NVFP4's fp32 second-level scale, fp8-tensor's
  // current scale): computed per vector along the blocked axis (one per token and head)
  // instead of once over the whole operand. A tensor-wide amax spans every position, so a
  // future key or another document's token moves it (docs/references.md "Which products can
  // leak": per-tensor current scaling leaks); a per-vector amax never spans two positions.
  // Requires the blocked axis to be the innermost (the head dim of [B, S, H, D] / [T, H, D]).
  bool per_vector_tensor_scale = false;
};

struct OperandQuant {
  OperandScheme scheme;
  QuantAxis axis = QuantAxis::kHeadDim;
};

// The two operands of one GEMM C = A · B, named as the product is written (for Q·Kᵀ, a = Q and
// b = K; for dS·K, a = dS and b = K).
struct GemmQuant {
  OperandQuant a;
  OperandQuant b;
};

// Which O the backward reads to form D = rowsum(dO∘O).
enum class DeltaSource : uint8_t {
  kRoundedO,  // the forward's output in its output dtype (FlashAttention: flash_bwd_preprocess)
  kFp32O,     // the fp32 accumulator before the final rounding (kernels that keep it)
};

// Which dO the backward reads to form D = rowsum(dO∘O).
enum class DeltaDo : uint8_t {
  kInput,       // dO as the problem gives it (FlashAttention: flash_bwd_preprocess)
  // dO' = dO as gemm dov.a represents it (the dO of dP = dO·Vᵀ), D = rowsum(dO'∘O): a kernel
  // that receives dO only quantised, as cuDNN's FP8 SDPA backward forms D from its FP8 dO
  // (cudnn-frontend test/python/sdpa/fp8_ref.py compute_ref_backward).
  kDovOperand,
};

struct Recipe {
  std::string_view name;
  std::string_view description;
  // Forward. pv.a is the rounding of P before P·V (P unnormalised, as FA2 rounds it).
  GemmQuant qk;
  GemmQuant pv;
  // Backward. pdo.a is the rounding of P before dV += Pᵀ·dO; dsk.a the rounding of dS before
  // dQ += dS·K; dsq.a the rounding of dS before dK += dSᵀ·Q (may differ from dsk.a, e.g. a
  // block scheme along the other axis).
  GemmQuant dov;
  GemmQuant pdo;
  GemmQuant dsk;
  GemmQuant dsq;
  DeltaSource delta = DeltaSource::kRoundedO;
  DeltaDo delta_do = DeltaDo::kInput;
  Format accumulate = Format::kF32;  // every GEMM and the softmax statistics
  std::optional<Format> output;      // o; nullopt: the problem's input dtype
  Format lse = Format::kF32;
  std::optional<Format> gradients;  // dq, dk, dv; nullopt: the input dtype
  // Power-of-two scales of the output roundings: o is written as Encode(o * output_scale) and
  // read back divided by it, dq, dk, dv likewise with gradient_scales[0..2] (cuDNN's FP8 SDPA
  // writes O and dQ, dK, dV as E4M3 of scale_o * x, scale_dQ * x, ...: cudnn-frontend
  // docs/operations/Attention.md, sdpa_fp8 / sdpa_fp8_backward). A scale other than 1
  // saturates at the format's largest finite value (PTX cvt .satfinite); 1 is the format's
  // plain rounding. OutputRounding() gives the scheme each output goes through.
  double output_scale = 1.0;
  std::array<double, 3> gradient_scales{1.0, 1.0, 1.0};  // dq, dk, dv
  // The rounding direction of o's and of dq, dk, dv's final rounding (OutputRoundingOf,
  // GradientRoundingOf): nearest-even, or the directed rounding a kernel performs by design
  // and declares (the bias check, verify/checks/bias.h, then expects the bias it implies).
  // With GQA the kernel's stores are its per-head dk, dv; their group sum is the framework's
  // (flash_api.cpp mha_bwd: at::sum_out) and rounds to nearest.
  Rounding output_rounding = Rounding::kNearestEven;
  Rounding gradient_rounding = Rounding::kNearestEven;
  std::vector<DType> input_dtypes;  // problem dtypes the recipe is defined for
  // Backward: dP = dO·Vᵀ rounded to this format before dP − D (a GEMM with a low-precision
  // output, e.g. an fp16-output WMMA); nullopt: dP stays in `accumulate` (FlashAttention).
  // A rounding point like the others: the consistency check's bounds include it.
  std::optional<Format> dp;
};

// How an output is rounded: an element scheme of `format` at power-of-two pre-scale `scale`
// (kDefault overflow at scale 1, else kSaturate) in direction `rounding`. RoundElement(x,
// OutputRounding(f, 1)) is RoundElement(x, f).
OperandScheme OutputRounding(Format format, double scale,
                             Rounding rounding = Rounding::kNearestEven);
// Whether some rounding of the recipe is directed (not nearest-even): its outputs then carry a
// bias the recipe implies (verify/checks/bias.h).
bool HasDirectedRounding(const Recipe& recipe);
// The roundings of o and of dq, dk, dv (index 0, 1, 2) under recipe r for inputs of `input`.
OperandScheme OutputRoundingOf(const Recipe& r, Format input);
OperandScheme GradientRoundingOf(const Recipe& r, Format input, int which);

// Every named recipe, in a fixed order.
std::span<const Recipe> AllRecipes();
// Built-in rows first, then recipes kernels declared (recipe_json.h DeclareRecipe).
const Recipe* FindRecipe(std::string_view name);
// A declared recipe by name (nullptr when none); recipe_json.cc holds them.
const Recipe* FindDeclaredRecipe(std::string_view name);

// Checks that every operand of the recipe names something that exists (block schemes in
// quantize.h's registry, power-of-two pre-scales); the Error names the recipe and GEMM.
Status ValidateRecipe(const Recipe& recipe);
// True when no operand uses a block scheme (the engine then needs no Quantize() call).
bool ElementOnly(const Recipe& recipe);
// True when some operand's scale is computed from values at more than one position: a block
// scheme blocked along the sequence, or a tensor-level scale (NVFP4's fp32 scale, FP8
// current scaling, an FP8 2-D block spanning rows) that is neither per vector nor static
// (a given tensor_amax). Such a recipe leaks across causal / document boundaries by
// construction (docs/references.md "Which products can leak"); a recipe for which this is false
// never does, so non-interference must hold bitwise on it.
bool SharesScalesAcrossPositions(const Recipe& recipe);

// The hook every operand goes through. `values` is a row-major tensor of `shape`; `axis` is
// the dimension the scheme's blocks run along (the operand's QuantAxis already resolved to
// an index by the caller). kNone returns the values unchanged; kElement rounds elementwise;
// kBlock calls Quantize() and returns its dequantised values (as fp32: every dequantised
// block value of these schemes is an fp32 value). Errors name the scheme.
Expected<std::vector<float>> QuantizeOperand(std::span<const float> values, const Shape& shape,
                                             int64_t axis, const OperandScheme& scheme);

// Fast elementwise rounding of fp32 values to bf16 / f16 (RNE, IEEE overflow to Inf, as
// __float2bfloat16_rn / __float2half_rn), identical to RoundTo(x, f) for every float x;
// other formats go through RoundTo. Used in the engine's inner loops.
float RoundElement(float x, Format f);
float RoundElement(float x, const OperandScheme& scheme);

}  // namespace attest
