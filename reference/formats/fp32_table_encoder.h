// Fast fp32 -> narrow-format encoder for bulk conversion (docs/formats.md): for one
// (format, options) pair, the code is a step function of the fp32 bit pattern of |x|
// (rounding is monotone), so it is stored as the list of bit patterns where
// EncodeF32's output changes, found by bisection with EncodeF32 itself, and looked up by a
// branchless binary search. Bit-identical to EncodeF32 by construction, and tested so over a
// stratified sample (and all 2^32 inputs with ATTEST_FORMAT_SWEEP=exhaustive).
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "reference/formats/format.h"
#include "reference/status.h"

namespace attest {

class Fp32TableEncoder {
 public:
  // Any format and deterministic rounding mode (stochastic rounding depends on per-element
  // random bits and is refused).
  static Expected<Fp32TableEncoder> Make(Format format, const EncodeOptions& options = {});

  // The code EncodeF32(x, format, options) returns (flags are not computed).
  uint64_t Encode(float x) const {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint32_t mag = bits & 0x7FFF'FFFFu;
    const Table& t = (bits >> 31) ? negative_ : positive_;
    if (mag > 0x7F80'0000u) return t.nan_code;
    // Largest i with t.starts[i] <= mag; starts[0] = 0 and padding is 0xFFFFFFFF.
    uint32_t i = 0;
    for (uint32_t step = t.size / 2; step > 0; step /= 2) {
      i = (t.starts[i + step] <= mag) ? i + step : i;
    }
    return t.codes[i];
  }
  // Bulk conversion of a span; out must have in.size() elements (codes truncated to 8 bits
  // for the uint8_t overload, which requires a format of at most 8 bits).
  void Encode(std::span<const float> in, std::span<uint8_t> out) const;
  void Encode(std::span<const float> in, std::span<uint16_t> out) const;

  Format format() const { return format_; }
  // Number of constant segments for x >= 0 (e4m3fn RNE: 128).
  size_t segments() const { return positive_.used; }

 private:
  struct Table {
    std::vector<uint32_t> starts;  // first |x| bit pattern of each segment, padded
    std::vector<uint64_t> codes;   // code of each segment
    uint32_t size = 0;             // power of two >= used
    size_t used = 0;
    uint64_t nan_code = 0;
  };
  static Table Build(Format format, const EncodeOptions& options, bool negative);

  Format format_ = Format::kE4M3FN;
  Table positive_;
  Table negative_;
};

}  // namespace attest
