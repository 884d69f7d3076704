// Tests of FP8 per-tensor and per-block scaling (fp8_scaling.h; TransformerEngine
// recipe_common.cuh `compute_scale_from_amax`): the scale table, the dequant identity, and
// per-block results against per-tensor quantization of each block on its own.
#include "reference/formats/fp8_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reference/formats/format.h"

namespace attest {
namespace {

TEST(Fp8Scale, ComputeScaleFromAmaxTable) {
  const float flt_max = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Fp8ScaleOptions e4m3;
  EXPECT_EQ(Fp8ScaleFromAmax(448.0f, e4m3), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(1.0f, e4m3), 448.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(3.0f, e4m3), 448.0f / 3.0f);  // one fp32 division
  EXPECT_EQ(Fp8ScaleFromAmax(0.0f, e4m3), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(inf, e4m3), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(nan, e4m3), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(1e-45f, e4m3), flt_max);  // 448 / 2^-149 overflows
  Fp8ScaleOptions pow2 = e4m3;
  pow2.pow2_scale = true;
  EXPECT_EQ(Fp8ScaleFromAmax(3.0f, pow2), 128.0f);  // 149.33 -> 2^7
  EXPECT_EQ(Fp8ScaleFromAmax(1e-45f, pow2), 0x1p127f);
  Fp8ScaleOptions margin = e4m3;
  margin.margin = 1;
  EXPECT_EQ(Fp8ScaleFromAmax(1.0f, margin), 224.0f);
  Fp8ScaleOptions eps = e4m3;
  eps.amax_epsilon = 0.5f;
  EXPECT_EQ(Fp8ScaleFromAmax(0.0f, eps), 896.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(0.25f, eps), 896.0f);
  Fp8ScaleOptions e5m2;
  e5m2.element = Format::kE5M2;
  EXPECT_EQ(Fp8ScaleFromAmax(57344.0f, e5m2), 1.0f);
}

Tensor RandomTensor(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(static_cast<size_t>(Tensor::NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::ldexp(normal(rng), static_cast<int>(i % 13) - 6));
  }
  return Tensor::FromF64(std::move(shape), std::move(v));
}

TEST(Fp8Tensor, CodesAreSaturatedRneOfScaledValuesAndDequantUsesTheStoredDescale) {
  const Tensor t = RandomTensor({7, 33}, 1);
  for (Format f : {Format::kE4M3FN, Format::kE5M2}) {
    Fp8TensorOptions o;
    o.scale.element = f;
    auto q = QuantizeFp8Tensor(t, o);
    ASSERT_TRUE(q.ok());
    ASSERT_EQ(q->scales.shape(), (Shape{1, 1}));
    ASSERT_EQ(q->codes.dtype(), f == Format::kE4M3FN ? DType::kE4M3FN : DType::kE5M2);
    float amax = 0;
    for (double x : t.span<double>()) amax = std::fmax(amax, std::fabs(static_cast<float>(x)));
    const float scale = static_cast<float>(MaxFinite(f)) / amax;
    EXPECT_EQ(q->scales.span<float>()[0], 1.0f / scale);
    EncodeOptions sat;
    sat.overflow = Overflow::kSaturate;
    const auto x = t.span<double>();
    for (size_t i = 0; i < x.size(); ++i) {
      const float scaled = static_cast<float>(x[i]) * scale;
      ASSERT_EQ(q->codes.span<uint8_t>()[i], EncodeF32(scaled, f, sat).code);
      ASSERT_EQ(q->dequant.span<double>()[i],
                Decode(q->codes.span<uint8_t>()[i], f) * double{1.0f / scale});
    }
  }
  // A delayed-scaling amax smaller than the data saturates the excess.
  Fp8TensorOptions delayed;
  delayed.amax = 1.0f;
  auto q = QuantizeFp8Tensor(Tensor::FromF64({2}, {3.0, -0.5}), delayed);
  ASSERT_TRUE(q.ok());
  // 3 * 448 saturates to 448; the descale is fl32(1/448), not 1/448.
  EXPECT_EQ(q->dequant.span<double>()[0], 448.0 * double{1.0f / 448.0f});
  EXPECT_EQ(q->dequant.span<double>()[1], -224.0 * double{1.0f / 448.0f});
}

TEST(Fp8Block, EachBlockEqualsPerTensorQuantizationOfThatBlock) {
  const Tensor t = RandomTensor({130, 260}, 2);
  struct Case {
    int64_t rows, cols;
    Shape grid;
  };
  for (const Case& c : {Case{128, 128, {2, 3}}, Case{1, 128, {130, 3}}, Case{32, 1, {5, 260}}}) {
    Fp8BlockOptions o;
    o.block_rows = c.rows;
    o.block_cols = c.cols;
    auto q = QuantizeFp8Block(t, o);
    ASSERT_TRUE(q.ok());
    ASSERT_EQ(q->scales.shape(), c.grid);
    for (int64_t bi = 0; bi < c.grid[0]; ++bi) {
      for (int64_t bj = 0; bj < c.grid[1]; ++bj) {
        const int64_t r0 = bi * c.rows, c0 = bj * c.cols;
        const int64_t nr = std::min(c.rows, 130 - r0), nc = std::min(c.cols, 260 - c0);
        Fp8TensorOptions to;
        to.scale = o.scale;
        auto ref = QuantizeFp8Tensor(t.Narrow(0, r0, nr).Narrow(1, c0, nc), to);
        ASSERT_TRUE(ref.ok());
        ASSERT_EQ(q->scales.at<float>({bi, bj}), ref->scales.span<float>()[0]);
        ASSERT_TRUE(q->codes.Narrow(0, r0, nr).Narrow(1, c0, nc).BitwiseEqual(ref->codes));
        ASSERT_TRUE(q->dequant.Narrow(0, r0, nr).Narrow(1, c0, nc).BitwiseEqual(ref->dequant));
      }
    }
    // Power-of-two descales by default (Float8BlockScaling).
    for (float s : q->scales.span<float>()) {
      int e;
      EXPECT_EQ(std::frexp(s, &e), 0.5f);
    }
  }
}

TEST(Fp8Block, BlocksAlongChosenAxesAndErrors) {
  const Tensor t = RandomTensor({4, 6, 10}, 3);
  Fp8BlockOptions o;
  o.row_axis = 0;
  o.axis = 2;
  o.block_rows = 2;
  o.block_cols = 4;
  auto q = QuantizeFp8Block(t, o);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->scales.shape(), (Shape{2, 6, 3}));
  o.row_axis = 2;
  EXPECT_FALSE(QuantizeFp8Block(t, o).ok());
  o.row_axis = 5;
  EXPECT_FALSE(QuantizeFp8Block(t, o).ok());
  Fp8TensorOptions bad;
  bad.scale.element = Format::kE2M1FN;
  EXPECT_FALSE(QuantizeFp8Tensor(t, bad).ok());
}

}  // namespace
}  // namespace attest
