// Tests of NVFP4 quantization (nvfp4.h; TransformerEngine core_nvfp4.cuh, torchao
// nvfp4_tensor.py): hand-computed vectors from the cited formulas, scale edge cases, the
// pinned TE-vs-torchao disagreement, identities and axes.
#include "reference/formats/nvfp4.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "reference/formats/format.h"

namespace attest {
namespace {

constexpr auto kTE = Nvfp4Variant::kTransformerEngine;
constexpr auto kTorchao = Nvfp4Variant::kTorchao;

QuantizedTensor Nv(const Tensor& t, Nvfp4Variant variant, std::optional<float> amax = {},
                   int64_t axis = -1) {
  Nvfp4Options o;
  o.variant = variant;
  o.tensor_amax = amax;
  o.axis = axis;
  auto q = QuantizeNvfp4(t, o);
  EXPECT_TRUE(q.ok()) << (q.ok() ? "" : q.error().message);
  return std::move(q).value();
}

bool IsE2M1Midpoint(float v) {
  const double a = std::fabs(v);
  for (double m : {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0}) {
    if (a == m) return true;
  }
  return false;
}

TEST(Nvfp4, HandComputedVectorWithUnitScales) {
  // Tensor amax 2688 = 448 * 6: TE S_enc = 1, torchao per_tensor_scale = 1. The block amax
  // is 6, so s8 = 6 * fl(1/6) = 1.0000000298 -> fp32 1.0 (TE) and 6 / 6 / 1 = 1 (torchao):
  // E4M3 code 0x38. Elements are then rounded as they are, ties to even.
  const std::vector<double> x = {6,    -3, 2.5, 0.25, 0.75, 5,   1.25, 1.75,
                                 -0.3, 0,  5.5, -5.9, 0.5,  3.5, 4.5,  -1};
  const std::vector<uint8_t> want = {0x7, 0xD, 0x4, 0x0, 0x2, 0x6, 0x2, 0x4,
                                     0x9, 0x0, 0x7, 0xF, 0x1, 0x6, 0x6, 0xA};
  const Tensor t = Tensor::FromF64({16}, x);
  for (Nvfp4Variant v : {kTE, kTorchao}) {
    const QuantizedTensor q = Nv(t, v, 2688.0f);
    EXPECT_EQ(q.scales.span<uint8_t>()[0], 0x38) << Name(v);
    EXPECT_EQ(q.tensor_scale.span<float>()[0], 1.0f);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(q.codes.span<uint8_t>()[i], want[i]) << Name(v) << " x=" << x[i];
    }
  }
}

TEST(Nvfp4, TensorScaleEdgeCases) {
  const float flt_max = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Nvfp4TensorScaleOf(0.0f, kTE).encode, 1.0f);       // amax 0 -> 1
  EXPECT_EQ(Nvfp4TensorScaleOf(inf, kTE).encode, 1.0f);        // S_enc 0 -> 1
  EXPECT_EQ(Nvfp4TensorScaleOf(1e-40f, kTE).encode, flt_max);  // Inf -> FLT_MAX
  EXPECT_EQ(Nvfp4TensorScaleOf(2688.0f, kTE).decode, 1.0f);
  EXPECT_EQ(Nvfp4TensorScaleOf(1.0f, kTE).encode, 2688.0f);
  EXPECT_EQ(Nvfp4TensorScaleOf(1.0f, kTE).decode, 1.0f / 2688.0f);
  EXPECT_EQ(Nvfp4TensorScaleOf(2688.0f, kTorchao).decode, 1.0f);
  EXPECT_EQ(Nvfp4TensorScaleOf(1.0f, kTorchao).decode, 1.0f / 2688.0f);
}

TEST(Nvfp4, ZeroBlocks) {
  std::vector<double> x(32, 0.0);
  x[20] = 3.0;  // block 1 nonzero, block 0 all zero
  const Tensor t = Tensor::FromF64({32}, x);
  // TE: s8 = 0 (zero and subnormal block scales allowed), factor FLT_MAX, codes 0.
  const QuantizedTensor te = Nv(t, kTE);
  EXPECT_EQ(te.scales.span<uint8_t>()[0], 0x00);
  EXPECT_EQ(Nvfp4BlockScaleOf(0.0f, Nvfp4TensorScaleOf(3.0f, kTE), kTE).factor,
            std::numeric_limits<float>::max());
  // torchao clamps the block scale to 2^-6 (E4M3 code 0x08).
  const QuantizedTensor ta = Nv(t, kTorchao);
  EXPECT_EQ(ta.scales.span<uint8_t>()[0], 0x08);
  for (const QuantizedTensor* q : {&te, &ta}) {
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(q->codes.span<uint8_t>()[i], 0);
      EXPECT_EQ(q->dequant.span<double>()[i], 0.0);
    }
    // The amax element maps to 6 and back: q * s8 * tensor_scale, exactly, close to 3.
    const double back = 6.0 * Decode(q->scales.span<uint8_t>()[1], Format::kE4M3FN) *
                        q->tensor_scale.span<float>()[0];
    EXPECT_EQ(q->dequant.span<double>()[20], back);
    EXPECT_NEAR(back, 3.0, 3.0 * 0x1p-22);
  }
  // An all-zero tensor: TE scales by 1 and gives zeros; torchao divides 0 by 0 (NaN scale).
  const Tensor zeros = Tensor::FromF64({16}, std::vector<double>(16, 0.0));
  EXPECT_EQ(Nv(zeros, kTE).dequant.span<double>()[0], 0.0);
  const QuantizedTensor ta0 = Nv(zeros, kTorchao);
  EXPECT_EQ(ta0.scales.span<uint8_t>()[0], 0x7F);
  EXPECT_TRUE(std::isnan(ta0.dequant.span<double>()[0]));
}

TEST(Nvfp4, SubnormalBlockScaleUnderTE) {
  // Tensor amax 2688 (S_enc 1) and block amax 6 * 2^-8: s8 = 2^-8, an E4M3 subnormal (0x02);
  // torchao clamps to 2^-6 instead.
  std::vector<double> x(32, 0.0);
  x[0] = 2688.0;
  x[16] = 6.0 / 256;
  x[17] = 3.0 / 256;
  const Tensor t = Tensor::FromF64({32}, x);
  const QuantizedTensor te = Nv(t, kTE);
  EXPECT_EQ(te.scales.span<uint8_t>()[1], 0x02);
  EXPECT_EQ(te.dequant.span<double>()[16], 6.0 / 256);
  EXPECT_EQ(te.dequant.span<double>()[17], 3.0 / 256);
  const QuantizedTensor ta = Nv(t, kTorchao);
  EXPECT_EQ(ta.scales.span<uint8_t>()[1], 0x08);
  // 6/256 / 2^-6 = 1.5 -> 1.5; 3/256 / 2^-6 = 0.75 -> tie 0.5|1 -> 1.
  EXPECT_EQ(ta.dequant.span<double>()[16], 1.5 / 64);
  EXPECT_EQ(ta.dequant.span<double>()[17], 1.0 / 64);
}

// Search (seeded, bounded) for a case where both variants pick the same E4M3 block scale but
// their fp32 element scales differ by one ulp (TE multiplies by fl(1/fl(s8 * S_dec)), torchao
// divides by fl(per_tensor_scale * s8)), and an element that is an exact E2M1 tie for torchao
// (ties to even) is pushed off the tie by TE's product.
struct Disagreement {
  float tensor_amax, block_amax, x;
};
int UlpDistance(float a, float b) {
  return std::abs(static_cast<int>(std::bit_cast<uint32_t>(a)) -
                  static_cast<int>(std::bit_cast<uint32_t>(b)));
}
std::optional<Disagreement> FindDisagreement(int tries) {
  std::mt19937 rng(4242);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  for (int i = 0; i < tries; ++i) {
    const float tensor_amax = std::ldexp(u(rng), 3);
    const float block_amax = std::ldexp(u(rng), 1);
    const Nvfp4TensorScale te_t = Nvfp4TensorScaleOf(tensor_amax, kTE);
    const Nvfp4TensorScale ta_t = Nvfp4TensorScaleOf(tensor_amax, kTorchao);
    const Nvfp4BlockScale te = Nvfp4BlockScaleOf(block_amax, te_t, kTE);
    const Nvfp4BlockScale ta = Nvfp4BlockScaleOf(block_amax, ta_t, kTorchao);
    if (te.code != ta.code) continue;
    const float s8 = static_cast<float>(Decode(te.code, Format::kE4M3FN));
    if (UlpDistance(1.0f / te.factor, ta.factor) != 1 &&
        UlpDistance(s8 * te_t.decode, ta.factor) != 1) {
      continue;
    }
    for (float mid : {0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
      const float x = mid * ta.factor;
      if (x / ta.factor != mid || std::fabs(x) > block_amax) continue;
      if (Nvfp4ElementCode(x, te, kTE) != Nvfp4ElementCode(x, ta, kTorchao)) {
        return Disagreement{tensor_amax, block_amax, x};
      }
    }
  }
  return std::nullopt;
}

TEST(Nvfp4, SearchFindsAScaleUlpAndTieFlipBetweenTEAndTorchao) {
  const auto d = FindDisagreement(20000);
  ASSERT_TRUE(d.has_value());
  std::printf("tensor_amax %a block_amax %a x %a\n", d->tensor_amax, d->block_amax, d->x);
}

// The case the search above finds, pinned: tensor amax 0x1.4958aep+3 (about 10.29). TE's
// S_dec = 1/fl(2688/amax) and torchao's amax/2688 differ by one fp32 ulp (0x1.f5dc78p-9 vs
// 0x1.f5dc76p-9); both pick block scale 0x6F (E4M3 120) for block amax 0x1.5573f6p+1. For
// x = 0x1.60df02p-2, torchao's x / fl(pts * 120) is exactly 0.75, a tie that goes to even
// 1.0 (code 2); TE's x * fl(1 / fl(120 * S_dec)) is 0x1.7ffffep-1, just below the tie: 0.5.
TEST(Nvfp4, PinnedOneUlpTensorScaleDifferenceFlipsAnE2M1Tie) {
  const float tensor_amax = 0x1.4958aep+3f;
  const float block_amax = 0x1.5573f6p+1f;
  const float x = 0x1.60df02p-2f;
  const Nvfp4TensorScale te_t = Nvfp4TensorScaleOf(tensor_amax, kTE);
  const Nvfp4TensorScale ta_t = Nvfp4TensorScaleOf(tensor_amax, kTorchao);
  EXPECT_EQ(te_t.encode, 0x1.052bfcp+8f);
  EXPECT_EQ(te_t.decode, 0x1.f5dc78p-9f);
  EXPECT_EQ(ta_t.decode, 0x1.f5dc76p-9f);
  EXPECT_EQ(UlpDistance(te_t.decode, ta_t.decode), 1);
  const Nvfp4BlockScale te = Nvfp4BlockScaleOf(block_amax, te_t, kTE);
  const Nvfp4BlockScale ta = Nvfp4BlockScaleOf(block_amax, ta_t, kTorchao);
  EXPECT_EQ(te.code, 0x6F);
  EXPECT_EQ(ta.code, 0x6F);
  EXPECT_EQ(te.factor, 0x1.169552p+1f);
  EXPECT_EQ(ta.factor, 0x1.d67eaep-2f);
  EXPECT_EQ(x * te.factor, 0x1.7ffffep-1f);
  EXPECT_EQ(x / ta.factor, 0.75f);
  EXPECT_EQ(Nvfp4ElementCode(x, te, kTE), 0x1);
  EXPECT_EQ(Nvfp4ElementCode(x, ta, kTorchao), 0x2);
  // The same through the tensor path: a 16-element block holding the amax element and x.
  std::vector<double> v(16, 0.0);
  v[0] = block_amax;
  v[5] = x;
  const Tensor t = Tensor::FromF64({16}, v);
  EXPECT_EQ(Nv(t, kTE, tensor_amax).codes.span<uint8_t>()[5], 0x1);
  EXPECT_EQ(Nv(t, kTorchao, tensor_amax).codes.span<uint8_t>()[5], 0x2);
}

TEST(Nvfp4, DequantIdentityAndAxisTranspose) {
  std::mt19937 rng(17);
  std::normal_distribution<double> normal;
  std::vector<double> v(48 * 5);
  for (auto& e : v) e = static_cast<float>(normal(rng) * 3);
  const Tensor t = Tensor::FromF64({48, 5}, v);
  const Tensor tt = t.Permute({1, 0}).Clone();
  for (Nvfp4Variant var : {kTE, kTorchao}) {
    const QuantizedTensor a = Nv(t, var, std::nullopt, 0);
    const QuantizedTensor b = Nv(tt, var, std::nullopt, 1);
    ASSERT_EQ(a.scales.shape(), (Shape{3, 5}));
    EXPECT_TRUE(a.codes.Permute({1, 0}).BitwiseEqual(b.codes));
    EXPECT_TRUE(a.scales.Permute({1, 0}).BitwiseEqual(b.scales));
    EXPECT_TRUE(a.dequant.Permute({1, 0}).BitwiseEqual(b.dequant));
    const double ts = a.tensor_scale.span<float>()[0];
    for (int64_t i = 0; i < 48; ++i) {
      for (int64_t j = 0; j < 5; ++j) {
        const double want = Decode(a.codes.at<uint8_t>({i, j}), Format::kE2M1FN) *
                            Decode(a.scales.at<uint8_t>({i / 16, j}), Format::kE4M3FN) * ts;
        ASSERT_EQ(a.dequant.at<double>({i, j}), want);
        // Each element is within half an E2M1 step of its block scale (6 * s8 * ts covers
        // the block amax up to the E4M3 rounding of s8, 2^-4 relative).
        const double step = Decode(a.scales.at<uint8_t>({i / 16, j}), Format::kE4M3FN) * ts;
        ASSERT_LE(std::fabs(a.dequant.at<double>({i, j}) - t.at<double>({i, j})),
                  step * (1.0 + 0x1p-3) + 1e-300)
            << Name(var);
      }
    }
  }
}

}  // namespace
}  // namespace attest
