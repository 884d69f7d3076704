// Cross-check of EncodeF32/Decode against NVIDIA's host conversion code in the CUDA toolkit
// headers (cuda_bf16.hpp __float2bfloat16_rn, cuda_fp16.hpp __float2half_rn, cuda_fp8.hpp
// __nv_cvt_float_to_fp8 / __nv_cvt_float_to_e8m0 / __nv_cvt_fp8_to_halfraw, cuda_fp6.hpp,
// cuda_fp4.hpp), compiled by g++ on the host. Inputs: the stratified fp32 sample of
// format_sweep_test (stride 83) plus every rounding boundary. Each intended difference
// (docs/formats.md, "Differences from NVIDIA host code") is asserted as such, not skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "reference/formats/format.h"
#include "reference/formats/format_test_util.h"

namespace attest {
namespace {

using testing::FailureLog;
using testing::ParallelFor;
using testing::RefEncoder;

constexpr uint64_t kStride = 83;

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// What NVIDIA returns for x, and what we return with the options that model it. `expect`
// may replace our code by the documented NVIDIA value for the inputs where we differ on
// purpose; it returns nullopt when no difference is intended.
struct Comparison {
  std::string name;
  Format format;
  EncodeOptions options;
  std::function<uint64_t(float)> nvidia;
  std::function<std::optional<uint64_t>(float)> intended;
};

void Compare(const Comparison& c) {
  FailureLog log;
  uint64_t intended_count = 0;
  std::atomic<uint64_t> intended_seen{0};
  const auto check = [&](float x) {
    const uint64_t theirs = c.nvidia(x);
    uint64_t want = EncodeF32(x, c.format, c.options).code;
    if (const auto d = c.intended(x)) {
      intended_seen.fetch_add(1, std::memory_order_relaxed);
      want = *d;
    }
    if (theirs != want) {
      log.Add([&] {
        return c.name + ": x=" + Hex(std::bit_cast<uint32_t>(x)) + " nvidia " + Hex(theirs) +
               " expected " + Hex(want);
      });
    }
  };
  const uint64_t count = ((uint64_t{1} << 32) - 5 + kStride - 1) / kStride;
  ParallelFor(count, [&](uint64_t b, uint64_t e, int) {
    for (uint64_t j = b; j < e; ++j)
      check(std::bit_cast<float>(static_cast<uint32_t>(5 + kStride * j)));
  });
  const auto boundaries = testing::BoundaryInputs(RefEncoder(c.format));
  for (float x : boundaries) check(x);
  intended_count = intended_seen.load();
  std::printf("[ nvidia   ] %-24s %llu inputs, %llu intended differences, %llu mismatches\n",
              c.name.c_str(), static_cast<unsigned long long>(count + boundaries.size()),
              static_cast<unsigned long long>(intended_count),
              static_cast<unsigned long long>(log.count()));
  EXPECT_EQ(log.count(), 0u) << log.Summary();
}

bool IsNan(float x) { return std::isnan(x); }

// NVIDIA's NaN for bf16/f16 is 0x7FFF (sign dropped); ours is the IEEE canonical quiet NaN
// with the sign kept (0x7FC0 / 0x7E00), as PyTorch CPU and ml_dtypes.
TEST(NvidiaHost, Bf16AndF16NearestEven) {
  Compare({"f32->bf16 rn",
           Format::kBF16,
           {},
           [](float x) -> uint64_t {
             const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
             return r.x;
           },
           [](float x) -> std::optional<uint64_t> {
             if (IsNan(x)) return 0x7FFF;
             return std::nullopt;
           }});
  Compare({"f32->f16 rn",
           Format::kF16,
           {},
           [](float x) -> uint64_t {
             const __half_raw r = __float2half_rn(x);
             return r.x;
           },
           [](float x) -> std::optional<uint64_t> {
             if (IsNan(x)) return 0x7FFF;
             return std::nullopt;
           }});
}

// e4m3: identical with NanPolicy::kDropSign (NaN -> 0x7F; overflow keeps its sign: 0xFF).
// e5m2: NVIDIA's NaN is 0x7F, ours the quiet NaN 0x7E (ml_dtypes).
TEST(NvidiaHost, Fp8SaturatingAndNot) {
  for (bool sat : {false, true}) {
    const EncodeOptions o{.overflow = sat ? Overflow::kSaturate : Overflow::kDefault,
                          .nan = NanPolicy::kDropSign};
    const auto mode = sat ? __NV_SATFINITE : __NV_NOSAT;
    Compare({std::string("f32->e4m3 ") + (sat ? "satfinite" : "nosat"), Format::kE4M3FN, o,
             [mode](float x) -> uint64_t { return __nv_cvt_float_to_fp8(x, mode, __NV_E4M3); },
             [](float) -> std::optional<uint64_t> { return std::nullopt; }});
    Compare({std::string("f32->e5m2 ") + (sat ? "satfinite" : "nosat"), Format::kE5M2, o,
             [mode](float x) -> uint64_t { return __nv_cvt_float_to_fp8(x, mode, __NV_E5M2); },
             [](float x) -> std::optional<uint64_t> {
               if (IsNan(x)) return 0x7F;
               return std::nullopt;
             }});
  }
}

// fp6/fp4 (round to nearest even, always satfinite): identical with NanPolicy::kDropSign.
TEST(NvidiaHost, Fp6AndFp4) {
  const EncodeOptions o{.overflow = Overflow::kSaturate, .nan = NanPolicy::kDropSign};
  const auto none = [](float) -> std::optional<uint64_t> { return std::nullopt; };
  Compare(
      {"f32->e2m1", Format::kE2M1FN, o,
       [](float x) -> uint64_t { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); },
       none});
  Compare(
      {"f32->e3m2", Format::kE3M2FN, o,
       [](float x) -> uint64_t { return __nv_cvt_float_to_fp6(x, __NV_E3M2, cudaRoundNearest); },
       none});
  Compare(
      {"f32->e2m3", Format::kE2M3FN, o,
       [](float x) -> uint64_t { return __nv_cvt_float_to_fp6(x, __NV_E2M3, cudaRoundNearest); },
       none});
}

// e8m0 (cvt.rz / cvt.rp [.satfinite]): NVIDIA converts |x| and sends ±0 to 0x00; we send
// zero and negative values to NaN (0xFF), as ml_dtypes.
TEST(NvidiaHost, E8M0TowardZeroAndUp) {
  for (bool sat : {false, true}) {
    for (Rounding r : {Rounding::kTowardZero, Rounding::kUp}) {
      const EncodeOptions o{.rounding = r,
                            .overflow = sat ? Overflow::kSaturate : Overflow::kDefault};
      const auto mode = sat ? __NV_SATFINITE : __NV_NOSAT;
      const auto cuda_round = r == Rounding::kUp ? cudaRoundPosInf : cudaRoundZero;
      Compare({std::string("f32->e8m0 ") + std::string(Name(r)) + (sat ? " satfinite" : ""),
               Format::kE8M0FNU, o,
               [mode, cuda_round](float x) -> uint64_t {
                 return __nv_cvt_float_to_e8m0(x, mode, cuda_round);
               },
               [o](float x) -> std::optional<uint64_t> {
                 if (IsNan(x)) return std::nullopt;
                 if (x == 0.0f) return 0x00;
                 if (x < 0.0f) return EncodeF32(-x, Format::kE8M0FNU, o).code;
                 return std::nullopt;
               }});
    }
  }
}

// Decoding: every fp8/fp6/fp4 code widened by NVIDIA to f16 equals our exact value rounded
// to f16 (exact for all of them), NaN -> 0x7FFF on NVIDIA's side.
TEST(NvidiaHost, NarrowToHalfDecode) {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto code = static_cast<__nv_fp8_storage_t>(c);
    const __half_raw h4 = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
    const __half_raw h5 = __nv_cvt_fp8_to_halfraw(code, __NV_E5M2);
    const double v4 = Decode(c, Format::kE4M3FN), v5 = Decode(c, Format::kE5M2);
    EXPECT_EQ(h4.x, std::isnan(v4) ? 0x7FFF : Encode(v4, Format::kF16).code) << c;
    EXPECT_EQ(h5.x, std::isnan(v5) ? 0x7FFF : Encode(v5, Format::kF16).code) << c;
    EXPECT_EQ(Encode(v4, Format::kF16).flags & kFlagInexact, 0u);
  }
  for (uint32_t c = 0; c < 64; ++c) {
    const auto code = static_cast<__nv_fp6_storage_t>(c);
    EXPECT_EQ(__nv_cvt_fp6_to_halfraw(code, __NV_E3M2).x,
              Encode(Decode(c, Format::kE3M2FN), Format::kF16).code)
        << c;
    EXPECT_EQ(__nv_cvt_fp6_to_halfraw(code, __NV_E2M3).x,
              Encode(Decode(c, Format::kE2M3FN), Format::kF16).code)
        << c;
  }
  for (uint32_t c = 0; c < 16; ++c) {
    const auto code = static_cast<__nv_fp4_storage_t>(c);
    EXPECT_EQ(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1).x,
              Encode(Decode(c, Format::kE2M1FN), Format::kF16).code)
        << c;
  }
}

}  // namespace
}  // namespace attest
