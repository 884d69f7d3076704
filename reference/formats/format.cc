// The format table and the one generic encoder/decoder (see format.h; IEEE 754-2019 §4.3
// rounding, §7.4 overflow, §7.5 underflow; OCP OFP8 v1.0 and OCP MX v1.0 §5.3 encodings).
#include "reference/formats/format.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace attest {
namespace {

constexpr auto kIeeeInf = InfEncoding::kIeee;
constexpr auto kNoInf = InfEncoding::kNone;

// Rows follow the Format enum. Canonical NaNs: IEEE quiet NaN with an empty payload for the
// IEEE formats (0x7FC00000 for f32, 0x7FC0 for bf16 as PyTorch CPU), 0x7E for e5m2 (quiet
// bit set, ml_dtypes), the single NaN for e4m3fn (S.1111.111) and e8m0fnu (0xFF).
constexpr std::array<FormatSpec, kNumFormats> kFormats = {{
    {Format::kF64, "f64", 11, 52, 1023, true, kIeeeInf, NanEncoding::kIeee, true, true,
     0x7FF8'0000'0000'0000},
    {Format::kF32, "f32", 8, 23, 127, true, kIeeeInf, NanEncoding::kIeee, true, true, 0x7FC0'0000},
    {Format::kBF16, "bf16", 8, 7, 127, true, kIeeeInf, NanEncoding::kIeee, true, true, 0x7FC0},
    {Format::kF16, "f16", 5, 10, 15, true, kIeeeInf, NanEncoding::kIeee, true, true, 0x7E00},
    {Format::kE4M3FN, "e4m3fn", 4, 3, 7, true, kNoInf, NanEncoding::kAllOnes, true, true,
     0b0'1111'111},
    {Format::kE5M2, "e5m2", 5, 2, 15, true, kIeeeInf, NanEncoding::kIeee, true, true, 0b0'11111'10},
    {Format::kE3M2FN, "e3m2fn", 3, 2, 3, true, kNoInf, NanEncoding::kNone, true, true, 0},
    {Format::kE2M3FN, "e2m3fn", 2, 3, 1, true, kNoInf, NanEncoding::kNone, true, true, 0},
    {Format::kE2M1FN, "e2m1fn", 2, 1, 1, true, kNoInf, NanEncoding::kNone, true, true, 0},
    {Format::kE8M0FNU, "e8m0fnu", 8, 0, 127, false, kNoInf, NanEncoding::kOnlyAllOnesUnsigned,
     false, false, 0xFF},
}};

constexpr bool TableIsConsistent() {
  for (size_t i = 0; i < kFormats.size(); ++i) {
    const FormatSpec& s = kFormats[i];
    if (static_cast<size_t>(s.format) != i) return false;
    // Without subnormals exponent field 0 is a normal binade, so there is no room for zero.
    if (!s.has_subnormals && s.has_zero) return false;
    if (s.bits() > 64 || s.mantissa_bits > 52) return false;
  }
  return true;
}
static_assert(TableIsConsistent(), "kFormats rows must follow the Format enum");
// Spot checks against OCP OFP8 v1.0 Table 1 / OCP MX v1.0 Table 4 / docs/references.md.
static_assert(kFormats[4].max_finite_code() == 0x7E && kFormats[4].max_exponent() == 8);
static_assert(kFormats[5].max_finite_code() == 0x7B && kFormats[5].max_exponent() == 15);
static_assert(kFormats[6].max_exponent() == 4 && kFormats[7].max_exponent() == 2);
static_assert(kFormats[8].max_finite_code() == 0x7 && kFormats[8].max_exponent() == 2);
static_assert(kFormats[9].max_finite_code() == 0xFE && kFormats[9].max_exponent() == 127);
static_assert(kFormats[9].min_normal_exponent() == -127);

struct FormatAlias {
  std::string_view alias;
  Format format;
};
constexpr std::array<FormatAlias, 20> kFormatAliases = {{
    {"fp64", Format::kF64},
    {"float64", Format::kF64},
    {"fp32", Format::kF32},
    {"float32", Format::kF32},
    {"bfloat16", Format::kBF16},
    {"fp16", Format::kF16},
    {"float16", Format::kF16},
    {"e4m3", Format::kE4M3FN},
    {"float8_e4m3fn", Format::kE4M3FN},
    {"float8_e5m2", Format::kE5M2},
    {"e3m2", Format::kE3M2FN},
    {"float6_e3m2fn", Format::kE3M2FN},
    {"e2m3", Format::kE2M3FN},
    {"float6_e2m3fn", Format::kE2M3FN},
    {"e2m1", Format::kE2M1FN},
    {"float4_e2m1fn", Format::kE2M1FN},
    {"fp4", Format::kE2M1FN},
    {"e8m0", Format::kE8M0FNU},
    {"float8_e8m0fnu", Format::kE8M0FNU},
    {"ue8m0", Format::kE8M0FNU},
}};

struct DTypeFormat {
  DType dtype;
  Format format;
};
constexpr std::array<DTypeFormat, 7> kDTypeFormats = {{
    {DType::kF64, Format::kF64},
    {DType::kF32, Format::kF32},
    {DType::kBF16, Format::kBF16},
    {DType::kF16, Format::kF16},
    {DType::kE4M3FN, Format::kE4M3FN},
    {DType::kE5M2, Format::kE5M2},
    {DType::kE8M0FNU, Format::kE8M0FNU},
}};

constexpr std::array<std::string_view, 6> kRoundingNames = {"rne", "rz", "ru", "rd", "rna", "sr"};

uint64_t NanCode(const FormatSpec& s, bool negative, NanPolicy policy) {
  const uint64_t sign = (negative && policy == NanPolicy::kKeepSign) ? s.sign_mask() : 0;
  if (s.has_nan()) return sign | s.canonical_nan;
  // PTX cvt.satfinite for formats without NaN: NaN -> max finite (PTX ISA §9.7.9.21).
  return sign | s.max_finite_code();
}

uint64_t InfCode(const FormatSpec& s) {
  return s.magnitude_mask() - ((uint64_t{1} << s.mantissa_bits) - 1);
}

// The result for a finite x whose rounded magnitude exceeds the largest finite value.
EncodeResult OverflowResult(const FormatSpec& s, bool negative, const EncodeOptions& o,
                            bool toward_zero) {
  const uint64_t sign = negative ? s.sign_mask() : 0;
  EncodeResult r{sign | s.max_finite_code(), kFlagOverflow | kFlagInexact};
  if (o.overflow == Overflow::kSaturate || toward_zero) return r;
  if ((o.overflow == Overflow::kInf || o.overflow == Overflow::kDefault) && s.has_inf()) {
    r.code = sign | InfCode(s);
  } else if (s.has_nan()) {
    // Overflow is signed like ±Inf whatever the NaN policy (NVIDIA host code: -1e30 -> 0xFF
    // for e4m3 although NaN inputs lose their sign).
    r.code = sign | s.canonical_nan;
  }
  return r;
}

// The result for x = ±Inf (exact, so no overflow unless it has to become finite).
EncodeResult InfResult(const FormatSpec& s, bool negative, const EncodeOptions& o) {
  const uint64_t sign = negative ? s.sign_mask() : 0;
  if (o.overflow != Overflow::kSaturate) {
    if (s.has_inf() && o.overflow != Overflow::kNan) return {sign | InfCode(s), kFlagNone};
    if (s.has_nan()) return {sign | s.canonical_nan, kFlagInvalid};
  }
  return {sign | s.max_finite_code(), kFlagOverflow | kFlagInexact};
}

inline bool RoundsTowardZero(Rounding r, bool negative) {
  return r == Rounding::kTowardZero || (r == Rounding::kDown && !negative) ||
         (r == Rounding::kUp && negative);
}

// Inlined into one instantiation per row (EncodeRow<I>), so that every field of `s` is a
// compile-time constant there.
[[gnu::always_inline]] inline EncodeResult EncodeImpl(double x, const FormatSpec& s,
                                                      const EncodeOptions& o) {
  const uint64_t xb = std::bit_cast<uint64_t>(x);
  const bool negative = (xb >> 63) != 0;
  const int x_exp_field = static_cast<int>((xb >> 52) & 0x7FF);
  const uint64_t x_frac = xb & ((uint64_t{1} << 52) - 1);
  const int m_bits = s.mantissa_bits;
  const uint64_t sign = negative ? s.sign_mask() : 0;

  // 1. Non-finite inputs.
  if (x_exp_field == 0x7FF) {
    if (x_frac != 0) return {NanCode(s, negative, o.nan), kFlagInvalid};
    if (negative && !s.is_signed) return {NanCode(s, false, o.nan), kFlagInvalid};
    return InfResult(s, negative, o);
  }
  // 2. Zero, and values an unsigned or zero-less format cannot hold (ml_dtypes: 0 and
  //    negatives -> NaN for e8m0fnu).
  if (x == 0.0) {
    if (s.has_zero) return {s.is_signed ? sign : 0, kFlagNone};
    return {NanCode(s, false, o.nan), kFlagInvalid};
  }
  if (negative && !s.is_signed) return {NanCode(s, false, o.nan), kFlagInvalid};

  // 3. |x| = sig · 2^x_exp exactly, sig an integer below 2^53.
  uint64_t sig;
  int x_exp;
  if (x_exp_field == 0) {
    sig = x_frac;
    x_exp = -1074;
  } else {
    sig = x_frac | (uint64_t{1} << 52);
    x_exp = x_exp_field - 1075;
  }
  const int log2_x = (63 - std::countl_zero(sig)) + x_exp;  // floor(log2|x|)
  const int emin = s.min_normal_exponent();
  // Beyond the top binade + 1 even round-toward-zero exceeds max finite.
  if (log2_x > s.max_exponent() + 1) {
    return OverflowResult(s, negative, o, RoundsTowardZero(o.rounding, negative));
  }

  // 4. Split |x| / 2^q, q the exponent of the result's last place, into the integer n and the
  //    discarded fraction (half bit, sticky, and its top 32 bits for stochastic rounding).
  const int q = std::max(log2_x, emin) - m_bits;
  const int shift = q - x_exp;
  uint64_t n;
  bool half = false, sticky = false;
  uint64_t frac32 = 0;
  if (shift <= 0) {
    n = sig << -shift;  // exact; n < 2^(m_bits + 2) because log2_x <= max_exponent + 1
  } else {
    const uint64_t rem = shift >= 64 ? sig : sig & ((uint64_t{1} << shift) - 1);
    n = shift >= 64 ? 0 : sig >> shift;
    if (shift - 1 < 64) {
      half = ((sig >> (shift - 1)) & 1) != 0;
      sticky = (sig & ((uint64_t{1} << (shift - 1)) - 1)) != 0;
    } else {
      sticky = sig != 0;
    }
    if (shift <= 32) {
      frac32 = rem << (32 - shift);
    } else if (shift - 32 < 64) {
      frac32 = rem >> (shift - 32);
    }
  }
  const bool inexact = half || sticky;

  // 5. Round the magnitude (n may carry into the next binade: n == 2^(m_bits+1) encodes it).
  bool up = false;
  switch (o.rounding) {
    case Rounding::kNearestEven:
      up = half && (sticky || (n & 1) != 0);
      break;
    case Rounding::kNearestAway:
      up = half;
      break;
    case Rounding::kTowardZero:
      up = false;
      break;
    case Rounding::kUp:
      up = inexact && !negative;
      break;
    case Rounding::kDown:
      up = inexact && negative;
      break;
    case Rounding::kStochastic:
      up = frac32 + o.random_bits >= (uint64_t{1} << 32);
      break;
  }
  n += up ? 1 : 0;
  unsigned flags = inexact ? kFlagInexact : kFlagNone;

  // 6. Below the smallest normal: subnormal, zero, flushed, or clamped in a zero-less format.
  const uint64_t implicit = uint64_t{1} << m_bits;
  if (n < implicit) {
    if (inexact) flags |= kFlagUnderflow;
    if (!s.has_subnormals) {
      // e8m0fnu has nothing below 2^-127: the smallest value is the best it can do (as the
      // NVIDIA host code's cvt.rz/rp.ue8m0 delivers 0x00 there).
      return {0, flags | kFlagUnderflow | kFlagInexact};
    }
    if (o.flush_subnormals && n != 0) return {sign, flags | kFlagUnderflow | kFlagInexact};
    return {sign | n, flags};
  }

  // 7. Assemble: binade index k above the lowest normal binade, then the code.
  const uint64_t k = static_cast<uint64_t>(q - (emin - m_bits));
  const uint64_t magnitude = k * implicit + n - (s.has_subnormals ? 0 : implicit);
  if (magnitude > s.max_finite_code()) {
    return OverflowResult(s, negative, o, RoundsTowardZero(o.rounding, negative));
  }
  return {sign | magnitude, flags};
}

template <size_t I>
EncodeResult EncodeRow(double x, const EncodeOptions& o) {
  return EncodeImpl(x, kFormats[I], o);
}

using EncodeFn = EncodeResult (*)(double, const EncodeOptions&);
template <size_t... I>
constexpr std::array<EncodeFn, sizeof...(I)> MakeEncoders(std::index_sequence<I...>) {
  return {&EncodeRow<I>...};
}
constexpr auto kEncoders = MakeEncoders(std::make_index_sequence<kNumFormats>());

}  // namespace

std::span<const FormatSpec> AllFormats() { return kFormats; }

const FormatSpec& Spec(Format f) { return kFormats[static_cast<size_t>(f)]; }

std::optional<Format> ParseFormat(std::string_view name) {
  for (const auto& row : kFormats) {
    if (row.name == name) return row.format;
  }
  for (const auto& row : kFormatAliases) {
    if (row.alias == name) return row.format;
  }
  return std::nullopt;
}

std::optional<Format> FormatOf(DType dtype) {
  for (const auto& row : kDTypeFormats) {
    if (row.dtype == dtype) return row.format;
  }
  return std::nullopt;
}

std::optional<DType> DTypeOf(Format f) {
  for (const auto& row : kDTypeFormats) {
    if (row.format == f) return row.dtype;
  }
  return std::nullopt;
}

std::string_view Name(Rounding r) { return kRoundingNames[static_cast<size_t>(r)]; }

std::optional<Rounding> ParseRounding(std::string_view name) {
  for (size_t i = 0; i < kRoundingNames.size(); ++i) {
    if (kRoundingNames[i] == name) return static_cast<Rounding>(i);
  }
  if (name == "stochastic") return Rounding::kStochastic;
  return std::nullopt;
}

EncodeResult Encode(double x, Format f, const EncodeOptions& options) {
  return kEncoders[static_cast<size_t>(f)](x, options);
}

EncodeResult EncodeF32(float x, Format f, const EncodeOptions& options) {
  // float -> double is exact, so this is still a single rounding.
  return kEncoders[static_cast<size_t>(f)](static_cast<double>(x), options);
}

bool IsNanCode(uint64_t code, Format f) {
  const FormatSpec& s = Spec(f);
  const uint64_t mag = code & s.magnitude_mask();
  switch (s.nan) {
    case NanEncoding::kNone:
      return false;
    case NanEncoding::kIeee:
      return mag > InfCode(s);
    case NanEncoding::kAllOnes:
    case NanEncoding::kOnlyAllOnesUnsigned:
      return mag == s.magnitude_mask();
  }
  return false;
}

bool IsInfCode(uint64_t code, Format f) {
  const FormatSpec& s = Spec(f);
  return s.has_inf() && (code & s.magnitude_mask()) == InfCode(s);
}

namespace {

// 2^k for k in the normal range of double, built from its bits.
inline double Pow2(int k) { return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52); }

// Inlined into one instantiation per row, like EncodeImpl. Every non-f64 value is a normal
// double, so it is assembled from bits (f64 codes are the double's own bits).
[[gnu::always_inline]] inline double DecodeImpl(uint64_t code, const FormatSpec& s) {
  code &= s.code_mask();
  if (s.format == Format::kF64) return std::bit_cast<double>(code);
  const bool negative = (code & s.sign_mask()) != 0;
  const uint64_t mag = code & s.magnitude_mask();
  const uint64_t sign64 = negative ? uint64_t{1} << 63 : 0;
  const bool nan =
      (s.nan == NanEncoding::kIeee && mag > InfCode(s)) ||
      ((s.nan == NanEncoding::kAllOnes || s.nan == NanEncoding::kOnlyAllOnesUnsigned) &&
       mag == s.magnitude_mask());
  if (nan) return std::bit_cast<double>(sign64 | 0x7FF8'0000'0000'0000);
  if (s.has_inf() && mag == InfCode(s)) {
    return std::bit_cast<double>(sign64 | 0x7FF0'0000'0000'0000);
  }
  const int e = static_cast<int>(mag >> s.mantissa_bits);
  const uint64_t m = mag & ((uint64_t{1} << s.mantissa_bits) - 1);
  if (s.has_subnormals && e == 0) {
    // m · 2^(emin - M): exact (m has at most 23 bits, the power of two is a normal double).
    const double v = static_cast<double>(m) * Pow2(s.min_normal_exponent() - s.mantissa_bits);
    return negative ? -v : v;
  }
  const int exponent = e - s.bias;
  return std::bit_cast<double>(sign64 | (static_cast<uint64_t>(exponent + 1023) << 52) |
                               (m << (52 - s.mantissa_bits)));
}

template <size_t I>
double DecodeRow(uint64_t code) {
  return DecodeImpl(code, kFormats[I]);
}

using DecodeFn = double (*)(uint64_t);
template <size_t... I>
constexpr std::array<DecodeFn, sizeof...(I)> MakeDecoders(std::index_sequence<I...>) {
  return {&DecodeRow<I>...};
}
constexpr auto kDecoders = MakeDecoders(std::make_index_sequence<kNumFormats>());

}  // namespace

double Decode(uint64_t code, Format f) { return kDecoders[static_cast<size_t>(f)](code); }

double RoundTo(double x, Format f, const EncodeOptions& options) {
  return Decode(Encode(x, f, options).code, f);
}

double MaxFinite(Format f) { return Decode(Spec(f).max_finite_code(), f); }

double MinPositive(Format f) { return Decode(Spec(f).has_zero ? 1 : 0, f); }

double MinNormal(Format f) {
  const FormatSpec& s = Spec(f);
  return std::ldexp(1.0, s.min_normal_exponent());
}

// ---- Tensor level ----

namespace {

// Reads element `offset` (in elements) of any dtype as a double, exactly.
double LoadAsF64(const Tensor& t, int64_t offset) {
  const std::byte* p = t.bytes() + offset * SizeOf(t.dtype());
  switch (t.dtype()) {
    case DType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return Decode(v, *FormatOf(t.dtype()));
    }
    case DType::kE4M3FN:
    case DType::kE5M2:
    case DType::kE8M0FNU:
      return Decode(static_cast<uint8_t>(*p), *FormatOf(t.dtype()));
    case DType::kU8:
      return static_cast<double>(static_cast<uint8_t>(*p));
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      // int64 beyond 2^53 is not exactly representable; widening must be exact.
      if (v > (int64_t{1} << 53) || v < -(int64_t{1} << 53)) {
        throw std::domain_error("ToF64: int64 value " + std::to_string(v) +
                                " is not exactly representable in f64");
      }
      return static_cast<double>(v);
    }
  }
  return 0.0;
}

void StoreCode(const Tensor& out, int64_t index, uint64_t code) {
  std::byte* p = out.bytes() + index * SizeOf(out.dtype());
  switch (SizeOf(out.dtype())) {
    case 8:
      std::memcpy(p, &code, 8);
      break;
    case 4: {
      const auto c = static_cast<uint32_t>(code);
      std::memcpy(p, &c, 4);
      break;
    }
    case 2: {
      const auto c = static_cast<uint16_t>(code);
      std::memcpy(p, &c, 2);
      break;
    }
    default:
      *p = static_cast<std::byte>(code);
      break;
  }
}

// Calls fn(linear_index, element_offset) over a tensor in row-major order.
template <class Fn>
void ForEachElement(const Tensor& t, Fn&& fn) {
  if (t.contiguous()) {
    for (int64_t i = 0; i < t.numel(); ++i) fn(i, i);
    return;
  }
  int64_t i = 0;
  ForEachIndex(t.shape(), [&](std::span<const int64_t> index) { fn(i++, t.Offset(index)); });
}

Expected<Tensor> EncodeTensor(const Tensor& t, Format to, DType out_dtype,
                              const EncodeOptions& options) {
  if (!t.defined() || t.dtype() != DType::kF64) {
    return Error{"FromF64: input tensor must be f64, got " + t.Describe()};
  }
  Tensor out = Tensor::Zeros(out_dtype, t.shape());
  const double* data = t.data<double>();
  ForEachElement(
      t, [&](int64_t i, int64_t off) { StoreCode(out, i, Encode(data[off], to, options).code); });
  return out;
}

}  // namespace

Tensor ToF64(const Tensor& t) {
  Tensor out = Tensor::Zeros(DType::kF64, t.shape());
  double* dst = out.data<double>();
  ForEachElement(t, [&](int64_t i, int64_t off) { dst[i] = LoadAsF64(t, off); });
  return out;
}

Expected<Tensor> FromF64(const Tensor& t, DType to, const EncodeOptions& options) {
  const auto format = FormatOf(to);
  if (!format) {
    return Error{"FromF64: target dtype " + std::string(Name(to)) +
                 " is not a float format (use FromF64Codes for U8 codes)"};
  }
  return EncodeTensor(t, *format, to, options);
}

Expected<Tensor> FromF64Codes(const Tensor& t, Format to, const EncodeOptions& options) {
  if (Spec(to).bits() > 8) {
    return Error{"FromF64Codes: format " + std::string(Name(to)) +
                 " has more than 8 bits and cannot be stored one code per byte"};
  }
  return EncodeTensor(t, to, DType::kU8, options);
}

DType StorageDType(Format to) { return DTypeOf(to).value_or(DType::kU8); }

Expected<Tensor> Convert(const Tensor& t, Format to, const EncodeOptions& options,
                         ConversionStats* stats) {
  if (!t.defined() || !Info(t.dtype()).is_float) {
    return Error{"Convert: input must be a float tensor, got " +
                 (t.defined() ? t.Describe() : std::string("an undefined tensor"))};
  }
  if (Spec(to).bits() > 8 && !DTypeOf(to)) {
    return Error{"Convert: no storage dtype for " + std::string(Name(to))};
  }
  const Tensor wide = t.dtype() == DType::kF64 ? t : ToF64(t);
  Tensor out = Tensor::Zeros(StorageDType(to), t.shape());
  const double* data = wide.data<double>();
  ConversionStats local;
  ForEachElement(wide, [&](int64_t i, int64_t off) {
    const EncodeResult r = Encode(data[off], to, options);
    StoreCode(out, i, r.code);
    local.inexact += (r.flags & kFlagInexact) ? 1 : 0;
    local.overflow += (r.flags & kFlagOverflow) ? 1 : 0;
    local.underflow += (r.flags & kFlagUnderflow) ? 1 : 0;
    local.invalid += (r.flags & kFlagInvalid) ? 1 : 0;
  });
  local.elements = t.numel();
  if (stats != nullptr) *stats = local;
  return out;
}

namespace {

// RoundTo(x, f, options) for f32, bf16 and f16 under the default options (round to nearest
// even, overflow to ±Inf, subnormals kept), without the encoding: with q the exponent of the
// result's last place (floor(log2|x|) - mantissa bits, at least that of the subnormals) and
// c = 1.5 · 2^(q + 52), |x| + c lies in c's binade, whose ulp is 2^q, so that one addition
// rounds |x| to a multiple of 2^q, to nearest, ties to even (c / 2^q is even), and
// subtracting c is exact (Sterbenz). The sign is put back last, so ±0 come out as Encode
// gives them; NaN go through RoundTo. format_test compares it with RoundTo.
class NearestIeee {
 public:
  static std::optional<NearestIeee> For(Format f, const EncodeOptions& o) {
    if (f != Format::kF32 && f != Format::kBF16 && f != Format::kF16) return std::nullopt;
    if (o.rounding != Rounding::kNearestEven || o.overflow != Overflow::kDefault ||
        o.flush_subnormals) {
      return std::nullopt;
    }
    const FormatSpec& s = Spec(f);
    return NearestIeee(f, s.mantissa_bits, s.min_normal_exponent(), s.max_exponent(),
                       MaxFinite(f));
  }

  double operator()(double x) const {
    const auto bits = std::bit_cast<uint64_t>(x);
    const int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023;  // floor(log2|x|) if normal
    if (e == 1024) return RoundTo(x, format_);                       // Inf and NaN
    if (e > emax_) return std::copysign(std::numeric_limits<double>::infinity(), x);
    const int q = std::max(e, emin_) - mantissa_bits_;
    const double c = std::bit_cast<double>((static_cast<uint64_t>(q + 52 + 1023) << 52) |
                                           (uint64_t{1} << 51));
    double r = (std::abs(x) + c) - c;
    if (r > max_finite_) r = std::numeric_limits<double>::infinity();
    return std::copysign(r, x);
  }

 private:
  NearestIeee(Format f, int mantissa_bits, int emin, int emax, double max_finite)
      : format_(f), mantissa_bits_(mantissa_bits), emin_(emin), emax_(emax),
        max_finite_(max_finite) {}
  Format format_;
  int mantissa_bits_, emin_, emax_;
  double max_finite_;
};

// dst[i] = RoundTo(src[i]) for the n elements of a contiguous f64 tensor. Each element is
// rounded on its own, so a large tensor is split across threads (the inputs of `attest
// oracle` and of every check pass through here).
void RoundContiguous(const double* src, double* dst, int64_t n, Format to,
                     const EncodeOptions& options) {
  const std::optional<NearestIeee> nearest = NearestIeee::For(to, options);
  auto round_range = [&](int64_t begin, int64_t end) {
    if (nearest) {
      for (int64_t i = begin; i < end; ++i) dst[i] = (*nearest)(src[i]);
    } else {
      for (int64_t i = begin; i < end; ++i) dst[i] = RoundTo(src[i], to, options);
    }
  };
  constexpr int64_t kMinPerThread = int64_t{1} << 17;
  const int64_t threads = std::clamp<int64_t>(
      n / kMinPerThread, 1, std::max<int64_t>(1, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    pool.emplace_back(round_range, std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
  }
  round_range(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

}  // namespace

Tensor RoundTensor(const Tensor& f64, Format to, const EncodeOptions& options) {
  if (!f64.defined() || f64.dtype() != DType::kF64) {
    throw std::invalid_argument("RoundTensor: input tensor must be f64, got " + f64.Describe());
  }
  Tensor out = Tensor::Zeros(DType::kF64, f64.shape());
  double* dst = out.data<double>();
  const double* src = f64.data<double>();
  if (f64.contiguous()) {
    RoundContiguous(src, dst, f64.numel(), to, options);
  } else {
    ForEachElement(f64, [&](int64_t i, int64_t off) { dst[i] = RoundTo(src[off], to, options); });
  }
  return out;
}

namespace {

// The float format of `to`, or std::invalid_argument naming the caller.
Format RoundTarget(DType to, const char* caller) {
  const auto format = FormatOf(to);
  if (!format) {
    throw std::invalid_argument(std::string(caller) + ": target dtype " +
                                std::string(Name(to)) + " is not a float format");
  }
  return *format;
}

}  // namespace

void RoundTensorInPlace(Tensor& f64, DType to, const EncodeOptions& options) {
  const Format format = RoundTarget(to, "RoundTensorInPlace");
  if (!f64.defined() || f64.dtype() != DType::kF64 || !f64.contiguous()) {
    throw std::invalid_argument("RoundTensorInPlace: tensor must be contiguous f64, got " +
                                f64.Describe());
  }
  double* x = f64.data<double>();
  RoundContiguous(x, x, f64.numel(), format, options);  // elementwise: in place is safe
}

Tensor RoundTensor(const Tensor& f64, DType to, const EncodeOptions& options) {
  return RoundTensor(f64, RoundTarget(to, "RoundTensor"), options);
}

}  // namespace attest
