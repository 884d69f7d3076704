// Tensor views, copies and strides.
#include "reference/tensor.h"

#include <gtest/gtest.h>

namespace attest {
namespace {

TEST(Tensor, ZerosIsContiguousAndZero) {
  Tensor t = Tensor::Zeros(DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96);
  EXPECT_TRUE(t.contiguous());
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  for (float x : t.span<float>()) EXPECT_EQ(x, 0.0f);
}

TEST(Tensor, SelectNarrowPermuteAddressTheRightElements) {
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i;
  Tensor t = Tensor::FromF64({2, 3, 4}, v);
  EXPECT_EQ(t.at<double>({1, 2, 3}), 23);
  Tensor s = t.Select(1, 2);  // [2, 4]
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.at<double>({1, 1}), 1 * 12 + 2 * 4 + 1);
  Tensor n = t.Narrow(2, 1, 2);  // [2, 3, 2]
  EXPECT_FALSE(n.contiguous());
  EXPECT_EQ(n.at<double>({0, 1, 1}), 4 + 2);
  Tensor p = t.Permute({2, 0, 1});  // [4, 2, 3]
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.at<double>({3, 1, 2}), t.at<double>({1, 2, 3}));
  Tensor c = p.Clone();
  EXPECT_TRUE(c.contiguous());
  EXPECT_TRUE(c.BitwiseEqual(p));
  EXPECT_EQ(c.at<double>({3, 1, 2}), 23);
}

TEST(Tensor, CopiesShareStorageCloneDoesNot) {
  Tensor a = Tensor::Zeros(DType::kI32, {4});
  Tensor b = a;
  Tensor c = a.Clone();
  a.at<int32_t>({2}) = 7;
  EXPECT_EQ(b.at<int32_t>({2}), 7);
  EXPECT_EQ(c.at<int32_t>({2}), 0);
  EXPECT_FALSE(a.BitwiseEqual(c));
}

TEST(Tensor, ViewDoesNotOwn) {
  uint16_t raw[6] = {1, 2, 3, 4, 5, 6};
  Tensor v = Tensor::View(DType::kBF16, {2, 3}, {1, 2}, raw);  // column-major view
  EXPECT_FALSE(v.owning());
  EXPECT_EQ(v.at<uint16_t>({1, 2}), 6);
  EXPECT_EQ(v.at<uint16_t>({1, 0}), 2);
  EXPECT_EQ(v.Describe(), "bf16[2, 3]");
}

TEST(Tensor, WrongElementTypeThrows) {
  Tensor t = Tensor::Zeros(DType::kBF16, {2});
  EXPECT_THROW(t.data<float>(), std::logic_error);
  EXPECT_THROW(t.Reshape({3}), std::invalid_argument);
}

TEST(Tensor, EmptyTensorsAreDefined) {
  Tensor t = Tensor::Zeros(DType::kF64, {0, 5});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(t.Clone().BitwiseEqual(t));
}

TEST(DType, NamesRoundTrip) {
  for (const auto& info : AllDTypes()) {
    EXPECT_EQ(ParseDType(info.name), info.dtype);
    EXPECT_EQ(DTypeFromSafetensors(info.safetensors), info.dtype);
  }
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_FALSE(ParseDType("bf17"));
  EXPECT_FALSE(DTypeFromSafetensors("F8_E4M3FN"));
}

}  // namespace
}  // namespace attest
