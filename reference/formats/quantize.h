// Block quantizers as data (docs/design.md "Formats and recipes"): one registry row per scheme
// (mxfp8-e4m3 ... fp8-block-e4m3: element format, block shape, scale kind, defaults) and one
// entry point, Quantize(), that dispatches to the MX (OCP MX v1.0 §6), NVFP4
// (TransformerEngine / torchao) and FP8 (TransformerEngine delayed / current / blockwise
// scaling) quantizers in mx.h, nvfp4.h and fp8_scaling.h. docs/formats.md "Block quantizers"
// describes every option and the library each one follows.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "reference/formats/format.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// How an MX block's E8M0 scale is derived from the block's fp32 amax (mx.h has the formulas
// and their sources).
enum class ScaleMode : uint8_t {
  kFloor,  // OCP MX v1.0 §6.3: floor(log2(amax)) - emax_elem
  kCeil,   // torchao CEIL: +1 when amax is not a power of two
  kRceil,  // cuDNN / TransformerEngine float_to_e8m0: ceil_pow2(amax * fl(1/max))
  kEven,   // torchao EVEN: amax rounded to mbits+1 significant bits first, then floor
};
std::string_view Name(ScaleMode mode);  // floor ceil rceil even
std::optional<ScaleMode> ParseScaleMode(std::string_view name);

// What a NaN or Inf inside a block does. microxcaling (mx_ops.py: NaN shared exponent) and
// torchao (mx_tensor.py: non-finite amax -> scale 0xFF) agree: scale NaN, every element of
// the block dequantises to NaN; both names are kept so that a recipe can cite its source.
// TransformerEngine reduces the amax with fmaxf, which drops NaN (Inf stays).
enum class BlockNanPolicy : uint8_t {
  kPropagateNaN,              // microxcaling: NaN/Inf anywhere -> the whole block NaN
  kScaleNaN = kPropagateNaN,  // torchao: scale byte 0xFF (same result as kPropagateNaN)
  kIgnoreNaN,                 // TransformerEngine: amax = fmaxf(...) skips NaN elements
};
std::string_view Name(BlockNanPolicy policy);                              // propagate ignore
std::optional<BlockNanPolicy> ParseBlockNanPolicy(std::string_view name);  // + "scale"

// NVFP4 arithmetic of one library (nvfp4.h).
enum class Nvfp4Variant : uint8_t {
  kTransformerEngine,  // common/cast/nvfp4/core_nvfp4.cuh: reciprocal multiplies
  kTorchao,            // prototype/mx_formats/nvfp4_tensor.py: divisions, clamped scale
};
std::string_view Name(Nvfp4Variant variant);  // te torchao
std::optional<Nvfp4Variant> ParseNvfp4Variant(std::string_view name);

// Reciprocal of the MX scale applied to elements. TransformerEngine's exp2f_rcp
// (common/util/ptx.cuh) returns 1 for scale byte 0 and +0 for byte 254 instead of 2^127 and
// 2^-127; torchao (_e8m0_scale_to_reciprocal_fp32) is exact.
enum class MxReciprocal : uint8_t { kExact, kTransformerEngine };

enum class SchemeKind : uint8_t { kMx, kNvfp4, kFp8Tensor, kFp8Block };
enum class ScaleKind : uint8_t {
  kE8M0,  // one E8M0 byte per block (DType kE8M0FNU)
  kE4M3,  // one E4M3 byte per block plus an fp32 tensor scale (DType kE4M3FN)
  kF32,   // one fp32 descale (1/scale) per block (DType kF32)
};

// One registry row. Block extents are along (row_axis, axis) for 2-D blocks and along axis
// alone when block_rows == 0; block_cols == 0 means the whole tensor is one block.
struct Scheme {
  std::string_view name;
  SchemeKind kind;
  Format element;
  ScaleKind scale;
  int64_t block_rows;            // 0: 1-D blocks
  int64_t block_cols;            // 0: one block per tensor
  ScaleMode default_scale_mode;  // MX only
  bool default_pow2_scale;       // FP8 only: scales rounded down to a power of two
  std::string_view description;
};
std::span<const Scheme> AllSchemes();
const Scheme* FindScheme(std::string_view name);

// Everything Quantize() accepts; unset optionals take the scheme row's defaults. Fields that
// do not apply to a scheme are ignored (and echoed as given in the result).
struct SchemeOptions {
  std::string scheme = "mxfp8-e4m3";
  std::optional<ScaleMode> scale_mode;  // MX
  int64_t axis = -1;                    // blocked axis (the inner one of a 2-D block)
  int64_t row_axis = -2;                // outer axis of a 2-D block (fp8-block)
  std::optional<int64_t> block_size;    // elements along `axis` (MX 32, NVFP4 16, ...)
  std::optional<int64_t> block_rows;    // elements along `row_axis` (fp8-block)
  BlockNanPolicy nan = BlockNanPolicy::kPropagateNaN;  // MX; FP8 and NVFP4 follow TE (fmaxf)
  MxReciprocal mx_reciprocal = MxReciprocal::kExact;
  Nvfp4Variant nvfp4_variant = Nvfp4Variant::kTransformerEngine;
  // NVFP4 and fp8-tensor: the tensor amax to scale with (delayed scaling, calibration);
  // computed from the data when unset.
  std::optional<float> tensor_amax;
  int margin = 0;                  // FP8: scale divided by 2^margin (TE DelayedScaling)
  std::optional<bool> pow2_scale;  // FP8: scale rounded down to a power of two
  float amax_epsilon = 0.0f;       // FP8: amax raised to at least this (TE amax_epsilon)
};

// The result of quantizing one tensor.
struct QuantizedTensor {
  std::string scheme;
  Format element = Format::kE4M3FN;
  ScaleKind scale_kind = ScaleKind::kE8M0;
  Shape block;            // block extent along each dimension of the input
  Tensor codes;           // element codes, input shape: kE4M3FN / kE5M2 dtype, else U8
  Tensor scales;          // one per block, shape ceil(dim / block) per dimension
  Tensor tensor_scale;    // NVFP4 only: f32 [1], the fp32 decode factor (defined below)
  Tensor dequant;         // f64, input shape: exactly what the codes and scales represent
  SchemeOptions options;  // as resolved (defaults filled in)
};

// Quantizes an f64 tensor (any float dtype is widened exactly first). The input is rounded
// to fp32 (RNE) before anything else, because every library modelled here computes amax and
// scaled elements in fp32; inputs that are already fp32 values (the usual case: "inputs are
// what the kernel saw") are taken exactly. Errors name the scheme, axis or block at fault.
Expected<QuantizedTensor> Quantize(const Tensor& input, const SchemeOptions& options);

// "scheme=mxfp8-e4m3 axis=-1 block=32 scale_mode=rceil nan=propagate ...": the options that
// apply to the result's scheme, for file metadata and reports.
std::string DescribeOptions(const QuantizedTensor& q);

// ---- Shared machinery of the block quantizers (used by mx.cc, nvfp4.cc, fp8_scaling.cc) ----

// The input as contiguous fp32 values (RNE from f64), row-major.
std::vector<float> ToF32Values(const Tensor& input);
// Normalises a possibly negative axis; an Error names `what` when out of range.
Expected<int64_t> ResolveAxis(int64_t axis, int64_t rank, std::string_view what);
// ceil(dim / block) along every dimension (block extents >= 1).
Shape BlockGridShape(const Shape& shape, const Shape& block);

// Calls fn(element_index, block_index) for every element of a row-major tensor of `shape`
// cut into blocks of `block` (partial blocks at the high end of a dimension hold fewer
// elements); block indices are row-major in BlockGridShape(shape, block).
template <class Fn>
void ForEachElementBlock(const Shape& shape, const Shape& block, Fn&& fn) {
  const size_t rank = shape.size();
  const int64_t n = Tensor::NumElements(shape);
  if (n == 0) return;
  if (rank == 0) {
    fn(int64_t{0}, int64_t{0});
    return;
  }
  const Shape grid = BlockGridShape(shape, block);
  const Shape grid_strides = Tensor::ContiguousStrides(grid);
  // contrib[d][i]: what index i along dimension d adds to the block index.
  std::vector<std::vector<int64_t>> contrib(rank);
  for (size_t d = 0; d < rank; ++d) {
    contrib[d].resize(static_cast<size_t>(shape[d]));
    for (int64_t i = 0; i < shape[d]; ++i) {
      contrib[d][static_cast<size_t>(i)] = (i / block[d]) * grid_strides[d];
    }
  }
  const int64_t inner = shape[rank - 1];
  const std::vector<int64_t>& inner_contrib = contrib[rank - 1];
  std::vector<int64_t> index(rank, 0);  // outer odometer; index[rank-1] unused
  int64_t element = 0;
  for (int64_t row = 0, rows = n / inner; row < rows; ++row) {
    int64_t base = 0;
    for (size_t d = 0; d + 1 < rank; ++d) base += contrib[d][static_cast<size_t>(index[d])];
    for (int64_t i = 0; i < inner; ++i)
      fn(element + i, base + inner_contrib[static_cast<size_t>(i)]);
    element += inner;
    for (size_t d = rank - 1; d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

// Block amax in fp32 under a NaN policy: max |x| over the block, with NaN/Inf flags.
struct BlockAmax {
  std::vector<float> amax;         // kIgnoreNaN: fmaxf reduction (NaN skipped); else max of |x|
  std::vector<uint8_t> nonfinite;  // a NaN or Inf element occurs in the block
  std::vector<uint8_t> has_nan;
};
BlockAmax ComputeBlockAmax(std::span<const float> values, const Shape& shape, const Shape& block);

// The DType that holds codes of an element format (fp8 dtypes, else U8).
DType CodeDType(Format element);

// The element conversion every block quantizer uses, fp32 -> a format of <= 8 bits with RNE
// and finite saturation (EncodeF32 with {kNearestEven, kSaturate, NanPolicy::kDropSign}),
// table-driven for speed. Midpoints between adjacent magnitudes of such a format have at most
// 5 significant bits, so each lies on a boundary of the 2^16 buckets that the top 16 bits of
// |v| select; within a bucket the code is one value at the boundary itself (a possible tie)
// and one value everywhere above it. quantize_test checks every bucket against EncodeF32.
class ElementCodec {
 public:
  explicit ElementCodec(Format element);
  uint8_t Encode(float v) const {
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    const uint32_t a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return nan_code_;
    const uint32_t bucket = a >> 16;
    const uint8_t code = (a & 0xFFFFu) != 0 ? above_[bucket] : at_[bucket];
    return static_cast<uint8_t>(code | ((bits >> 31) != 0 ? sign_bit_ : 0u));
  }
  double Decode(uint8_t code) const { return values_[code]; }

 private:
  std::vector<uint8_t> at_;     // code of the bucket's lowest magnitude
  std::vector<uint8_t> above_;  // code of every other magnitude of the bucket
  std::vector<double> values_;  // all 256 byte values decoded (bits above the format: 0)
  uint8_t nan_code_ = 0;
  unsigned sign_bit_ = 0;
};
// One codec per element format, built once.
const ElementCodec& CodecFor(Format element);

}  // namespace attest
