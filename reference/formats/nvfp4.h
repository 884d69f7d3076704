// NVFP4 quantization (NVIDIA Blackwell block-scaled FP4; TransformerEngine
// transformer_engine/common/cast/nvfp4/core_nvfp4.cuh and dequantize_nvfp4.cuh; torchao
// torchao/prototype/mx_formats/nvfp4_tensor.py `_nvfp4_quantize` with a per-tensor scale):
// E2M1 elements, blocks of 16 along any axis, one E4M3 scale per block and one fp32 scale per
// tensor. Every fp32 operation is performed in float, in the order the library performs it.
#pragma once

#include <cstdint>
#include <optional>

#include "reference/formats/quantize.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

struct Nvfp4Options {
  int64_t block_size = 16;  // NVFP4_SCALE_DIM
  int64_t axis = -1;
  Nvfp4Variant variant = Nvfp4Variant::kTransformerEngine;
  std::optional<float> tensor_amax;  // computed (fmaxf over |x|, NaN skipped) when unset
};

// The per-tensor and per-block scale arithmetic of one variant, exposed for tests and recipes.
struct Nvfp4TensorScale {
  float encode = 1.0f;  // TE S_enc = 448*6/amax (1 when amax or S_enc is 0); torchao: unused
  float decode = 1.0f;  // TE S_dec = 1/S_enc; torchao per_tensor_scale = amax/(448*6)
};
Nvfp4TensorScale Nvfp4TensorScaleOf(float tensor_amax, Nvfp4Variant variant);

struct Nvfp4BlockScale {
  uint8_t code = 0;     // E4M3 code of the block scale s8
  float factor = 0.0f;  // TE: encode multiplier min(1/(s8*S_dec), FLT_MAX); torchao: the
                        // divisor per_tensor_scale * s8
};
//  TE:      s8 = e4m3_rne_satfinite(amax_b * (S_enc * fl(1/6)))
//  torchao: s8 = e4m3_rne(clamp(fl(amax_b / 6) / per_tensor_scale, 2^-6, 448))
Nvfp4BlockScale Nvfp4BlockScaleOf(float block_amax, const Nvfp4TensorScale& tensor,
                                  Nvfp4Variant variant);
// The E2M1 code of one element: TE cvt.rn.satfinite.e2m1(x * factor); torchao
// f32_to_f4_unpacked(clamp(x / factor, -6, 6)).
uint8_t Nvfp4ElementCode(float x, const Nvfp4BlockScale& block, Nvfp4Variant variant);

// Quantizes `input` (rounded to fp32 first) to NVFP4. scales: E4M3 codes; tensor_scale: the
// fp32 decode factor (TE S_dec, torchao per_tensor_scale); dequant = Decode(q) * s8 *
// tensor_scale, computed exactly in f64 (what a block-scaled GEMM applies; TE's standalone
// dequantize kernel instead rounds s8 * amax * fl(1/2688) to fp32 first).
Expected<QuantizedTensor> QuantizeNvfp4(const Tensor& input, const Nvfp4Options& options);

}  // namespace attest
