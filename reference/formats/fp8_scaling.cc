// FP8 per-tensor and per-block scaling (see fp8_scaling.h; TransformerEngine
// transformer_engine/common/recipe/recipe_common.cuh `compute_scale_from_amax`).
#include "reference/formats/fp8_scaling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "reference/formats/format.h"

namespace attest {
namespace {

Status CheckElement(Format f) {
  if (f != Format::kE4M3FN && f != Format::kE5M2) {
    return Error{"FP8 element format must be e4m3fn or e5m2, not " + std::string(Name(f))};
  }
  return Status::Ok();
}

// Shared by both granularities: one amax, scale and descale per block of `block`.
QuantizedTensor QuantizeWithBlocks(const Tensor& input, const Shape& block,
                                   const Fp8ScaleOptions& options,
                                   const std::optional<float>& given_amax) {
  const Shape& shape = input.shape();
  QuantizedTensor out;
  out.options.margin = options.margin;
  out.options.pow2_scale = options.pow2_scale;
  out.options.amax_epsilon = options.amax_epsilon;
  out.options.tensor_amax = given_amax;
  out.element = options.element;
  out.scale_kind = ScaleKind::kF32;
  out.block = block;

  const std::vector<float> x = ToF32Values(input);
  BlockAmax amax = ComputeBlockAmax(x, shape, block);
  if (given_amax) amax.amax.assign(amax.amax.size(), *given_amax);

  // Scale per block; the stored descale is fl32(1 / scale) (TE scale_inv).
  out.scales = Tensor::Zeros(DType::kF32, BlockGridShape(shape, block));
  const std::span<float> descale = out.scales.span<float>();
  std::vector<float> scale(descale.size());
  for (size_t b = 0; b < scale.size(); ++b) {
    scale[b] = Fp8ScaleFromAmax(amax.amax[b], options);
    descale[b] = 1.0f / scale[b];
  }

  const ElementCodec& codec = CodecFor(options.element);  // RNE, __NV_SATFINITE, NaN -> 0x7F
  out.codes = Tensor::Zeros(CodeDType(options.element), shape);
  out.dequant = Tensor::Zeros(DType::kF64, shape);
  uint8_t* codes = out.codes.data<uint8_t>();
  double* dequant = out.dequant.data<double>();
  ForEachElementBlock(shape, block, [&](int64_t e, int64_t b) {
    const auto ei = static_cast<size_t>(e);
    const auto bi = static_cast<size_t>(b);
    const uint8_t code = codec.Encode(x[ei] * scale[bi]);
    codes[ei] = code;
    // Exact: an fp8 value has at most 4 significant bits, the descale 24.
    dequant[ei] = codec.Decode(code) * static_cast<double>(descale[bi]);
  });
  return out;
}

}  // namespace

float Fp8ScaleFromAmax(float amax, const Fp8ScaleOptions& options) {
  // NaN compares false and passes through to the "return 1" below, as in TE.
  if (amax < options.amax_epsilon) amax = options.amax_epsilon;
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  const auto max_fp8 = static_cast<float>(MaxFinite(options.element));
  float scale = max_fp8 / amax;  // __fdiv_rn
  // DelayedScaling: sf = (fp8_max / amax) / 2**margin; a power-of-two division.
  if (options.margin != 0) scale = scale / std::ldexp(1.0f, options.margin);
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  if (options.pow2_scale) {
    scale = std::bit_cast<float>(std::bit_cast<uint32_t>(scale) & 0xFF800000u);
  }
  return scale;
}

Expected<QuantizedTensor> QuantizeFp8Tensor(const Tensor& input, const Fp8TensorOptions& options) {
  if (Status s = CheckElement(options.scale.element); !s.ok()) return s.error();
  // The whole tensor is one block (extent max(dim, 1) so that the grid is all ones).
  Shape block = input.shape();
  for (auto& d : block) d = std::max<int64_t>(d, 1);
  QuantizedTensor out = QuantizeWithBlocks(input, block, options.scale, options.amax);
  out.scheme = options.scale.element == Format::kE4M3FN ? "fp8-tensor-e4m3" : "fp8-tensor-e5m2";
  out.options.scheme = out.scheme;
  return out;
}

Expected<QuantizedTensor> QuantizeFp8Block(const Tensor& input, const Fp8BlockOptions& options) {
  if (Status s = CheckElement(options.scale.element); !s.ok()) return s.error();
  if (options.block_rows < 1 || options.block_cols < 1) {
    return Error{"FP8 block shape must be >= 1x1, got " + std::to_string(options.block_rows) + "x" +
                 std::to_string(options.block_cols)};
  }
  const auto rank = static_cast<int64_t>(input.rank());
  auto axis = ResolveAxis(options.axis, rank, "FP8 block axis");
  if (!axis.ok()) return axis.error();
  Shape block(static_cast<size_t>(rank), 1);
  block[static_cast<size_t>(*axis)] = options.block_cols;
  if (options.block_rows > 1) {
    auto row_axis = ResolveAxis(options.row_axis, rank, "FP8 block row axis");
    if (!row_axis.ok()) return row_axis.error();
    if (*row_axis == *axis) {
      return Error{"FP8 block row axis and axis are both " + std::to_string(*axis)};
    }
    block[static_cast<size_t>(*row_axis)] = options.block_rows;
  }
  QuantizedTensor out = QuantizeWithBlocks(input, block, options.scale, std::nullopt);
  out.scheme = options.scale.element == Format::kE4M3FN ? "fp8-block-e4m3" : "fp8-block-e5m2";
  out.options.scheme = out.scheme;
  out.options.axis = options.axis;
  out.options.row_axis = options.row_axis;
  out.options.block_size = options.block_cols;
  out.options.block_rows = options.block_rows;
  return out;
}

}  // namespace attest
