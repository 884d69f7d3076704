// Segment tables of Fp32TableEncoder (see fp32_table_encoder.h).
#include "reference/formats/fp32_table_encoder.h"

#include <bit>
#include <cassert>
#include <string>

namespace attest {
namespace {

constexpr uint32_t kInfBits = 0x7F80'0000u;

uint64_t CodeOf(uint32_t mag, bool negative, Format f, const EncodeOptions& o) {
  const uint32_t bits = mag | (negative ? 0x8000'0000u : 0u);
  return EncodeF32(std::bit_cast<float>(bits), f, o).code;
}

// Appends the start of every segment in (lo, hi] to `starts`/`codes`, given that
// code(lo) = code_lo. Each code occupies one contiguous range of |x| (rounding is monotone
// in |x|, and the special results -- NaN for zero in e8m0fnu, Inf/NaN on overflow -- sit at
// the ends), so equal codes at both ends mean a constant interval.
void Bisect(uint32_t lo, uint64_t code_lo, uint32_t hi, uint64_t code_hi, bool negative, Format f,
            const EncodeOptions& o, std::vector<uint32_t>& starts, std::vector<uint64_t>& codes) {
  if (code_lo == code_hi) return;
  if (hi == lo + 1) {
    starts.push_back(hi);
    codes.push_back(code_hi);
    return;
  }
  const uint32_t mid = lo + (hi - lo) / 2;
  const uint64_t code_mid = CodeOf(mid, negative, f, o);
  Bisect(lo, code_lo, mid, code_mid, negative, f, o, starts, codes);
  Bisect(mid, code_mid, hi, code_hi, negative, f, o, starts, codes);
}

}  // namespace

Fp32TableEncoder::Table Fp32TableEncoder::Build(Format f, const EncodeOptions& o, bool negative) {
  Table t;
  // Zero is its own segment: in e8m0fnu it gives the NaN code that overflow gives again at
  // the top, the one code that is not contiguous in |x|.
  t.starts.push_back(0);
  t.codes.push_back(CodeOf(0, negative, f, o));
  const uint64_t code_one = CodeOf(1, negative, f, o);
  if (code_one != t.codes[0]) {
    t.starts.push_back(1);
    t.codes.push_back(code_one);
  }
  Bisect(1, code_one, kInfBits, CodeOf(kInfBits, negative, f, o), negative, f, o, t.starts,
         t.codes);
  t.used = t.starts.size();
  t.size = std::bit_ceil(static_cast<uint32_t>(t.used));
  t.starts.resize(t.size, 0xFFFF'FFFFu);
  t.codes.resize(t.size, t.codes.back());
  t.nan_code = CodeOf(0x7FC0'0000u, negative, f, o);
  return t;
}

Expected<Fp32TableEncoder> Fp32TableEncoder::Make(Format format, const EncodeOptions& options) {
  if (options.rounding == Rounding::kStochastic) {
    return Error{
        "Fp32TableEncoder: stochastic rounding depends on per-element random bits; "
        "use EncodeF32"};
  }
  Fp32TableEncoder e;
  e.format_ = format;
  e.positive_ = Build(format, options, false);
  e.negative_ = Build(format, options, true);
  return e;
}

void Fp32TableEncoder::Encode(std::span<const float> in, std::span<uint8_t> out) const {
  assert(in.size() == out.size() && Spec(format_).bits() <= 8);
  for (size_t i = 0; i < in.size(); ++i) out[i] = static_cast<uint8_t>(Encode(in[i]));
}

void Fp32TableEncoder::Encode(std::span<const float> in, std::span<uint16_t> out) const {
  assert(in.size() == out.size() && Spec(format_).bits() <= 16);
  for (size_t i = 0; i < in.size(); ++i) out[i] = static_cast<uint16_t>(Encode(in[i]));
}

}  // namespace attest
