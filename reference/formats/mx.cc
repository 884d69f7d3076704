// MX block quantization (see mx.h; OCP MX v1.0 §6.3; torchao prototype/mx_formats/mx_tensor.py
// `to_mx`; TransformerEngine transformer_engine/common/util/ptx.cuh `float_to_e8m0`,
// `exp2f_rcp`; microxcaling mx/mx_ops.py `_quantize_mx`).
#include "reference/formats/mx.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

namespace attest {
namespace {

constexpr uint8_t kE8M0Nan = 0xFF;
constexpr uint8_t kE8M0Max = 0xFE;  // 2^127
constexpr int kE8M0Bias = 127;
constexpr uint32_t kF32MantissaMask = 0x7FFFFF;

bool IsMxElement(Format f) {
  return f == Format::kE4M3FN || f == Format::kE5M2 || f == Format::kE3M2FN ||
         f == Format::kE2M3FN || f == Format::kE2M1FN;
}

// Biased E8M0 byte of an unbiased shared exponent, clamped as torchao does: below at -127,
// above at 128 (which becomes the NaN byte 0xFF).
uint8_t BiasedScale(int shared_exp) {
  shared_exp = std::clamp(shared_exp, -kE8M0Bias, kE8M0Bias + 1);
  return static_cast<uint8_t>(shared_exp + kE8M0Bias);
}

// TransformerEngine float_to_e8m0 (non-Blackwell path, equal to cvt.rp.satfinite.ue8m0x2):
// round the fp32 value up to a power of two.
uint8_t RoundUpToE8M0(float v) {
  if (std::isnan(v)) return kE8M0Nan;
  if (std::isinf(v)) return kE8M0Max;
  if (v == 0.0f) return 0x00;
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  auto exponent = static_cast<uint8_t>(bits >> 23);
  const uint32_t mantissa = bits & kF32MantissaMask;
  // 1. A nonzero mantissa rounds up, except at 2^127 (satfinite) and for fp32 subnormals
  //    at or below 2^-127 (0x400000), which byte 0 (2^-127) already covers.
  if (mantissa > 0 && exponent != kE8M0Max && !(exponent == 0 && mantissa <= 0x400000)) {
    ++exponent;
  }
  return exponent;
}

}  // namespace

int MxElementEmax(Format element) { return Spec(element).max_exponent(); }

uint8_t MxScaleCode(float amax, Format element, ScaleMode mode) {
  if (std::isnan(amax)) return kE8M0Nan;
  amax = std::fabs(amax);
  if (mode == ScaleMode::kRceil) {
    // fl32(1/max) as both libraries hold it: TE Quantized_Limits::max_norm_rcp (a float
    // constant from 1.0 / max_norm), torchao `max_abs * (1.0 / max_pos)` on an fp32 tensor.
    const float rcp = static_cast<float>(1.0 / MaxFinite(element));
    return RoundUpToE8M0(amax * rcp);
  }
  if (std::isinf(amax)) return kE8M0Nan;  // torchao: non-finite amax -> 0xFF
  uint32_t bits = std::bit_cast<uint32_t>(amax);
  if (mode == ScaleMode::kEven) {
    // torchao EVEN: add half an ulp of an (mbits+1)-bit significand, keep sign and exponent.
    bits = (bits + (uint32_t{1} << (22 - Spec(element).mantissa_bits))) & 0xFF800000u;
    if ((bits >> 23) == 0xFF) return kE8M0Nan;  // carried into Inf: torchao's isfinite -> 0xFF
  }
  // floor(log2(amax)) from the exponent field; an fp32 subnormal (field 0) counts as -127.
  int exponent = static_cast<int>(bits >> 23) - kE8M0Bias;
  if (mode == ScaleMode::kCeil && (bits & kF32MantissaMask) != 0) ++exponent;
  return BiasedScale(exponent - MxElementEmax(element));
}

float MxElementFactor(uint8_t scale, MxReciprocal reciprocal) {
  if (scale == kE8M0Nan) return std::numeric_limits<float>::quiet_NaN();
  if (reciprocal == MxReciprocal::kTransformerEngine) {
    // exp2f_rcp: `(biased_exp == 0) ? 1 : __int_as_float((254 - biased_exp) << 23)`.
    if (scale == 0) return 1.0f;
    return std::bit_cast<float>(static_cast<uint32_t>(254 - scale) << 23);
  }
  return std::ldexp(1.0f, kE8M0Bias - scale);  // 2^-127 .. 2^127, exact (2^-127 subnormal)
}

Expected<QuantizedTensor> QuantizeMx(const Tensor& input, const MxOptions& options) {
  if (!IsMxElement(options.element)) {
    return Error{"MX element format must be e4m3fn, e5m2, e3m2fn, e2m3fn or e2m1fn, not " +
                 std::string(Name(options.element))};
  }
  if (options.block_size < 1) {
    return Error{"MX block size must be >= 1, got " + std::to_string(options.block_size)};
  }
  const Shape& shape = input.shape();
  auto axis = ResolveAxis(options.axis, static_cast<int64_t>(shape.size()), "MX block axis");
  if (!axis.ok()) return axis.error();

  QuantizedTensor out;
  for (const Scheme& row : AllSchemes()) {
    if (row.kind == SchemeKind::kMx && row.element == options.element) out.scheme = row.name;
  }
  out.options.scheme = out.scheme;
  out.options.scale_mode = options.scale_mode;
  out.options.axis = options.axis;
  out.options.block_size = options.block_size;
  out.options.nan = options.nan;
  out.options.mx_reciprocal = options.reciprocal;
  out.element = options.element;
  out.scale_kind = ScaleKind::kE8M0;
  out.block = Shape(shape.size(), 1);
  out.block[static_cast<size_t>(*axis)] = options.block_size;

  // 1. fp32 values and block amax (fmaxf; NaN/Inf flagged per block).
  const std::vector<float> x = ToF32Values(input);
  const BlockAmax amax = ComputeBlockAmax(x, shape, out.block);

  // 2. One E8M0 byte and one fp32 element factor per block.
  out.scales = Tensor::Zeros(DType::kE8M0FNU, BlockGridShape(shape, out.block));
  const std::span<uint8_t> scales = out.scales.span<uint8_t>();
  std::vector<float> factor(scales.size());
  std::vector<double> block_scale(scales.size());  // 2^(byte - 127), NaN for 0xFF
  for (size_t b = 0; b < scales.size(); ++b) {
    const bool nan_block = options.nan == BlockNanPolicy::kPropagateNaN && amax.nonfinite[b] != 0;
    scales[b] =
        nan_block ? kE8M0Nan : MxScaleCode(amax.amax[b], options.element, options.scale_mode);
    factor[b] = MxElementFactor(scales[b], options.reciprocal);
    block_scale[b] = scales[b] == kE8M0Nan ? std::numeric_limits<double>::quiet_NaN()
                                           : std::ldexp(1.0, scales[b] - kE8M0Bias);
  }

  // 3. Elements: fl32(x * factor), RNE, saturating (OCP MX v1.0 §6.3). NaN elements keep no
  //    sign (PTX cvt: canonical NaN for fp8, +max for fp6/fp4).
  const ElementCodec& codec = CodecFor(options.element);
  out.codes = Tensor::Zeros(CodeDType(options.element), shape);
  out.dequant = Tensor::Zeros(DType::kF64, shape);
  uint8_t* codes = out.codes.data<uint8_t>();
  double* dequant = out.dequant.data<double>();
  ForEachElementBlock(shape, out.block, [&](int64_t e, int64_t b) {
    const auto ei = static_cast<size_t>(e);
    const auto bi = static_cast<size_t>(b);
    const float v = x[ei] * factor[bi];
    const uint8_t code = codec.Encode(v);
    codes[ei] = code;
    dequant[ei] = codec.Decode(code) * block_scale[bi];
  });
  return out;
}

}  // namespace attest
