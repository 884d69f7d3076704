// Scheme registry, option names and the machinery the block quantizers share (see quantize.h).
#include "reference/formats/quantize.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

#include "reference/formats/fp8_scaling.h"
#include "reference/formats/mx.h"
#include "reference/formats/nvfp4.h"

namespace attest {
namespace {

// The registry: adding a scheme is adding a row. Defaults follow the library each row
// models: MX scale mode FLOOR (OCP MX v1.0 §6.3, torchao's default); fp8-block 1x128 tiles
// with power-of-two scales (TransformerEngine Float8BlockScaling: activations use 1-D 1x128
// blocks, "scaling factors ... will by default be constrained to powers of 2").
constexpr std::array<Scheme, 8> kSchemes = {{
    {"mxfp8-e4m3", SchemeKind::kMx, Format::kE4M3FN, ScaleKind::kE8M0, 0, 32, ScaleMode::kFloor,
     false, "MXFP8 E4M3 elements, 32-element blocks, E8M0 scales"},
    {"mxfp8-e5m2", SchemeKind::kMx, Format::kE5M2, ScaleKind::kE8M0, 0, 32, ScaleMode::kFloor,
     false, "MXFP8 E5M2 elements, 32-element blocks, E8M0 scales"},
    {"mxfp6-e3m2", SchemeKind::kMx, Format::kE3M2FN, ScaleKind::kE8M0, 0, 32, ScaleMode::kFloor,
     false, "MXFP6 E3M2 elements (U8 codes), 32-element blocks, E8M0"},
    {"mxfp6-e2m3", SchemeKind::kMx, Format::kE2M3FN, ScaleKind::kE8M0, 0, 32, ScaleMode::kFloor,
     false, "MXFP6 E2M3 elements (U8 codes), 32-element blocks, E8M0"},
    {"mxfp4", SchemeKind::kMx, Format::kE2M1FN, ScaleKind::kE8M0, 0, 32, ScaleMode::kFloor, false,
     "MXFP4 E2M1 elements (U8 codes), 32-element blocks, E8M0 scales"},
    {"nvfp4", SchemeKind::kNvfp4, Format::kE2M1FN, ScaleKind::kE4M3, 0, 16, ScaleMode::kFloor,
     false, "NVFP4: E2M1 (U8 codes), 16-element blocks, E4M3 scales, fp32 tensor scale"},
    {"fp8-tensor-e4m3", SchemeKind::kFp8Tensor, Format::kE4M3FN, ScaleKind::kF32, 0, 0,
     ScaleMode::kFloor, false, "FP8 E4M3, one fp32 scale per tensor (amax scaling)"},
    {"fp8-block-e4m3", SchemeKind::kFp8Block, Format::kE4M3FN, ScaleKind::kF32, 1, 128,
     ScaleMode::kFloor, true, "FP8 E4M3, fp32 power-of-two scale per 1x128 block"},
}};

constexpr std::array<std::string_view, 4> kScaleModeNames = {"floor", "ceil", "rceil", "even"};

}  // namespace

std::string_view Name(ScaleMode mode) { return kScaleModeNames[static_cast<size_t>(mode)]; }

std::optional<ScaleMode> ParseScaleMode(std::string_view name) {
  for (size_t i = 0; i < kScaleModeNames.size(); ++i) {
    if (kScaleModeNames[i] == name) return static_cast<ScaleMode>(i);
  }
  return std::nullopt;
}

std::string_view Name(BlockNanPolicy policy) {
  return policy == BlockNanPolicy::kIgnoreNaN ? "ignore" : "propagate";
}

std::optional<BlockNanPolicy> ParseBlockNanPolicy(std::string_view name) {
  if (name == "propagate") return BlockNanPolicy::kPropagateNaN;
  if (name == "scale") return BlockNanPolicy::kScaleNaN;
  if (name == "ignore") return BlockNanPolicy::kIgnoreNaN;
  return std::nullopt;
}

std::string_view Name(Nvfp4Variant variant) {
  return variant == Nvfp4Variant::kTorchao ? "torchao" : "te";
}

std::optional<Nvfp4Variant> ParseNvfp4Variant(std::string_view name) {
  if (name == "te") return Nvfp4Variant::kTransformerEngine;
  if (name == "torchao") return Nvfp4Variant::kTorchao;
  return std::nullopt;
}

std::span<const Scheme> AllSchemes() { return kSchemes; }

const Scheme* FindScheme(std::string_view name) {
  for (const auto& row : kSchemes) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

std::vector<float> ToF32Values(const Tensor& input) {
  const Tensor f64 = input.dtype() == DType::kF64 ? input : ToF64(input);
  std::vector<float> out(static_cast<size_t>(f64.numel()));
  if (f64.contiguous()) {
    const double* p = f64.data<double>();
    // static_cast<float> is IEEE RNE from double on every platform we build for.
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
    return out;
  }
  size_t k = 0;
  ForEachIndex(f64.shape(), [&](std::span<const int64_t> idx) {
    out[k++] = static_cast<float>(f64.data<double>()[f64.Offset(idx)]);
  });
  return out;
}

Expected<int64_t> ResolveAxis(int64_t axis, int64_t rank, std::string_view what) {
  const int64_t resolved = axis < 0 ? axis + rank : axis;
  if (resolved < 0 || resolved >= rank) {
    return Error{std::string(what) + " " + std::to_string(axis) + " is out of range for a rank-" +
                 std::to_string(rank) + " tensor"};
  }
  return resolved;
}

Shape BlockGridShape(const Shape& shape, const Shape& block) {
  Shape grid(shape.size());
  // ceil(shape / block) without forming shape + block - 1, which overflows int64 for the
  // dims up to 2^63 - 1 that a zero-size tensor may carry ([0, 2^63 - 1] holds no element).
  for (size_t d = 0; d < shape.size(); ++d) {
    grid[d] = shape[d] / block[d] + (shape[d] % block[d] != 0 ? 1 : 0);
  }
  return grid;
}

BlockAmax ComputeBlockAmax(std::span<const float> values, const Shape& shape, const Shape& block) {
  const auto blocks = static_cast<size_t>(Tensor::NumElements(BlockGridShape(shape, block)));
  BlockAmax out{std::vector<float>(blocks, 0.0f), std::vector<uint8_t>(blocks, 0),
                std::vector<uint8_t>(blocks, 0)};
  ForEachElementBlock(shape, block, [&](int64_t e, int64_t b) {
    const float a = std::fabs(values[static_cast<size_t>(e)]);
    const auto bi = static_cast<size_t>(b);
    // fmaxf returns the non-NaN operand: TransformerEngine's reduction.
    out.amax[bi] = std::fmax(out.amax[bi], a);
    if (!std::isfinite(a)) {
      out.nonfinite[bi] = 1;
      if (std::isnan(a)) out.has_nan[bi] = 1;
    }
  });
  return out;
}

DType CodeDType(Format element) {
  if (element == Format::kE4M3FN) return DType::kE4M3FN;
  if (element == Format::kE5M2) return DType::kE5M2;
  return DType::kU8;
}

std::string DescribeOptions(const QuantizedTensor& q) {
  const SchemeOptions& o = q.options;
  const Scheme* scheme = FindScheme(q.scheme);
  std::string out = "scheme=" + q.scheme + " axis=" + std::to_string(o.axis);
  if (o.block_size) out += " block=" + std::to_string(*o.block_size);
  if (scheme == nullptr) return out;
  switch (scheme->kind) {
    case SchemeKind::kMx:
      out += " scale_mode=" + std::string(Name(o.scale_mode.value_or(ScaleMode::kFloor)));
      out += " nan=" + std::string(Name(o.nan));
      out += o.mx_reciprocal == MxReciprocal::kExact ? " reciprocal=exact" : " reciprocal=te";
      break;
    case SchemeKind::kNvfp4:
      out += " variant=" + std::string(Name(o.nvfp4_variant));
      if (o.tensor_amax) out += " tensor_amax=" + std::to_string(*o.tensor_amax);
      break;
    case SchemeKind::kFp8Block:
      out += " row_axis=" + std::to_string(o.row_axis) +
             " block_rows=" + std::to_string(o.block_rows.value_or(1));
      [[fallthrough]];
    case SchemeKind::kFp8Tensor:
      out += " margin=" + std::to_string(o.margin);
      out += o.pow2_scale.value_or(false) ? " pow2=yes" : " pow2=no";
      if (o.tensor_amax) out += " amax=" + std::to_string(*o.tensor_amax);
      break;
  }
  return out;
}

ElementCodec::ElementCodec(Format element) {
  const FormatSpec& spec = Spec(element);
  assert(spec.bits() <= 8 && spec.has_zero && spec.mantissa_bits <= 3);
  // 1. Midpoints between adjacent magnitude codes (exact in fp32: <= 5 significant bits).
  const uint64_t max_code = spec.max_finite_code();
  std::vector<float> midpoints;
  for (uint64_t c = 0; c < max_code; ++c) {
    midpoints.push_back(
        static_cast<float>((attest::Decode(c, element) + attest::Decode(c + 1, element)) / 2));
  }
  // 2. RNE by counting midpoints below |v| (a tie goes to the even code); values above the
  //    last midpoint, Inf included, saturate to max_code.
  auto encode_magnitude = [&](float a) {
    const auto it = std::lower_bound(midpoints.begin(), midpoints.end(), a);
    auto code = static_cast<unsigned>(it - midpoints.begin());
    if (it != midpoints.end() && *it == a && (code & 1u) != 0) ++code;
    return static_cast<uint8_t>(code);
  };
  at_.resize(size_t{1} << 16);
  above_.resize(size_t{1} << 16);
  for (uint32_t bucket = 0; bucket <= 0x7F80; ++bucket) {
    at_[bucket] = encode_magnitude(std::bit_cast<float>(bucket << 16));
    above_[bucket] = encode_magnitude(std::bit_cast<float>((bucket << 16) | 1u));
  }
  values_.resize(256);
  for (unsigned c = 0; c < 256; ++c) values_[c] = attest::Decode(c & spec.code_mask(), element);
  EncodeOptions o;
  o.overflow = Overflow::kSaturate;
  o.nan = NanPolicy::kDropSign;
  nan_code_ =
      static_cast<uint8_t>(EncodeF32(std::numeric_limits<float>::quiet_NaN(), element, o).code);
  sign_bit_ = static_cast<unsigned>(spec.sign_mask());
}

const ElementCodec& CodecFor(Format element) {
  static const std::array<ElementCodec, 5> codecs = {
      ElementCodec(Format::kE4M3FN), ElementCodec(Format::kE5M2), ElementCodec(Format::kE3M2FN),
      ElementCodec(Format::kE2M3FN), ElementCodec(Format::kE2M1FN)};
  switch (element) {
    case Format::kE4M3FN:
      return codecs[0];
    case Format::kE5M2:
      return codecs[1];
    case Format::kE3M2FN:
      return codecs[2];
    case Format::kE2M3FN:
      return codecs[3];
    default:
      assert(element == Format::kE2M1FN);
      return codecs[4];
  }
}

Expected<QuantizedTensor> Quantize(const Tensor& input, const SchemeOptions& options) {
  const Scheme* scheme = FindScheme(options.scheme);
  if (scheme == nullptr) {
    std::string known;
    for (const auto& row : kSchemes) {
      if (!known.empty()) known += ' ';
      known += row.name;
    }
    return Error{"unknown scheme '" + options.scheme + "' (known: " + known + ")"};
  }
  SchemeOptions resolved = options;
  Expected<QuantizedTensor> result = Error{"unreachable"};
  switch (scheme->kind) {
    case SchemeKind::kMx: {
      MxOptions mx;
      mx.element = scheme->element;
      mx.block_size = options.block_size.value_or(scheme->block_cols);
      mx.axis = options.axis;
      mx.scale_mode = options.scale_mode.value_or(scheme->default_scale_mode);
      mx.nan = options.nan;
      mx.reciprocal = options.mx_reciprocal;
      resolved.block_size = mx.block_size;
      resolved.scale_mode = mx.scale_mode;
      result = QuantizeMx(input, mx);
      break;
    }
    case SchemeKind::kNvfp4: {
      Nvfp4Options nv;
      nv.block_size = options.block_size.value_or(scheme->block_cols);
      nv.axis = options.axis;
      nv.variant = options.nvfp4_variant;
      nv.tensor_amax = options.tensor_amax;
      resolved.block_size = nv.block_size;
      result = QuantizeNvfp4(input, nv);
      break;
    }
    case SchemeKind::kFp8Tensor: {
      Fp8TensorOptions t;
      t.scale = {scheme->element, options.margin,
                 options.pow2_scale.value_or(scheme->default_pow2_scale), options.amax_epsilon};
      t.amax = options.tensor_amax;
      resolved.pow2_scale = t.scale.pow2_scale;
      result = QuantizeFp8Tensor(input, t);
      break;
    }
    case SchemeKind::kFp8Block: {
      Fp8BlockOptions b;
      b.scale = {scheme->element, options.margin,
                 options.pow2_scale.value_or(scheme->default_pow2_scale), options.amax_epsilon};
      b.axis = options.axis;
      b.row_axis = options.row_axis;
      b.block_cols = options.block_size.value_or(scheme->block_cols);
      b.block_rows = options.block_rows.value_or(scheme->block_rows);
      resolved.pow2_scale = b.scale.pow2_scale;
      resolved.block_size = b.block_cols;
      resolved.block_rows = b.block_rows;
      result = QuantizeFp8Block(input, b);
      break;
    }
  }
  if (!result.ok()) return Error{options.scheme + ": " + result.error().message};
  result->scheme = std::string(scheme->name);
  result->options = resolved;
  return result;
}

}  // namespace attest
