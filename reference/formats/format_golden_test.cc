// Replays the ml_dtypes conversion vectors in golden/formats/ml_dtypes_vectors.safetensors
// (made by golden/formats/gen_ml_dtypes.py, see golden/formats/README.md): fp32 -> format,
// float64 -> format (single rounding) and every code widened to float64. No Python at test
// time. Intended differences (docs/formats.md, "Differences from ml_dtypes") are asserted
// explicitly and counted.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "reference/formats/format.h"
#include "reference/io/safetensors.h"

namespace attest {
namespace {

constexpr const char* kVectors = "golden/formats/ml_dtypes_vectors.safetensors";

const NamedTensors& Vectors() {
  static const NamedTensors vectors = [] {
    auto read = ReadSafetensors(std::string(ATTEST_SOURCE_DIR) + "/" + kVectors);
    if (!read.ok()) {
      ADD_FAILURE() << read.error().message;
      return NamedTensors{};
    }
    return std::move(read).value();
  }();
  return vectors;
}

const Tensor& Get(const std::string& name) {
  const Tensor* t = Vectors().Find(name);
  if (t == nullptr) {
    static const Tensor kEmpty = Tensor::Zeros(DType::kF64, {0});
    ADD_FAILURE() << kVectors << ": missing tensor " << name;
    return kEmpty;
  }
  return *t;
}

uint64_t CodeAt(const Tensor& codes, int64_t i) {
  return SizeOf(codes.dtype()) == 2 ? codes.data<uint16_t>()[i] : codes.data<uint8_t>()[i];
}

// The ml_dtypes code we expect for input x, where it differs from ours on purpose; nullopt
// where it must equal our code with default options (RNE, Overflow::kDefault, kKeepSign).
std::optional<uint64_t> IntendedDifference(Format f, double x, uint64_t ours, uint64_t theirs,
                                           int* reason) {
  const FormatSpec& s = Spec(f);
  if (!std::isnan(x)) return std::nullopt;
  if (!s.has_nan()) {
    // fp6/fp4 have no NaN: ml_dtypes returns a zero with the opposite sign bit (its
    // NaN -> int conversion artefact); we return max finite with x's sign (PTX satfinite).
    *reason = 1;
    return (std::signbit(x) ? 0 : s.sign_mask());
  }
  // NaN payloads: numpy/ml_dtypes keep the top payload bits (f16, bf16) where we return the
  // canonical quiet NaN; both keep the sign.
  if (IsNanCode(theirs, f) && ((theirs ^ ours) & s.sign_mask()) == 0 && theirs != ours) {
    *reason = 2;
    return theirs;
  }
  return std::nullopt;
}

class MlDtypes : public ::testing::TestWithParam<Format> {};

TEST_P(MlDtypes, Fp32AndF64ConversionsAndDecode) {
  const Format f = GetParam();
  const std::string name(Name(f));
  int64_t checked = 0, differences[3] = {0, 0, 0};
  for (const char* kind : {"f32", "f64"}) {
    const Tensor ins = ToF64(Get(name + "." + kind + "_in"));
    const Tensor& codes = Get(name + "." + kind + "_rne");
    ASSERT_EQ(ins.numel(), codes.numel()) << name << " " << kind;
    for (int64_t i = 0; i < ins.numel(); ++i) {
      const double x = ins.data<double>()[i];
      const uint64_t ours = Encode(x, f).code;
      const uint64_t theirs = CodeAt(codes, i);
      int reason = 0;
      const auto intended = IntendedDifference(f, x, ours, theirs, &reason);
      ++checked;
      if (intended) {
        ++differences[reason];
        EXPECT_EQ(theirs, *intended) << name << " " << kind << " x=" << x;
        continue;
      }
      ASSERT_EQ(ours, theirs) << name << " " << kind << "[" << i << "] x=" << x << " ("
                              << std::hexfloat << x << std::defaultfloat << ")";
    }
  }
  const Tensor decoded = ToF64(Get(name + ".decode"));
  ASSERT_EQ(decoded.numel(), int64_t{1} << Spec(f).bits());
  for (int64_t c = 0; c < decoded.numel(); ++c) {
    const double theirs = decoded.data<double>()[c];
    const double ours = Decode(static_cast<uint64_t>(c), f);
    if (std::isnan(theirs)) {
      EXPECT_TRUE(std::isnan(ours)) << name << " code " << c;
    } else {
      EXPECT_EQ(std::bit_cast<uint64_t>(ours), std::bit_cast<uint64_t>(theirs))
          << name << " code " << c;  // bitwise: the sign of zero counts
    }
  }
  std::printf(
      "[ ml_dtypes] %-8s %lld conversions, %lld NaN->zero (fp6/fp4), %lld NaN payload "
      "differences, %lld codes decoded\n",
      name.c_str(), static_cast<long long>(checked), static_cast<long long>(differences[1]),
      static_cast<long long>(differences[2]), static_cast<long long>(decoded.numel()));
}

INSTANTIATE_TEST_SUITE_P(Golden, MlDtypes,
                         ::testing::Values(Format::kBF16, Format::kF16, Format::kE4M3FN,
                                           Format::kE5M2, Format::kE3M2FN, Format::kE2M3FN,
                                           Format::kE2M1FN, Format::kE8M0FNU),
                         [](const auto& info) { return std::string(Name(info.param)); });

}  // namespace
}  // namespace attest
