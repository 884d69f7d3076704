// Test-only helpers for the element-format tests: an exact reference encoder written
// independently of format.cc (sorted table of representable values + exact comparisons in
// double, IEEE 754-2019 §4.3 / §7.4 read directly), fp32 sample sets (stratified residue
// classes and every rounding boundary) and a parallel loop over them.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "reference/formats/format.h"

namespace attest::testing {

// Format parameters typed again from the OCP OFP8 v1.0 / OCP MX v1.0 / IEEE 754 tables
// (deliberately not read from format.cc's rows).
struct RefFormat {
  Format format;
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool is_signed;
  bool ieee_specials;  // top exponent field = Inf (mantissa 0) / NaN
  bool fn_nan;         // only S.1..1.1..1 is NaN (e4m3fn)
  bool e8m0;           // unsigned, no zero, 0xFF = NaN, code c = 2^(c-127)
  uint64_t nan_code;   // canonical NaN magnitude (for formats without NaN: max finite)
};

inline const RefFormat& RefFormatOf(Format f) {
  static const RefFormat kRows[] = {
      {Format::kF64, 11, 52, 1023, true, true, false, false, 0x7FF8000000000000},
      {Format::kF32, 8, 23, 127, true, true, false, false, 0x7FC00000},
      {Format::kBF16, 8, 7, 127, true, true, false, false, 0x7FC0},
      {Format::kF16, 5, 10, 15, true, true, false, false, 0x7E00},
      {Format::kE4M3FN, 4, 3, 7, true, false, true, false, 0x7F},
      {Format::kE5M2, 5, 2, 15, true, true, false, false, 0x7E},
      {Format::kE3M2FN, 3, 2, 3, true, false, false, false, 0x1F},
      {Format::kE2M3FN, 2, 3, 1, true, false, false, false, 0x1F},
      {Format::kE2M1FN, 2, 1, 1, true, false, false, false, 0x7},
      {Format::kE8M0FNU, 8, 0, 127, false, false, false, true, 0xFF},
  };
  return kRows[static_cast<int>(f)];
}

// All finite non-negative values of a format (<= 16 bits) in increasing order, their codes,
// and the value the next code would have with an unbounded exponent (the overflow target).
class RefEncoder {
 public:
  explicit RefEncoder(Format f) : r_(RefFormatOf(f)) {
    const int mag_bits = r_.exponent_bits + r_.mantissa_bits;
    const uint64_t top = (uint64_t{1} << mag_bits) - 1;
    const uint64_t exp_all_ones = (uint64_t{1} << r_.exponent_bits) - 1;
    for (uint64_t c = 0; c <= top; ++c) {
      const uint64_t e = c >> r_.mantissa_bits;
      const uint64_t m = c & ((uint64_t{1} << r_.mantissa_bits) - 1);
      if (r_.ieee_specials && e == exp_all_ones) break;
      if ((r_.fn_nan || r_.e8m0) && c == top) break;
      values_.push_back(Value(e, m));
      codes_.push_back(c);
    }
    max_code_ = codes_.back();
    const uint64_t e_max = max_code_ >> r_.mantissa_bits;
    next_above_max_ =
        values_.back() + std::ldexp(1.0, static_cast<int>(e_max) - r_.bias - r_.mantissa_bits);
    sign_bit_ = r_.is_signed ? uint64_t{1} << mag_bits : 0;
    inf_code_ = exp_all_ones << r_.mantissa_bits;
  }

  const std::vector<double>& values() const { return values_; }
  uint64_t max_code() const { return max_code_; }
  double max_value() const { return values_.back(); }
  double next_above_max() const { return next_above_max_; }
  uint64_t sign_bit() const { return sign_bit_; }

  // The code IEEE 754 rounding of x gives, NaN sign kept (NanPolicy::kKeepSign), overflow
  // saturating or as Overflow::kDefault.
  uint64_t Encode(double x, Rounding rounding, bool saturate, uint32_t random_bits = 0) const {
    const bool neg = std::signbit(x);
    const uint64_t sign = neg ? sign_bit_ : 0;
    if (std::isnan(x)) return (r_.e8m0 ? 0 : sign) | r_.nan_code;
    if (r_.e8m0 && (neg || x == 0)) return r_.nan_code;
    const double a = std::fabs(x);
    if (std::isinf(a)) return saturate ? (sign | max_code_) : sign | Special();
    // Overflow beyond the unbounded-exponent successor of max: only toward-zero stays finite.
    const bool toward_zero = rounding == Rounding::kTowardZero ||
                             (rounding == Rounding::kDown && !neg) ||
                             (rounding == Rounding::kUp && neg);
    if (a >= next_above_max_) {
      return sign | ((saturate || toward_zero) ? max_code_ : Special());
    }
    // Neighbours lo <= a < hi.
    const auto it = std::upper_bound(values_.begin(), values_.end(), a);
    if (it == values_.begin()) return 0;  // e8m0: below 2^-127, nothing smaller exists
    const size_t i = static_cast<size_t>(it - values_.begin()) - 1;
    const double lo = values_[i];
    if (a == lo) return sign | codes_[i];
    const bool hi_virtual = i + 1 == values_.size();
    const double hi = hi_virtual ? next_above_max_ : values_[i + 1];
    const uint64_t hi_code = hi_virtual ? max_code_ + 1 : codes_[i + 1];
    const double mid = lo + (hi - lo) / 2;  // exact: one more bit than the format
    bool up = false;
    switch (rounding) {
      case Rounding::kNearestEven:
        if (a != mid) {
          up = a > mid;
        } else {
          // A one-digit significand (e8m0) has no even neighbour: the larger magnitude wins.
          up = r_.mantissa_bits == 0 ? true : (hi_code % 2 == 0);
        }
        break;
      case Rounding::kNearestAway:
        up = a >= mid;
        break;
      case Rounding::kTowardZero:
        up = false;
        break;
      case Rounding::kUp:
        up = !neg;
        break;
      case Rounding::kDown:
        up = neg;
        break;
      case Rounding::kStochastic: {
        const double frac = (a - lo) / (hi - lo);  // exact: hi - lo is a power of two
        const auto f32 = static_cast<uint64_t>(std::floor(std::ldexp(frac, 32)));
        up = f32 + random_bits >= (uint64_t{1} << 32);
        break;
      }
    }
    if (!up) return sign | codes_[i];
    if (hi_virtual) return sign | ((saturate || toward_zero) ? max_code_ : Special());
    return sign | hi_code;
  }

 private:
  double Value(uint64_t e, uint64_t m) const {
    if (r_.e8m0) return std::ldexp(1.0, static_cast<int>(e) - 127);
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - r_.bias - r_.mantissa_bits);
    return std::ldexp(static_cast<double>((uint64_t{1} << r_.mantissa_bits) + m),
                      static_cast<int>(e) - r_.bias - r_.mantissa_bits);
  }
  // Overflow without saturation: Inf if the format has it, else NaN, else max (ml_dtypes).
  uint64_t Special() const { return r_.ieee_specials ? inf_code_ : r_.nan_code; }

  RefFormat r_;
  std::vector<double> values_;
  std::vector<uint64_t> codes_;
  uint64_t max_code_ = 0;
  double next_above_max_ = 0;
  uint64_t sign_bit_ = 0;
  uint64_t inf_code_ = 0;
};

// fp32 inputs that sit on or next to a rounding decision of `ref`'s format: every
// representable value and every midpoint between neighbours (both signs, including the
// overflow midpoint max..next_above_max), each exactly (when fp32 holds it) and ±1 fp32 ulp;
// plus ±0, ±Inf, NaNs of both signs with several payloads, fp32 subnormal extremes and
// FLT_MAX.
inline std::vector<float> BoundaryInputs(const RefEncoder& ref) {
  std::vector<double> points;
  const auto& v = ref.values();
  for (size_t i = 0; i < v.size(); ++i) {
    points.push_back(v[i]);
    const double hi = i + 1 < v.size() ? v[i + 1] : ref.next_above_max();
    points.push_back(v[i] + (hi - v[i]) / 2);
  }
  points.push_back(ref.next_above_max());
  std::vector<float> out;
  for (double p : points) {
    for (double s : {1.0, -1.0}) {
      const double x = s * p;
      const auto f = static_cast<float>(x);  // nearest fp32 (overflow to Inf is fine)
      for (float c : {f, std::nextafter(f, -INFINITY), std::nextafter(f, INFINITY)}) {
        out.push_back(c);
        out.push_back(std::nextafter(c, -INFINITY));
        out.push_back(std::nextafter(c, INFINITY));
      }
    }
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            INFINITY,
                            -INFINITY,
                            std::bit_cast<float>(0x7FC00000u),
                            std::bit_cast<float>(0xFFC00000u),
                            std::bit_cast<float>(0x7F800001u),
                            std::bit_cast<float>(0xFF800001u),
                            std::bit_cast<float>(0x7FFFFFFFu),
                            std::bit_cast<float>(0xFFFFFFFFu),
                            std::bit_cast<float>(0x00000001u),
                            std::bit_cast<float>(0x80000001u),
                            std::bit_cast<float>(0x007FFFFFu),
                            std::bit_cast<float>(0x807FFFFFu),
                            std::bit_cast<float>(0x00800000u),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max()};
  out.insert(out.end(), std::begin(specials), std::end(specials));
  return out;
}

// Runs body(begin, end, worker) over [0, n) split across `threads` workers.
inline void ParallelFor(uint64_t n, const std::function<void(uint64_t, uint64_t, int)>& body,
                        int threads = 0) {
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  const uint64_t chunk = (n + static_cast<uint64_t>(threads) - 1) / static_cast<uint64_t>(threads);
  for (int t = 0; t < threads; ++t) {
    const uint64_t b = std::min(n, chunk * static_cast<uint64_t>(t));
    const uint64_t e = std::min(n, b + chunk);
    pool.emplace_back([&body, b, e, t] { body(b, e, t); });
  }
  for (auto& th : pool) th.join();
}

// Collects up to `limit` failure descriptions from several threads, counting all.
class FailureLog {
 public:
  explicit FailureLog(size_t limit = 8) : limit_(limit) {}
  void Add(const std::function<std::string()>& describe) {
    const uint64_t k = count_.fetch_add(1);
    if (k < limit_) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(describe());
    }
  }
  uint64_t count() const { return count_.load(); }
  std::string Summary() const {
    std::string s;
    for (const auto& l : lines_) s += l + "\n";
    return s;
  }

 private:
  size_t limit_;
  std::atomic<uint64_t> count_{0};
  std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace attest::testing
