// FP8 with fp32 scales (TransformerEngine): per-tensor amax scaling as in DelayedScaling and
// Float8CurrentScaling (transformer_engine/common/recipe/recipe_common.cuh
// `compute_scale_from_amax`, transformer_engine/pytorch `_default_sf_compute` for the margin),
// and per-block scaling with any 2-D block shape along any two axes (Float8BlockScaling: 1x128
// and 128x128 tiles, power-of-two scales by default).
#pragma once

#include <cstdint>
#include <optional>

#include "reference/formats/quantize.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

struct Fp8ScaleOptions {
  Format element = Format::kE4M3FN;  // e4m3fn or e5m2
  int margin = 0;                    // scale /= 2^margin (DelayedScaling.margin)
  bool pow2_scale = false;           // scale's fp32 mantissa cleared (force_pow_2_scales)
  float amax_epsilon = 0.0f;         // amax = max(amax, epsilon)
};

// compute_scale_from_amax: amax < epsilon -> epsilon; amax Inf, 0 or NaN -> 1; else
// fl32(max / amax) / 2^margin; Inf -> FLT_MAX; with pow2 the fp32 bits & 0xFF800000.
float Fp8ScaleFromAmax(float amax, const Fp8ScaleOptions& options);

struct Fp8TensorOptions {
  Fp8ScaleOptions scale;
  std::optional<float> amax;  // the delayed-scaling amax (history); computed when unset
};
// One scale for the whole tensor: codes = e4m3/e5m2 satfinite RNE of fl32(x * scale); the
// stored descale (scales, f32 shape [1, ..., 1]) is fl32(1 / scale); dequant = Decode(q) *
// descale exactly. amax reductions use fmaxf (NaN skipped).
Expected<QuantizedTensor> QuantizeFp8Tensor(const Tensor& input, const Fp8TensorOptions& options);

struct Fp8BlockOptions {
  Fp8ScaleOptions scale{Format::kE4M3FN, 0, true, 0.0f};
  int64_t row_axis = -2;  // outer axis of the block (ignored when block_rows == 1)
  int64_t axis = -1;      // inner axis
  int64_t block_rows = 1;
  int64_t block_cols = 128;
};
// One scale per block_rows x block_cols tile (partial tiles at the ends hold fewer elements).
Expected<QuantizedTensor> QuantizeFp8Block(const Tensor& input, const Fp8BlockOptions& options);

}  // namespace attest
