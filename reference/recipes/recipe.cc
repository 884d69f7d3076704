// The recipe table and the operand quantisation hook (see recipe.h; docs/design.md "Formats and
// recipes"). Rows follow FlashAttention-2's rounding points (csrc/flash_attn/src/
// flash_fwd_kernel.h: P converted to the input type before P·V; flash_bwd_kernel.h: P and dS
// converted before their GEMMs, fp32 accumulators, dot_do_o on the stored O).
#include "reference/recipes/recipe.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

namespace attest {
namespace {

// An operand used as it is / rounded elementwise to `f`.
constexpr OperandQuant AsIs() { return {}; }
OperandQuant Rounded(Format f) {
  OperandQuant q;
  q.scheme.kind = OperandKind::kElement;
  q.scheme.element = f;
  return q;
}

// An operand rounded elementwise to `f` after multiplying by the power of two `pre_scale`
// (and divided by it after): cuDNN's fixed-scale FP8 P (mxfp8_ref.py: ×16 forward, ×256
// backward) and FlashAttention-3's Max_offset = 8 (hopper/softmax.h: P in [0, 256]).
OperandQuant Scaled(Format f, double pre_scale) {
  OperandQuant q = Rounded(f);
  q.scheme.pre_scale = pre_scale;
  return q;
}

// MXFP8 E4M3 in 32-blocks along `axis`, with cuDNN's scale rule: e8m0_ceil(amax · fl(1/448))
// (RCEIL; mxfp8_ref.py _quantize_ds_tiles and quantize_blocks of mxfp8_quant.py).
OperandQuant Mxfp8(QuantAxis axis) {
  OperandQuant q;
  q.scheme.kind = OperandKind::kBlock;
  q.scheme.block = "mxfp8-e4m3";
  q.scheme.block_options.scale_mode = ScaleMode::kRceil;
  q.axis = axis;
  return q;
}

// NVFP4 (E2M1 in 16-blocks along the head dim, E4M3 block scales, an fp32 tensor scale from
// the whole tensor's amax; TransformerEngine arithmetic).
OperandQuant Nvfp4HeadDim() {
  OperandQuant q;
  q.scheme.kind = OperandKind::kBlock;
  q.scheme.block = "nvfp4";
  q.axis = QuantAxis::kHeadDim;
  return q;
}

// NVFP4 as above, but with the fp32 second-level scale per token and head (448·6 / amax of
// that row's D values) instead of per tensor: the same two-level arithmetic, and no scale
// spans two positions.
OperandQuant Nvfp4HeadDimPerToken() {
  OperandQuant q = Nvfp4HeadDim();
  q.scheme.per_vector_tensor_scale = true;
  return q;
}

// FP8 E4M3 with a current-scaling fp32 scale (448 / amax, TransformerEngine
// Float8CurrentScaling arithmetic) per token and head: the layout of a per-token-head FP8 KV
// cache, dequantised before its product. Leak-free: the amax covers one position only.
OperandQuant Fp8PerToken() {
  OperandQuant q;
  q.scheme.kind = OperandKind::kBlock;
  q.scheme.block = "fp8-tensor-e4m3";
  q.scheme.block_options.pow2_scale = false;
  q.scheme.per_vector_tensor_scale = true;
  q.axis = QuantAxis::kHeadDim;
  return q;
}

// FP8 E4M3 with a static (calibrated) descale: the data never sets the scale. FlashAttention-3
// takes q/k/v descales from the caller (hopper/flash_attn_interface.py q_descale, k_descale,
// v_descale); vLLM passes its calibrated KV-cache scales, and 1.0 when none were calibrated
// (docs/features/quantization/quantized_kvcache.md, "No calibration (default scales)"). Here
// that default: tensor_amax = 448 gives scale 448 / 448 = 1, a saturating E4M3 cast.
OperandQuant Fp8Static() {
  OperandQuant q;
  q.scheme.kind = OperandKind::kBlock;
  q.scheme.block = "fp8-tensor-e4m3";
  q.scheme.block_options.pow2_scale = false;
  q.scheme.block_options.tensor_amax = 448.0f;
  q.axis = QuantAxis::kSequence;  // one scale for the tensor; static, so nothing leaks
  return q;
}

// FlashAttention-2 in one input dtype: q, k, v, dO used as stored; P rounded to the input
// dtype before P·V and before Pᵀ·dO; dS rounded once, the same rounding feeding dS·K and
// dSᵀ·Q; D from the stored (rounded) O; fp32 accumulation everywhere.
Recipe Flash2Recipe(std::string_view name, std::string_view description, Format f, DType d) {
  Recipe r;
  r.name = name;
  r.description = description;
  r.qk = {AsIs(), AsIs()};
  r.pv = {Rounded(f), AsIs()};
  r.dov = {AsIs(), AsIs()};
  r.pdo = {Rounded(f), AsIs()};
  r.dsk = {Rounded(f), AsIs()};
  r.dsq = {Rounded(f), AsIs()};
  r.delta = DeltaSource::kRoundedO;
  r.input_dtypes = {d};
  return r;
}

// A reduced-precision input upcast to fp32 for the whole computation, outputs rounded once:
// q, k, v, dO as stored (exact in fp32); P and dS fp32 before their GEMMs; D from the fp32 O;
// o and the gradients rounded to the input dtype at the end (a GQA group's dK, dV summed in
// fp32 before that rounding). PyTorch's SDPA math backend computes this way unless
// torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True) is set (torch/backends/cuda/
// __init__.py; aten/src/ATen/native/transformers/attention.cpp
// _scaled_dot_product_attention_math); tools/workers/torch_probe.py checks it bit for bit.
Recipe UpcastRecipe(std::string_view name, std::string_view description, Format f, DType d) {
  Recipe r;
  r.name = name;
  r.description = description;
  r.qk = {AsIs(), AsIs()};
  r.pv = {Rounded(Format::kF32), AsIs()};
  r.dov = {AsIs(), AsIs()};
  r.pdo = {Rounded(Format::kF32), AsIs()};
  r.dsk = {Rounded(Format::kF32), AsIs()};
  r.dsq = {Rounded(Format::kF32), AsIs()};
  r.delta = DeltaSource::kFp32O;
  r.output = f;
  r.gradients = f;
  r.input_dtypes = {d};
  return r;
}

// cuDNN's MXFP8 SDPA (cudnn-frontend test/python/sdpa/mxfp8_ref.py compute_ref and
// compute_ref_backward, quantize_ds=True): Q, K E4M3 with E8M0 scales along D for Q·Kᵀ; V
// scaled along S_kv (one copy, used by P·V and by dO·Vᵀ); P ×16 → E4M3 → ÷16 before P·V;
// backward: dO along D for dO·Vᵀ, column-wise (sequence-blocked) copies of dO, K and Q for
// Pᵀ·dO, dS·K and dSᵀ·Q; P ×256 → E4M3 → ÷256 for dV; dS quantised twice, 1×32 along S_kv
// for dQ and along S_q for dK; D from the bf16 O and dO; bf16 outputs.
Recipe Mxfp8CudnnRecipe() {
  Recipe r;
  r.name = "mxfp8-cudnn";
  r.description =
      "cuDNN MXFP8 SDPA reference: Q, K MXFP8 (E4M3, E8M0 RCEIL scales per 32 along D), V "
      "MXFP8 along S_kv, P x16 -> E4M3 for P.V; backward dO along D for dO.V^T, dO/K/Q copies "
      "along the sequence, P x256 -> E4M3 for dV, dS MXFP8 along S_kv (dQ) and S_q (dK); D "
      "from bf16 O, dO; bf16 outputs. Sequence-axis scales leak across causal/document "
      "boundaries by construction";
  r.qk = {Mxfp8(QuantAxis::kHeadDim), Mxfp8(QuantAxis::kHeadDim)};
  r.pv = {Scaled(Format::kE4M3FN, 16), Mxfp8(QuantAxis::kSequence)};
  r.dov = {Mxfp8(QuantAxis::kHeadDim), Mxfp8(QuantAxis::kSequence)};
  r.pdo = {Scaled(Format::kE4M3FN, 256), Mxfp8(QuantAxis::kSequence)};
  r.dsk = {Mxfp8(QuantAxis::kSequence), Mxfp8(QuantAxis::kSequence)};
  r.dsq = {Mxfp8(QuantAxis::kSequence), Mxfp8(QuantAxis::kSequence)};
  r.delta = DeltaSource::kRoundedO;
  r.output = Format::kBF16;
  r.gradients = Format::kBF16;
  r.input_dtypes = {DType::kBF16};
  return r;
}

// The leak-free MXFP8 variant (cudnn-frontend test/python/sdpa/frost/
// test_benchmark_mxfp8_qk_bf16_pv.py names it "mxfp8 qk, bf16 pv"): MXFP8 only where the
// product contracts over the head dim (Q·Kᵀ, dO·Vᵀ, every operand blocked along D); P·V,
// Pᵀ·dO, dS·K and dSᵀ·Q keep FlashAttention-2's bf16 rounding of P and dS and bf16 operands,
// so no scale spans two positions.
Recipe Mxfp8PvBf16Recipe() {
  Recipe r = Flash2Recipe("mxfp8-pvbf16",
                          "MXFP8 (E4M3, E8M0 RCEIL per 32 along D) for Q.K^T and dO.V^T only; "
                          "P.V, P^T.dO, dS.K, dS^T.Q in bf16 (P, dS rounded to bf16); no scale "
                          "spans two positions, so nothing leaks across masks",
                          Format::kBF16, DType::kBF16);
  r.qk = {Mxfp8(QuantAxis::kHeadDim), Mxfp8(QuantAxis::kHeadDim)};
  r.dov = {Mxfp8(QuantAxis::kHeadDim), Mxfp8(QuantAxis::kHeadDim)};
  r.output = Format::kBF16;
  r.gradients = Format::kBF16;
  return r;
}

// NVFP4 Q and K with FP8 V and P (attest's own mixed recipe; docs/kernels.md says why each
// choice), leak-free by construction: every scale covers one position. Q, K: NVFP4 along D
// (E2M1, E4M3 scale per 16) with a per-token fp32 second-level scale; V: FP8 E4M3 with a
// per-token-head current scale (an FP8 KV cache's layout); P: ×16 → E4M3 as cuDNN's.
// TransformerEngine's tensor-wide amaxes would span the sequence and leak (docs/references.md;
// mutant/v-tensor-current-scale keeps that form). Backward (straight-through, Attn-QAT arXiv
// 2603.00040 §3: differentiate at the forward's quantised operands): dP = dO·V_qᵀ,
// dV = P_qᵀ·dO with the forward's P rounding, dQ = bf16(dS)·K_q, dK = bf16(dS)ᵀ·Q_q; dO
// stays bf16.
Recipe Nvfp4MixedRecipe() {
  Recipe r;
  r.name = "nvfp4-mixed";
  r.description =
      "NVFP4 Q, K (E2M1, E4M3 scale per 16 along D, fp32 scale per token), FP8 E4M3 V with a "
      "per-token-head current scale, P x16 -> E4M3; backward at the forward's quantised "
      "operands (dO bf16, dS bf16, P as forward); bf16 outputs. No scale spans two positions, "
      "so nothing leaks across causal/document boundaries";
  r.qk = {Nvfp4HeadDimPerToken(), Nvfp4HeadDimPerToken()};
  r.pv = {Scaled(Format::kE4M3FN, 16), Fp8PerToken()};
  r.dov = {AsIs(), Fp8PerToken()};
  r.pdo = {Scaled(Format::kE4M3FN, 16), AsIs()};
  r.dsk = {Rounded(Format::kBF16), Nvfp4HeadDimPerToken()};
  r.dsq = {Rounded(Format::kBF16), Nvfp4HeadDimPerToken()};
  r.delta = DeltaSource::kRoundedO;
  r.output = Format::kBF16;
  r.gradients = Format::kBF16;
  r.input_dtypes = {DType::kBF16};
  return r;
}

// FlashAttention-3's FP8 forward (hopper/) as vLLM runs it: Q, K, V in E4M3 with static fp32
// descales from the caller (flash_attn_interface.py q_descale/k_descale/v_descale, shape
// (batch, num_heads_k): flash_api.cpp CHECK_SHAPE), here vLLM's uncalibrated default 1.0 for
// every (batch, head); P scaled by 2^8 before its E4M3 conversion (softmax.h Max_offset = 8
// for FP8, "the value after exp2 is in the range of [0, 256]"); bf16 output. Forward only:
// FA3 has no FP8 backward, and the backward GEMMs here are unset. Current scaling (a
// descale from the amax of the (batch, head) slice) would span the sequence and leak:
// mutant/fp8-current-descale keeps that form.
Recipe Fp8E4m3TensorRecipe() {
  Recipe r;
  r.name = "fp8-e4m3-tensor";
  r.description =
      "FlashAttention-3 FP8 forward: Q, K, V E4M3 with static fp32 descales (vLLM's "
      "uncalibrated default 1.0: a saturating cast), P x256 -> E4M3 (Max_offset 8), bf16 "
      "output; forward only (no FP8 backward). Static scales do not depend on the data, so "
      "nothing leaks";
  r.qk = {Fp8Static(), Fp8Static()};
  r.pv = {Scaled(Format::kE4M3FN, 256), Fp8Static()};
  r.delta = DeltaSource::kRoundedO;
  r.output = Format::kBF16;
  r.gradients = Format::kBF16;
  r.input_dtypes = {DType::kBF16};
  return r;
}

const std::vector<Recipe>& Table() {
  static const std::vector<Recipe> table = {
      Flash2Recipe("bf16",
                   "bf16 inputs; P and dS rounded to bf16 before their GEMMs; fp32 "
                   "accumulation and softmax statistics (FlashAttention-2)",
                   Format::kBF16, DType::kBF16),
      Flash2Recipe("f16",
                   "f16 inputs; P and dS rounded to f16 before their GEMMs; fp32 "
                   "accumulation and softmax statistics (FlashAttention-2)",
                   Format::kF16, DType::kF16),
      UpcastRecipe("bf16-upcast",
                   "bf16 inputs upcast to fp32: P, dS and D in fp32, o and gradients rounded "
                   "once to bf16 (PyTorch's SDPA math backend)",
                   Format::kBF16, DType::kBF16),
      UpcastRecipe("f16-upcast",
                   "f16 inputs upcast to fp32: P, dS and D in fp32, o and gradients rounded "
                   "once to f16 (PyTorch's SDPA math backend)",
                   Format::kF16, DType::kF16),
      // Low-precision rows (kernels/models/lowp_models.h runs them).
      Mxfp8CudnnRecipe(),
      Mxfp8PvBf16Recipe(),
      Nvfp4MixedRecipe(),
      Fp8E4m3TensorRecipe(),
  };
  return table;
}

bool IsPowerOfTwo(double x) {
  if (!(x > 0) || !std::isfinite(x)) return false;
  int e = 0;
  return std::frexp(x, &e) == 0.5;
}

Status ValidateOperand(const Recipe& r, std::string_view gemm, std::string_view side,
                       const OperandQuant& q) {
  const std::string where =
      "recipe " + std::string(r.name) + ", " + std::string(gemm) + "." + std::string(side);
  switch (q.scheme.kind) {
    case OperandKind::kNone:
      return Status::Ok();
    case OperandKind::kElement:
      if (!IsPowerOfTwo(q.scheme.pre_scale)) {
        return Error{where + ": pre_scale " + std::to_string(q.scheme.pre_scale) +
                     " is not a power of two (the scaling must be exact)"};
      }
      return Status::Ok();
    case OperandKind::kBlock:
      if (FindScheme(q.scheme.block) == nullptr) {
        return Error{where + ": unknown block scheme '" + std::string(q.scheme.block) + "'"};
      }
      return Status::Ok();
  }
  return Error{where + ": unknown operand kind"};
}

}  // namespace

std::string_view Name(QuantAxis axis) {
  return axis == QuantAxis::kHeadDim ? "head_dim" : "sequence";
}

std::span<const Recipe> AllRecipes() { return Table(); }

const Recipe* FindRecipe(std::string_view name) {
  for (const Recipe& r : Table()) {
    if (r.name == name) return &r;
  }
  return FindDeclaredRecipe(name);
}

Status ValidateRecipe(const Recipe& r) {
  const std::pair<std::string_view, const GemmQuant*> gemms[] = {{"qk", &r.qk},   {"pv", &r.pv},
                                                                 {"dov", &r.dov}, {"pdo", &r.pdo},
                                                                 {"dsk", &r.dsk}, {"dsq", &r.dsq}};
  for (const auto& [name, g] : gemms) {
    if (Status s = ValidateOperand(r, name, "a", g->a); !s) return s;
    if (Status s = ValidateOperand(r, name, "b", g->b); !s) return s;
    for (const auto& [side, q] : {std::pair{"a", &g->a}, std::pair{"b", &g->b}}) {
      if (q->scheme.rounding == Rounding::kStochastic) {
        return Error{fmt::format("recipe {}: {}.{}: stochastic rounding is not a recipe's "
                                 "rounding (rne, rz, ru, rd, rna)", r.name, name, side)};
      }
    }
  }
  if (r.output_rounding == Rounding::kStochastic ||
      r.gradient_rounding == Rounding::kStochastic) {
    return Error{fmt::format("recipe {}: stochastic rounding is not a recipe's output rounding "
                             "(rne, rz, ru, rd, rna)", r.name)};
  }
  if (r.accumulate != Format::kF32) {
    return Error{"recipe " + std::string(r.name) +
                 ": only fp32 accumulation is modelled (accumulate = " +
                 std::string(Name(r.accumulate)) + ")"};
  }
  const auto pow2 = [](double s) {
    int e = 0;
    return std::isfinite(s) && s > 0 && std::frexp(s, &e) == 0.5;
  };
  if (!pow2(r.output_scale)) {
    return Error{fmt::format("recipe {}: output_scale {} is not a positive power of two", r.name,
                             r.output_scale)};
  }
  for (int i = 0; i < 3; ++i) {
    if (!pow2(r.gradient_scales[static_cast<size_t>(i)])) {
      return Error{fmt::format("recipe {}: gradient_scales[{}] ({}) {} is not a positive power "
                               "of two",
                               r.name, i, i == 0 ? "dq" : i == 1 ? "dk" : "dv",
                               r.gradient_scales[static_cast<size_t>(i)])};
    }
  }
  return Status::Ok();
}

OperandScheme OutputRounding(Format format, double scale, Rounding rounding) {
  OperandScheme s;
  s.kind = OperandKind::kElement;
  s.element = format;
  s.pre_scale = scale;
  s.overflow = scale == 1.0 ? Overflow::kDefault : Overflow::kSaturate;
  s.rounding = rounding;
  return s;
}

OperandScheme OutputRoundingOf(const Recipe& r, Format input) {
  return OutputRounding(r.output.value_or(input), r.output_scale, r.output_rounding);
}

OperandScheme GradientRoundingOf(const Recipe& r, Format input, int which) {
  return OutputRounding(r.gradients.value_or(input),
                        r.gradient_scales[static_cast<size_t>(which)], r.gradient_rounding);
}

bool HasDirectedRounding(const Recipe& r) {
  if (r.output_rounding != Rounding::kNearestEven) return true;
  if (r.gradient_rounding != Rounding::kNearestEven) return true;
  for (const GemmQuant* g : {&r.qk, &r.pv, &r.dov, &r.pdo, &r.dsk, &r.dsq}) {
    for (const OperandQuant* q : {&g->a, &g->b}) {
      if (q->scheme.rounding != Rounding::kNearestEven) return true;
    }
  }
  return false;
}

namespace {

bool OperandSharesScales(const OperandQuant& q) {
  if (q.scheme.kind != OperandKind::kBlock) return false;  // elementwise: one value, one scale
  const Scheme* scheme = FindScheme(q.scheme.block);
  if (scheme == nullptr) return true;  // unknown: assume the worst (ValidateRecipe names it)
  const bool static_scale = q.scheme.block_options.tensor_amax.has_value();
  switch (scheme->kind) {
    case SchemeKind::kMx:
      // E8M0 blocks: along the head dim they stay inside one position.
      return q.axis == QuantAxis::kSequence;
    case SchemeKind::kNvfp4:
      // E4M3 blocks as MX, plus the fp32 second-level scale from the tensor's amax.
      return q.axis == QuantAxis::kSequence ||
             !(static_scale || q.scheme.per_vector_tensor_scale);
    case SchemeKind::kFp8Tensor:
      // One scale: static, per vector along the head dim, or spanning every position.
      return !(static_scale ||
               (q.scheme.per_vector_tensor_scale && q.axis == QuantAxis::kHeadDim));
    case SchemeKind::kFp8Block: {
      // 2-D blocks: rows along row_axis (the sequence for the engine's operands).
      const int64_t rows = q.scheme.block_options.block_rows.value_or(scheme->block_rows);
      return q.axis == QuantAxis::kSequence || rows > 1;
    }
  }
  return true;
}

}  // namespace

bool SharesScalesAcrossPositions(const Recipe& r) {
  for (const GemmQuant* g : {&r.qk, &r.pv, &r.dov, &r.pdo, &r.dsk, &r.dsq}) {
    if (OperandSharesScales(g->a) || OperandSharesScales(g->b)) return true;
  }
  return false;
}

bool ElementOnly(const Recipe& r) {
  for (const GemmQuant* g : {&r.qk, &r.pv, &r.dov, &r.pdo, &r.dsk, &r.dsq}) {
    if (g->a.scheme.kind == OperandKind::kBlock || g->b.scheme.kind == OperandKind::kBlock) {
      return false;
    }
  }
  return true;
}

float RoundElement(float x, Format f) {
  if (f == Format::kF32) return x;
  if (std::isnan(x)) return x;
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (f == Format::kBF16) {
    // RNE to 8 significant bits: add half an ulp minus one, plus the kept lsb (ties to
    // even); carries into the exponent are the correct result, up to Inf.
    u += 0x7FFFu + ((u >> 16) & 1u);
    return std::bit_cast<float>(u & 0xFFFF0000u);
  }
  if (f == Format::kF16) {
    const float a = std::fabs(x);
    // 65520 = 65504 + half an ulp: the tie rounds to the even neighbour 2^16, i.e. Inf.
    if (a >= 65520.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
    if (a >= 0x1p-14f) {  // f16 normal: keep 11 significant bits (drop 13 of fp32's 24)
      u += 0x0FFFu + ((u >> 13) & 1u);
      return std::bit_cast<float>(u & 0xFFFFE000u);
    }
    // f16 subnormal: multiples of 2^-24; x·2^24 is exact and nearbyint rounds to even.
    return std::copysign(std::nearbyint(a * 0x1p24f) * 0x1p-24f, x);
  }
  return static_cast<float>(RoundTo(static_cast<double>(x), f));
}

float RoundElement(float x, const OperandScheme& scheme) {
  if (scheme.kind != OperandKind::kElement) return x;
  if (scheme.pre_scale == 1.0 && scheme.overflow == Overflow::kDefault &&
      scheme.rounding == Rounding::kNearestEven) {
    return RoundElement(x, scheme.element);
  }
  EncodeOptions options;
  options.overflow = scheme.overflow;
  options.rounding = scheme.rounding;
  const double s = scheme.pre_scale;
  return static_cast<float>(RoundTo(static_cast<double>(x) * s, scheme.element, options) / s);
}

Expected<std::vector<float>> QuantizeOperand(std::span<const float> values, const Shape& shape,
                                             int64_t axis, const OperandScheme& scheme) {
  std::vector<float> out(values.begin(), values.end());
  switch (scheme.kind) {
    case OperandKind::kNone:
      return out;
    case OperandKind::kElement:
      for (float& x : out) x = RoundElement(x, scheme);
      return out;
    case OperandKind::kBlock:
      break;
  }
  SchemeOptions options = scheme.block_options;
  options.scheme = std::string(scheme.block);
  if (scheme.per_vector_tensor_scale) {
    // One Quantize() per innermost vector: each gets its own tensor amax (and so its own
    // NVFP4 fp32 scale or FP8 current scale); blocks along that axis stay inside the vector.
    if (shape.empty() || axis != static_cast<int64_t>(shape.size()) - 1) {
      return Error{"block scheme " + std::string(scheme.block) +
                   ": a per-vector tensor scale needs the blocked axis innermost (axis " +
                   std::to_string(axis) + " of a rank-" + std::to_string(shape.size()) +
                   " operand)"};
    }
    const int64_t n = shape.back();
    options.axis = 1;
    std::vector<double> vec(static_cast<size_t>(n));
    for (size_t start = 0; n > 0 && start < out.size(); start += static_cast<size_t>(n)) {
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(start), n, vec.begin());
      Expected<QuantizedTensor> q = Quantize(Tensor::FromF64({1, n}, vec), options);
      if (!q.ok()) {
        return Error{"block scheme " + std::string(scheme.block) + ": " + q.error().message};
      }
      const Tensor dequant = q->dequant.contiguous() ? q->dequant : q->dequant.Clone();
      std::span<const double> d = dequant.span<const double>();
      for (int64_t i = 0; i < n; ++i) out[start + static_cast<size_t>(i)] = static_cast<float>(d[i]);
    }
    return out;
  }
  // Block schemes: the whole operand at once, so that blocks along the sequence cover the
  // same positions as in a kernel that quantises the operand up front.
  std::vector<double> wide(values.begin(), values.end());
  const Tensor input = Tensor::FromF64(shape, std::move(wide));
  options.axis = axis;
  Expected<QuantizedTensor> q = Quantize(input, options);
  if (!q.ok()) {
    return Error{"block scheme " + std::string(scheme.block) + ": " + q.error().message};
  }
  const Tensor dequant = q->dequant.contiguous() ? q->dequant : q->dequant.Clone();
  std::span<const double> d = dequant.span<const double>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(d[i]);
  return out;
}

}  // namespace attest
