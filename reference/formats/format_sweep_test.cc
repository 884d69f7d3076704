// fp32 -> {bf16, f16, e4m3fn, e5m2, e2m1fn, e8m0fnu} conversion sweeps of EncodeF32 against
// the independent reference in format_test_util.h (sorted value table, exact midpoint
// comparison). By default a stratified sample: every fp32 bit pattern congruent to a seed
// mod 83 (51.7 M inputs per sweep, every binade and mantissa residue) plus every rounding
// boundary; ATTEST_FORMAT_SWEEP=exhaustive runs all 2^32 inputs (ctest -L exhaustive, see
// docs/formats.md).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "reference/formats/format.h"
#include "reference/formats/format_test_util.h"
#include "reference/formats/fp32_table_encoder.h"

namespace attest {
namespace {

using testing::BoundaryInputs;
using testing::FailureLog;
using testing::ParallelFor;
using testing::RefEncoder;

constexpr Format kSweepFormats[] = {Format::kBF16, Format::kF16,    Format::kE4M3FN,
                                    Format::kE5M2, Format::kE2M1FN, Format::kE8M0FNU};

bool Exhaustive() {
  const char* env = std::getenv("ATTEST_FORMAT_SWEEP");
  return env != nullptr && std::strcmp(env, "exhaustive") == 0;
}

// splitmix64: a fixed, seedable stream for the stochastic-rounding random bits.
uint32_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((x ^ (x >> 31)) >> 32);
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

struct SweepCase {
  Format format;
  Rounding rounding;
  bool saturate;
};

// Compares EncodeF32 with the reference on the fp32 patterns offset + stride·j (all of them
// for stride 1) and on every boundary input; returns the number of inputs checked.
uint64_t Sweep(const SweepCase& c, uint64_t stride, uint64_t offset, FailureLog& log) {
  const RefEncoder ref(c.format);
  EncodeOptions opt;
  opt.rounding = c.rounding;
  opt.overflow = c.saturate ? Overflow::kSaturate : Overflow::kDefault;
  const auto check = [&](float x, uint32_t rbits) {
    EncodeOptions o = opt;
    o.random_bits = rbits;
    const uint64_t got = EncodeF32(x, c.format, o).code;
    const uint64_t want = ref.Encode(static_cast<double>(x), c.rounding, c.saturate, rbits);
    if (got != want) {
      log.Add([&] {
        return std::string(Name(c.format)) + " " + std::string(Name(c.rounding)) +
               (c.saturate ? " satfinite" : "") + ": x=" + Hex(std::bit_cast<uint32_t>(x)) +
               " rbits=" + Hex(rbits) + " got " + Hex(got) + " want " + Hex(want);
      });
    }
  };
  const uint64_t count = ((uint64_t{1} << 32) - offset + stride - 1) / stride;
  ParallelFor(count, [&](uint64_t b, uint64_t e, int) {
    for (uint64_t j = b; j < e; ++j) {
      const auto bits = static_cast<uint32_t>(offset + stride * j);
      check(std::bit_cast<float>(bits), Mix(bits));
    }
  });
  const std::vector<float> boundaries = BoundaryInputs(ref);
  for (float x : boundaries) {
    if (c.rounding == Rounding::kStochastic) {
      for (uint32_t rbits :
           {0u, 1u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu, Mix(std::bit_cast<uint32_t>(x))}) {
        check(x, rbits);
      }
    } else {
      check(x, 0);
    }
  }
  return count + boundaries.size();
}

void RunSweep(const SweepCase& c, uint64_t stride) {
  FailureLog log;
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t n = Sweep(c, stride, stride == 1 ? 0 : 17, log);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ sweep    ] %-8s %-3s %-9s %12llu inputs  %6.2f s  %7.1f M/s  mismatches %llu\n",
              std::string(Name(c.format)).c_str(), std::string(Name(c.rounding)).c_str(),
              c.saturate ? "satfinite" : "default", static_cast<unsigned long long>(n), s,
              static_cast<double>(n) / s / 1e6, static_cast<unsigned long long>(log.count()));
  EXPECT_EQ(log.count(), 0u) << log.Summary();
}

class NearestEvenSweep : public ::testing::TestWithParam<std::tuple<Format, bool>> {};

TEST_P(NearestEvenSweep, MatchesIndependentReference) {
  const auto [format, saturate] = GetParam();
  RunSweep({format, Rounding::kNearestEven, saturate}, Exhaustive() ? 1 : 83);
}

INSTANTIATE_TEST_SUITE_P(Fp32, NearestEvenSweep,
                         ::testing::Combine(::testing::ValuesIn(kSweepFormats), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(Name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_satfinite" : "_default");
                         });

// The other rounding modes on a sparser stratified sample (stride 1009: 4.3 M inputs) plus
// every boundary; stochastic rounding with seeded random bits per input.
class OtherRoundingSweep : public ::testing::TestWithParam<std::tuple<Format, Rounding>> {};

TEST_P(OtherRoundingSweep, MatchesIndependentReference) {
  const auto [format, rounding] = GetParam();
  RunSweep({format, rounding, false}, Exhaustive() ? 1 : 1009);
  RunSweep({format, rounding, true}, Exhaustive() ? 1 : 4099);
}

INSTANTIATE_TEST_SUITE_P(
    Fp32, OtherRoundingSweep,
    ::testing::Combine(::testing::ValuesIn(kSweepFormats),
                       ::testing::Values(Rounding::kTowardZero, Rounding::kUp, Rounding::kDown,
                                         Rounding::kNearestAway, Rounding::kStochastic)),
    [](const auto& info) {
      return std::string(Name(std::get<0>(info.param))) + "_" +
             std::string(Name(std::get<1>(info.param)));
    });

// Fp32TableEncoder must equal EncodeF32 for every deterministic mode and overflow policy
// (stride 4099 sample + boundaries; every input with ATTEST_FORMAT_SWEEP=exhaustive), and
// for e4m3fn RNE, the bulk path of the benchmark, on the stride-83 sample.
class TableEncoderSweep : public ::testing::TestWithParam<std::tuple<Format, Rounding>> {};

TEST_P(TableEncoderSweep, EqualsEncodeF32) {
  const auto [format, rounding] = GetParam();
  for (Overflow overflow : {Overflow::kDefault, Overflow::kSaturate, Overflow::kNan}) {
    for (NanPolicy nan : {NanPolicy::kKeepSign, NanPolicy::kDropSign}) {
      const EncodeOptions o{.rounding = rounding, .overflow = overflow, .nan = nan};
      const auto table = Fp32TableEncoder::Make(format, o);
      ASSERT_TRUE(table.ok());
      const uint64_t stride = Exhaustive() ? 1
                              : (format == Format::kE4M3FN && rounding == Rounding::kNearestEven &&
                                 overflow == Overflow::kDefault && nan == NanPolicy::kKeepSign)
                                  ? 83
                                  : 4099;
      FailureLog log;
      const auto check = [&](float x) {
        const uint64_t got = table->Encode(x), want = EncodeF32(x, format, o).code;
        if (got != want) {
          log.Add([&] {
            return std::string(Name(format)) + " " + std::string(Name(rounding)) +
                   " x=" + Hex(std::bit_cast<uint32_t>(x)) + " table " + Hex(got) + " EncodeF32 " +
                   Hex(want);
          });
        }
      };
      const uint64_t count = ((uint64_t{1} << 32) - 3 + stride - 1) / stride;
      ParallelFor(count, [&](uint64_t b, uint64_t e, int) {
        for (uint64_t j = b; j < e; ++j) {
          check(std::bit_cast<float>(static_cast<uint32_t>(3 + stride * j)));
        }
      });
      for (float x : BoundaryInputs(RefEncoder(format))) check(x);
      EXPECT_EQ(log.count(), 0u) << log.Summary();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fp32, TableEncoderSweep,
    ::testing::Combine(::testing::Values(Format::kBF16, Format::kF16, Format::kE4M3FN,
                                         Format::kE5M2, Format::kE3M2FN, Format::kE2M3FN,
                                         Format::kE2M1FN, Format::kE8M0FNU),
                       ::testing::Values(Rounding::kNearestEven, Rounding::kTowardZero,
                                         Rounding::kUp, Rounding::kDown, Rounding::kNearestAway)),
    [](const auto& info) {
      return std::string(Name(std::get<0>(info.param))) + "_" +
             std::string(Name(std::get<1>(info.param)));
    });

TEST(TableEncoder, ShapeAndRefusals) {
  const auto e4m3 = Fp32TableEncoder::Make(Format::kE4M3FN);
  ASSERT_TRUE(e4m3.ok());
  // 0x00..0x7E plus the overflow NaN: 128 segments for x >= 0.
  EXPECT_EQ(e4m3->segments(), 128u);
  EXPECT_EQ(e4m3->Encode(464.0f), 0x7Eu);
  EXPECT_EQ(e4m3->Encode(-465.0f), 0xFFu);
  EXPECT_EQ(e4m3->Encode(std::bit_cast<float>(0xFFC00001u)), 0xFFu);
  const auto e8m0 = Fp32TableEncoder::Make(Format::kE8M0FNU);
  ASSERT_TRUE(e8m0.ok());
  EXPECT_EQ(e8m0->Encode(0.0f), 0xFFu);  // zero: NaN, then 0x00 from the smallest subnormal
  EXPECT_EQ(e8m0->Encode(0x1p-149f), 0x00u);
  EXPECT_EQ(e8m0->Encode(0x1.8p127f), 0xFFu);
  EXPECT_FALSE(Fp32TableEncoder::Make(Format::kE4M3FN, {.rounding = Rounding::kStochastic}).ok());
}

// The reference itself must be able to fail: a deliberately wrong tie rule disagrees.
TEST(ReferenceSanity, DetectsAWrongTieRule) {
  const RefEncoder ref(Format::kE4M3FN);
  // 1.0625 is the midpoint of 1 (0x38, even) and 1.125 (0x39): RNE -> 0x38, RNA -> 0x39.
  EXPECT_EQ(ref.Encode(1.0625, Rounding::kNearestEven, false), 0x38u);
  EXPECT_EQ(ref.Encode(1.0625, Rounding::kNearestAway, false), 0x39u);
  EXPECT_NE(EncodeF32(1.0625f, Format::kE4M3FN).code,
            ref.Encode(1.0625, Rounding::kNearestAway, false));
  // Known values from the OCP OFP8 table and docs/references.md.
  EXPECT_EQ(ref.Encode(464.0, Rounding::kNearestEven, false), 0x7Eu);
  EXPECT_EQ(ref.Encode(464.0001, Rounding::kNearestEven, false), 0x7Fu);
  EXPECT_EQ(RefEncoder(Format::kE5M2).Encode(61440.0, Rounding::kNearestEven, false), 0x7Cu);
  EXPECT_EQ(RefEncoder(Format::kE5M2).Encode(61439.0, Rounding::kNearestEven, false), 0x7Bu);
}

}  // namespace
}  // namespace attest
