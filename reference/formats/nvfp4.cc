// NVFP4 quantization (see nvfp4.h): TransformerEngine core_nvfp4.cuh
// `compute_global_encode_scaling_factor_FP4`, `quantization_SF::compute_decoding_scaling_factor`,
// `compute_scaling_coefficient<float>`; torchao nvfp4_tensor.py `per_tensor_amax_to_scale`,
// `_nvfp4_quantize` (two-level branch). Float arithmetic stays in float, in source order.
#include "reference/formats/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "reference/formats/format.h"

namespace attest {
namespace {

constexpr float kFltMax = std::numeric_limits<float>::max();
constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3MinNormal = 0.015625f;  // torchao E4M3_EPS = finfo(e4m3fn).tiny = 2^-6

// e4m3 RNE with finite saturation (__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), the
// conversion behind static_cast<fp8e4m3>(float)); NaN -> 0x7F.
uint8_t E4M3SatFinite(float v) {
  EncodeOptions o;
  o.overflow = Overflow::kSaturate;
  o.nan = NanPolicy::kDropSign;
  return static_cast<uint8_t>(EncodeF32(v, Format::kE4M3FN, o).code);
}

float E4M3Value(uint8_t code) { return static_cast<float>(Decode(code, Format::kE4M3FN)); }

}  // namespace

Nvfp4TensorScale Nvfp4TensorScaleOf(float tensor_amax, Nvfp4Variant variant) {
  Nvfp4TensorScale s;
  if (variant == Nvfp4Variant::kTransformerEngine) {
    // fp8_max * fp4_max is the float constant 2688; Inf -> FLT_MAX; amax 0 or S_enc 0 -> 1.
    float enc = (kE4M3Max * kE2M1Max) / tensor_amax;
    enc = std::fmin(enc, kFltMax);
    if (tensor_amax == 0.0f || enc == 0.0f) enc = 1.0f;
    s.encode = enc;
    s.decode = 1.0f / enc;  // compute_scaling_coefficient: S_dec = 1.0f / S_enc
  } else {
    // amax.to(float32) / (F8E4M3_MAX * F4_E2M1_MAX): a tensor divided by 2688.
    s.decode = tensor_amax / (kE4M3Max * kE2M1Max);
    s.encode = 1.0f / s.decode;  // informational only: torchao divides by s.decode
  }
  return s;
}

Nvfp4BlockScale Nvfp4BlockScaleOf(float block_amax, const Nvfp4TensorScale& tensor,
                                  Nvfp4Variant variant) {
  Nvfp4BlockScale b;
  if (variant == Nvfp4Variant::kTransformerEngine) {
    // 1. s8 = fp8(block_amax * (S_enc * fp4_max_inv)), fp4_max_inv = 1.0f / 6.0f.
    constexpr float kFp4MaxInv = 1.0f / kE2M1Max;
    b.code = E4M3SatFinite(block_amax * (tensor.encode * kFp4MaxInv));
    // 2. Encode factor: fminf(1.0f / (float(s8) * S_dec), FLT_MAX) (s8 = 0 -> FLT_MAX).
    b.factor = std::fmin(1.0f / (E4M3Value(b.code) * tensor.decode), kFltMax);
  } else {
    // 1. block_scale = max_abs / F4_E2M1_MAX; / per_tensor_scale; clamp [2^-6, 448]; to e4m3.
    const float block_scale = block_amax / kE2M1Max;
    const float scaled = block_scale / tensor.decode;
    // torch.clamp propagates NaN (0/0 when the tensor amax is 0).
    const float clamped =
        std::isnan(scaled) ? scaled : std::clamp(scaled, kE4M3MinNormal, kE4M3Max);
    b.code = E4M3SatFinite(clamped);
    // 2. total_scale = per_tensor_scale * scaled_block_scales_fp32 (elements divide by it).
    b.factor = tensor.decode * E4M3Value(b.code);
  }
  return b;
}

namespace {
// PTX cvt.rn.satfinite.e2m1x2.f32: RNE, finite saturation, NaN -> +max.
const ElementCodec& E2M1() { return CodecFor(Format::kE2M1FN); }
}  // namespace

uint8_t Nvfp4ElementCode(float x, const Nvfp4BlockScale& block, Nvfp4Variant variant) {
  float v;
  if (variant == Nvfp4Variant::kTransformerEngine) {
    v = x * block.factor;
  } else {
    v = x / block.factor;
    if (!std::isnan(v)) v = std::clamp(v, -kE2M1Max, kE2M1Max);
  }
  return E2M1().Encode(v);
}

Expected<QuantizedTensor> QuantizeNvfp4(const Tensor& input, const Nvfp4Options& options) {
  if (options.block_size < 1) {
    return Error{"NVFP4 block size must be >= 1, got " + std::to_string(options.block_size)};
  }
  const Shape& shape = input.shape();
  auto axis = ResolveAxis(options.axis, static_cast<int64_t>(shape.size()), "NVFP4 block axis");
  if (!axis.ok()) return axis.error();

  QuantizedTensor out;
  out.scheme = "nvfp4";
  out.options.scheme = out.scheme;
  out.options.axis = options.axis;
  out.options.block_size = options.block_size;
  out.options.nvfp4_variant = options.variant;
  out.options.tensor_amax = options.tensor_amax;
  out.element = Format::kE2M1FN;
  out.scale_kind = ScaleKind::kE4M3;
  out.block = Shape(shape.size(), 1);
  out.block[static_cast<size_t>(*axis)] = options.block_size;

  // 1. fp32 values, block amax and tensor amax (fmaxf: NaN skipped, as TE's amax kernel).
  const std::vector<float> x = ToF32Values(input);
  const BlockAmax amax = ComputeBlockAmax(x, shape, out.block);
  float tensor_amax = 0.0f;
  if (options.tensor_amax) {
    tensor_amax = *options.tensor_amax;
  } else {
    for (float a : amax.amax) tensor_amax = std::fmax(tensor_amax, a);
  }
  const Nvfp4TensorScale tensor = Nvfp4TensorScaleOf(tensor_amax, options.variant);
  out.tensor_scale = Tensor::Zeros(DType::kF32, {1});
  out.tensor_scale.data<float>()[0] = tensor.decode;

  // 2. Block scales.
  out.scales = Tensor::Zeros(DType::kE4M3FN, BlockGridShape(shape, out.block));
  const std::span<uint8_t> scales = out.scales.span<uint8_t>();
  std::vector<Nvfp4BlockScale> blocks(scales.size());
  for (size_t b = 0; b < scales.size(); ++b) {
    blocks[b] = Nvfp4BlockScaleOf(amax.amax[b], tensor, options.variant);
    scales[b] = blocks[b].code;
  }

  std::vector<double> block_value(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b)
    block_value[b] = Decode(blocks[b].code, Format::kE4M3FN);

  // 3. Elements and the exact dequantisation q * s8 * tensor_scale.
  out.codes = Tensor::Zeros(DType::kU8, shape);
  out.dequant = Tensor::Zeros(DType::kF64, shape);
  uint8_t* codes = out.codes.data<uint8_t>();
  double* dequant = out.dequant.data<double>();
  const double decode = tensor.decode;
  ForEachElementBlock(shape, out.block, [&](int64_t e, int64_t b) {
    const auto ei = static_cast<size_t>(e);
    const Nvfp4BlockScale& block = blocks[static_cast<size_t>(b)];
    const uint8_t code = Nvfp4ElementCode(x[ei], block, options.variant);
    codes[ei] = code;
    // Exact: q has 2 significant bits, s8 4, decode 24.
    dequant[ei] = E2M1().Decode(code) * block_value[static_cast<size_t>(b)] * decode;
  });
  return out;
}

}  // namespace attest
