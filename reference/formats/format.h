// Bit-exact element formats (OCP OFP8 v1.0, OCP MX v1.0 §5.3, IEEE 754-2019 §4.3 and §7):
// one constexpr row per format (LLVM APFloat fltSemantics / ml_dtypes traits style) and one
// generic encoder/decoder driven by that row, with every rounding mode, overflow policy and
// NaN policy an explicit option. docs/formats.md has the tables and the known differences
// from NVIDIA's host conversion code and ml_dtypes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "reference/dtype.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// How a format encodes infinities.
enum class InfEncoding : uint8_t {
  kNone,  // no infinities (e4m3fn, fp6, fp4, e8m0fnu)
  kIeee,  // exponent all ones, mantissa zero
};

// How a format encodes NaN.
enum class NanEncoding : uint8_t {
  kNone,                 // no NaN (e3m2fn, e2m3fn, e2m1fn)
  kIeee,                 // exponent all ones, mantissa nonzero
  kAllOnes,              // only S.1111.111 (e4m3fn: "fn" = finite + NaN)
  kOnlyAllOnesUnsigned,  // the all-ones byte 0xFF of an unsigned format (e8m0fnu)
};

enum class Format : uint8_t {
  kF64,
  kF32,
  kBF16,
  kF16,
  kE4M3FN,
  kE5M2,
  kE3M2FN,
  kE2M3FN,
  kE2M1FN,
  kE8M0FNU,
};
inline constexpr int kNumFormats = 10;

// One row of semantics. Codes are sign-magnitude: sign bit (if any) above the exponent field
// above the mantissa field, so magnitudes are ordered like their codes. Without subnormals
// (e8m0fnu), exponent field 0 is an ordinary binade 2^-bias and there is no zero.
struct FormatSpec {
  Format format;
  std::string_view name;  // docs/design.md spelling: f64 f32 bf16 f16 e4m3fn e5m2 ...
  int exponent_bits;
  int mantissa_bits;  // stored fraction bits (precision - 1)
  int bias;
  bool is_signed;
  InfEncoding inf;
  NanEncoding nan;
  bool has_zero;
  bool has_subnormals;
  // Canonical quiet NaN magnitude code (ignored when nan == kNone): the code Encode returns
  // for NaN inputs, with the sign bit added when the NaN policy keeps the sign.
  uint64_t canonical_nan;

  constexpr int bits() const { return (is_signed ? 1 : 0) + exponent_bits + mantissa_bits; }
  constexpr uint64_t sign_mask() const {
    return is_signed ? uint64_t{1} << (exponent_bits + mantissa_bits) : 0;
  }
  constexpr uint64_t magnitude_mask() const {
    return (uint64_t{1} << (exponent_bits + mantissa_bits)) - 1;
  }
  constexpr uint64_t code_mask() const {
    return bits() == 64 ? ~uint64_t{0} : (uint64_t{1} << bits()) - 1;
  }
  // Largest finite magnitude code: the top code minus what Inf/NaN reserve.
  constexpr uint64_t max_finite_code() const {
    if (inf == InfEncoding::kIeee || nan == NanEncoding::kIeee) {
      return magnitude_mask() - (uint64_t{1} << mantissa_bits);  // exponent max-1, all ones
    }
    if (nan == NanEncoding::kAllOnes || nan == NanEncoding::kOnlyAllOnesUnsigned) {
      return magnitude_mask() - 1;
    }
    return magnitude_mask();
  }
  // Unbiased exponent of the lowest normal binade.
  constexpr int min_normal_exponent() const { return has_subnormals ? 1 - bias : -bias; }
  // Unbiased exponent of the binade holding the largest finite value.
  constexpr int max_exponent() const {
    return static_cast<int>(max_finite_code() >> mantissa_bits) - bias;
  }
  constexpr bool has_nan() const { return nan != NanEncoding::kNone; }
  constexpr bool has_inf() const { return inf != InfEncoding::kNone; }
};

// All rows, in enum order.
std::span<const FormatSpec> AllFormats();
const FormatSpec& Spec(Format f);
inline std::string_view Name(Format f) { return Spec(f).name; }
// Accepts the docs/design.md names and the dtype aliases ("fp16", "float8_e4m3fn", "fp32", ...).
std::optional<Format> ParseFormat(std::string_view name);
// The format a float DType stores (nullopt for integer dtypes) and back (nullopt for formats
// that have no safetensors dtype: e3m2fn, e2m3fn, e2m1fn travel as U8 codes).
std::optional<Format> FormatOf(DType dtype);
std::optional<DType> DTypeOf(Format f);

// IEEE 754 §4.3 rounding-direction attributes plus stochastic rounding.
enum class Rounding : uint8_t {
  kNearestEven,  // roundTiesToEven ("rne"); e8m0fnu significands are all 1: ties go up
  kTowardZero,   // roundTowardZero ("rz")
  kUp,           // roundTowardPositive ("ru")
  kDown,         // roundTowardNegative ("rd")
  kNearestAway,  // roundTiesToAway ("rna")
  kStochastic,   // round up iff floor(frac·2^32) + random_bits >= 2^32 (see EncodeOptions)
};
std::string_view Name(Rounding r);
std::optional<Rounding> ParseRounding(std::string_view name);  // rne rz ru rd rna sr

// What a finite result beyond the largest finite value (and an infinite input) becomes.
// Rounding happens first with an unbounded exponent (IEEE §7.4): e4m3fn RNE keeps 464 -> 448
// and only |x| > 464 overflows. For kInf/kNan/kDefault, modes that round toward zero for
// the sign at hand (RZ; RD for x > 0; RU for x < 0) deliver the largest finite value, as
// IEEE §7.4 prescribes; RNE, RNA, stochastic and the away-from-zero directed mode deliver
// the special value.
enum class Overflow : uint8_t {
  kSaturate,  // ±max finite (PTX .satfinite, OCP MX §5.3 for elements); Inf input too
  kInf,       // ±Inf where the format has Inf, else as kDefault
  kNan,       // NaN where the format has NaN (also for e5m2), else ±max finite
  kDefault,   // IEEE: Inf if the format has it, else NaN, else saturate (ml_dtypes behaviour)
};

// What NaN inputs become. Every NaN becomes the format's canonical quiet NaN (payloads are
// not propagated); the policy says what happens to the sign. A NaN produced by overflow or
// by Inf in a format without Inf always carries x's sign (it stands for ±Inf). Formats without NaN
// (fp6, fp4) deliver the largest finite magnitude with that sign, as PTX cvt.satfinite does for
// NaN.
enum class NanPolicy : uint8_t {
  kKeepSign,  // sign | canonical NaN (IEEE §6.3 leaves it open; ml_dtypes keeps it)
  kDropSign,  // +canonical NaN (NVIDIA host code: 0x7F for fp8, +max for fp6/fp4)
};

struct EncodeOptions {
  Rounding rounding = Rounding::kNearestEven;
  Overflow overflow = Overflow::kDefault;
  // Stochastic rounding only. Let frac in [0, 1) be the part of |x| below the result's last
  // place (in units of that place) and F = floor(frac · 2^32). The magnitude rounds up iff
  // F + random_bits >= 2^32, so P(up) = F / 2^32 for uniform random_bits: frac truncated to
  // a multiple of 2^-32 (exact when frac needs at most 32 bits: for fp32 inputs, whenever
  // |x| >= 2^-9 of the result's last place, since x has 24 significant bits). This is the "add random bits to the dropped bits, a carry
  // rounds up" formulation with the random bits aligned to the top of the dropped field
  // (docs/formats.md shows how to map a bottom-aligned rbits onto it).
  uint32_t random_bits = 0;
  NanPolicy nan = NanPolicy::kKeepSign;
  // Results below the smallest normal magnitude become ±0 (FTZ on the output; the input is
  // taken exactly). Formats without zero (e8m0fnu) deliver their smallest value instead.
  bool flush_subnormals = false;
};

// IEEE 754 §7 exception flags.
enum EncodeFlags : unsigned {
  kFlagNone = 0,
  kFlagInexact = 1u << 0,    // the result differs from x
  kFlagOverflow = 1u << 1,   // |x| rounded (unbounded exponent) exceeds the largest finite
  kFlagUnderflow = 1u << 2,  // a nonzero result below the smallest normal, inexact (tiny
                             // after rounding), or flushed to zero
  kFlagInvalid = 1u << 3,    // NaN input, or a value the format cannot hold at all
                             // (negative or zero into e8m0fnu, Inf/NaN into a format
                             // that has neither)
};

struct EncodeResult {
  uint64_t code = 0;  // right-aligned in code_mask()
  unsigned flags = kFlagNone;
};

// x rounded ONCE, directly to the format (no intermediate rounding through float).
EncodeResult Encode(double x, Format f, const EncodeOptions& options = {});
// The fp32 input path (exact widening to double, then the same single rounding).
EncodeResult EncodeF32(float x, Format f, const EncodeOptions& options = {});
// Exact value of a code (every format fits in double). NaN codes decode to the quiet double
// NaN with the code's sign (f64 codes are returned bit for bit, payload included). Bits
// above code_mask() are ignored.
double Decode(uint64_t code, Format f);
// Decode(Encode(x)).
double RoundTo(double x, Format f, const EncodeOptions& options = {});

// Code classification (bits above code_mask() are ignored).
bool IsNanCode(uint64_t code, Format f);
bool IsInfCode(uint64_t code, Format f);
// Largest finite value of the format (448 for e4m3fn, 2^127 for e8m0fnu).
double MaxFinite(Format f);
// Smallest positive value (smallest subnormal where the format has subnormals).
double MinPositive(Format f);
// Smallest positive normal value.
double MinNormal(Format f);

// ---- Tensor level (formats that have a DType) ----

// Exact widening of any float dtype (codes decoded) or integer dtype to a contiguous f64
// tensor of the same shape.
Tensor ToF64(const Tensor& t);
// Codes of `to` for every value of an f64 tensor (any strides); `to` must be a float dtype.
// U8 is not accepted here: use FromF64Codes for fp6/fp4.
Expected<Tensor> FromF64(const Tensor& t, DType to, const EncodeOptions& options = {});
// One code per byte (U8 tensor) for any format of <= 8 bits, including e3m2fn/e2m3fn/e2m1fn.
Expected<Tensor> FromF64Codes(const Tensor& t, Format to, const EncodeOptions& options = {});
// How many elements of a conversion raised each flag.
struct ConversionStats {
  int64_t elements = 0;
  int64_t inexact = 0;
  int64_t overflow = 0;
  int64_t underflow = 0;
  int64_t invalid = 0;
};
// Any float tensor (codes widened exactly first) converted to `to`, stored in the format's
// DType or, for e3m2fn/e2m3fn/e2m1fn, as U8 codes (one per byte). Fails for integer input.
Expected<Tensor> Convert(const Tensor& t, Format to, const EncodeOptions& options = {},
                         ConversionStats* stats = nullptr);
// The DType Convert stores `to` in (U8 for formats without a safetensors dtype).
DType StorageDType(Format to);

// f64 values rounded to `to` (Decode(Encode(x)) elementwise); contiguous f64 result.
Tensor RoundTensor(const Tensor& f64, DType to, const EncodeOptions& options = {});
Tensor RoundTensor(const Tensor& f64, Format to, const EncodeOptions& options = {});
// RoundTensor's values written over `f64`'s own elements (a contiguous F64 tensor; any tensor
// sharing its storage sees them), without a second tensor's pages.
void RoundTensorInPlace(Tensor& f64, DType to, const EncodeOptions& options = {});

}  // namespace attest
