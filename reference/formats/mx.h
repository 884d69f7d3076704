// MX block quantization (OCP Microscaling Formats v1.0 §5 (E8M0) and §6.3 (conversion); MX
// paper arXiv 2310.10537 Alg. 1): blocks of k elements (32 by default) along any axis share one
// E8M0 scale 2^e; each element is round_RNE(x / 2^e) in its element format, saturated to ±max.
// The scale-exponent rules of the libraries (FLOOR, CEIL, RCEIL, EVEN) are one ScaleMode each.
#pragma once

#include <cstdint>

#include "reference/formats/format.h"
#include "reference/formats/quantize.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

struct MxOptions {
  Format element = Format::kE4M3FN;  // e4m3fn e5m2 e3m2fn e2m3fn e2m1fn
  int64_t block_size = 32;           // OCP MX v1.0 §5: k = 32
  int64_t axis = -1;                 // any axis; negative counts from the end
  ScaleMode scale_mode = ScaleMode::kFloor;
  BlockNanPolicy nan = BlockNanPolicy::kPropagateNaN;
  MxReciprocal reciprocal = MxReciprocal::kExact;
};

// The largest power-of-two exponent of an element format's finite values ("emax_elem",
// OCP MX v1.0 Table 2: e4m3fn 8, e5m2 15, e3m2fn 4, e2m3fn 2, e2m1fn 2).
int MxElementEmax(Format element);

// The E8M0 scale byte of a block whose fp32 amax (>= 0, or NaN/Inf) is `amax`:
//  kFloor (OCP MX v1.0 §6.3; torchao FLOOR): e = E(amax) - emax_elem, E taken from the fp32
//    exponent field (E - 127, so an fp32-subnormal amax gives -127), clamped below at -127;
//    amax = 0 gives byte 0x00.
//  kCeil (torchao CEIL): as kFloor plus 1 when amax's fp32 mantissa field is nonzero.
//  kEven (torchao EVEN): amax's fp32 bits + 2^(22 - mbits_elem), mantissa field cleared, then
//    kFloor; an amax that this carries to Inf gives 0xFF, as in torchao.
//  kRceil (TransformerEngine / cuDNN float_to_e8m0, cvt.rp.satfinite.ue8m0x2.f32):
//    d = fl32(amax * fl32(1/max_elem)) rounded up to a power of two: 0 -> 0x00, values
//    <= 2^-127 -> 0x00, above 2^127 (incl. Inf) saturate to 0xFE.
// NaN gives 0xFF in every mode; Inf gives 0xFF except kRceil (0xFE).
uint8_t MxScaleCode(float amax, Format element, ScaleMode mode);

// The fp32 factor elements are multiplied by for scale byte `scale` (2^(127 - scale), exact;
// TransformerEngine's exp2f_rcp quirks under MxReciprocal::kTransformerEngine; NaN for 0xFF).
float MxElementFactor(uint8_t scale, MxReciprocal reciprocal);

// Quantizes `input` (any float dtype, widened exactly, then rounded to fp32) to MX.
// Elements: v = fl32(x * MxElementFactor(scale)) (a power-of-two multiply, exact unless it
// underflows below 2^-126, where every element format rounds to zero anyway), then
// EncodeF32(v, element, {RNE, kSaturate}) — the order torchao and TransformerEngine use.
// A block with NaN/Inf under kPropagateNaN gets scale 0xFF and element codes Encode(NaN)
// (no library agrees on those codes; the scale carries the NaN). Under kIgnoreNaN a NaN
// element encodes like PTX cvt.satfinite (NaN code for fp8, +max for fp6/fp4).
// Partial last block: the blocks at the end of the axis hold fewer elements (equivalent to
// zero padding, which never changes an amax). dequant = Decode(code) * 2^(scale - 127).
Expected<QuantizedTensor> QuantizeMx(const Tensor& input, const MxOptions& options);

}  // namespace attest
