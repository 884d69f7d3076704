// Tests of verify/metrics/metrics.h on hand-made tensors with known answers: ULP distances across
// subnormals, binades and signed zeros in every format; the worst location named (b, h, i,
// d) in padded and packed layouts; per-row metrics; non-finite mismatches.
#include "verify/metrics/metrics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <utility>

namespace attest {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Ulp, AdjacentCodesAreOneApartInEveryFormat) {
  // Walk every positive finite code of the <= 16-bit formats (and a sample of f32/f64):
  // consecutive representable values are exactly one step apart, including the step from
  // the largest subnormal to the smallest normal and from 0 to the smallest subnormal.
  for (const FormatSpec& spec : AllFormats()) {
    const uint64_t top = spec.max_finite_code();
    const uint64_t step = spec.bits() > 16 ? (top / 4093) | 1 : 1;
    for (uint64_t c = 0; c + 1 <= top; c += step) {
      const double a = Decode(c, spec.format);
      const double b = Decode(c + 1, spec.format);
      ASSERT_DOUBLE_EQ(UlpDistance(a, b, spec.format), 1.0)
          << spec.name << " codes " << c << " and " << c + 1 << " (" << a << ", " << b << ")";
    }
  }
}

// The signed ordinal of a sign-magnitude code: its magnitude code, negated for negative codes.
int64_t CodeOrdinal(uint64_t code, const FormatSpec& spec) {
  const auto mag = static_cast<int64_t>(code & spec.magnitude_mask());
  return (code & spec.sign_mask()) ? -mag : mag;
}

TEST(Ulp, DistanceBetweenAnyTwoCodesIsTheirOrdinalDifference) {
  // Every pair of finite codes of the 8-bit formats (both signs, across zero), and a seeded
  // sample of pairs for bf16 and f16: the distance equals the number of codes between them.
  for (const FormatSpec& spec : AllFormats()) {
    if (spec.bits() > 16 || !spec.has_subnormals) continue;  // ordinals start at code 0
    const uint64_t n = uint64_t{1} << spec.bits();
    const auto finite = [&](uint64_t c) {
      return !IsNanCode(c, spec.format) && !IsInfCode(c, spec.format);
    };
    uint64_t state = 0x9E3779B97F4A7C15ULL;
    const auto next = [&] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 20) % n;
    };
    const uint64_t pairs = spec.bits() <= 8 ? n * n : 200000;
    for (uint64_t k = 0; k < pairs; ++k) {
      const uint64_t a = spec.bits() <= 8 ? k / n : next();
      const uint64_t b = spec.bits() <= 8 ? k % n : next();
      if (!finite(a) || !finite(b)) continue;
      const double expected =
          static_cast<double>(std::llabs(CodeOrdinal(a, spec) - CodeOrdinal(b, spec)));
      ASSERT_EQ(UlpDistance(Decode(a, spec.format), Decode(b, spec.format), spec.format),
                expected)
          << spec.name << " codes " << a << " and " << b;
    }
  }
}

TEST(Ulp, SignedZerosSubnormalsAndHalfSteps) {
  // bf16: smallest subnormal 2^-133, smallest normal 2^-126, 7 fraction bits.
  const double sub = std::ldexp(1.0, -133);
  EXPECT_EQ(UlpDistance(0.0, -0.0, Format::kBF16), 0.0);
  EXPECT_EQ(UlpDistance(sub, -sub, Format::kBF16), 2.0);
  EXPECT_EQ(UlpDistance(0.0, sub, Format::kBF16), 1.0);
  EXPECT_EQ(UlpDistance(-0.0, sub, Format::kBF16), 1.0);
  // Half a step, exactly, between 1 and 1 + 2^-7.
  EXPECT_EQ(UlpDistance(1.0, 1.0 + std::ldexp(1.0, -8), Format::kBF16), 0.5);
  // Across a binade: 2 - 2^-7 (last below 2) to 2 + 2^-6 (first above 2) is 2 steps.
  EXPECT_EQ(UlpDistance(2 - std::ldexp(1.0, -7), 2 + std::ldexp(1.0, -6), Format::kBF16), 2.0);
  // The same reals are many more steps apart in f32.
  EXPECT_EQ(UlpDistance(1.0, 1.0 + std::ldexp(1.0, -8), Format::kF32), std::ldexp(1.0, 15));
  // f64 keeps fractions at large ordinals.
  EXPECT_EQ(UlpDistance(1e300, std::nextafter(1e300, kInf), Format::kF64), 1.0);
  // e4m3fn: 448 and 416 are adjacent; -448 to 448 is twice the count of positive codes.
  EXPECT_EQ(UlpDistance(416, 448, Format::kE4M3FN), 1.0);
  EXPECT_EQ(UlpDistance(-448, 448, Format::kE4M3FN), 2.0 * 0x7E);
  // e2m1fn: 4 -> 6 is one step; 0.5 (the only subnormal) to 0 one step.
  EXPECT_EQ(UlpDistance(4, 6, Format::kE2M1FN), 1.0);
  EXPECT_EQ(UlpDistance(0.5, 0, Format::kE2M1FN), 1.0);
}

TEST(Ulp, QuantumIsNeverZero) {
  EXPECT_EQ(Quantum(0.0, Format::kBF16), std::ldexp(1.0, -133));
  EXPECT_EQ(Quantum(1.0, Format::kBF16), std::ldexp(1.0, -7));
  EXPECT_EQ(Quantum(-1.5, Format::kF16), std::ldexp(1.0, -10));
  EXPECT_EQ(Quantum(1e-30, Format::kF16), std::ldexp(1.0, -24));
  EXPECT_EQ(Quantum(300.0, Format::kE4M3FN), 32.0);
  EXPECT_GT(Quantum(0.0, Format::kF64), 0.0);
}

// o of a problem with B=2, S=3, H=2, D=4 (values k + 0.5 so that none is zero).
Problem SmallProblem() {
  Problem p;
  p.batch = 2;
  p.seqlen_q = p.seqlen_k = 3;
  p.heads_q = p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 4;
  return p;
}

Tensor Iota(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(Tensor::NumElements(shape)));
  for (size_t k = 0; k < v.size(); ++k) v[k] = 0.01 * static_cast<double>(k) + 0.5;
  return Tensor::FromF64(shape, v);
}

TEST(Compare, IdenticalTensorsHaveZeroError) {
  const Problem p = SmallProblem();
  const Tensor ref = Iota(p.OShape());
  auto m = Compare("o", ref.Clone(), ref, Format::kBF16, LayoutOf(p, "o"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->max_abs_error, 0);
  EXPECT_EQ(m->rel_l2, 0);
  EXPECT_EQ(m->max_ulp, 0);
  EXPECT_DOUBLE_EQ(m->cosine, 1);
  EXPECT_EQ(m->nonfinite_mismatches, 0);
  EXPECT_EQ(m->rows.size(), 2u * 3 * 2);  // one row per (b, h, i)
  EXPECT_EQ(m->compared, m->elements);
}

TEST(Compare, WorstElementIsNamedByBHID) {
  const Problem p = SmallProblem();
  const Tensor ref = Iota(p.OShape());
  Tensor obs = ref.Clone();
  // o[b=1, i=2, h=0, d=3] += 0.25; a smaller error elsewhere.
  obs.at<double>({1, 2, 0, 3}) += 0.25;
  obs.at<double>({0, 0, 1, 1}) -= 0.01;
  auto m = Compare("o", obs, ref, Format::kBF16, LayoutOf(p, "o"));
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->max_abs_error, 0.25);
  EXPECT_EQ(m->worst_abs.b, 1);
  EXPECT_EQ(m->worst_abs.h, 0);
  EXPECT_EQ(m->worst_abs.i, 2);
  EXPECT_EQ(m->worst_abs.d, 3);
  EXPECT_DOUBLE_EQ(m->worst_abs.observed - m->worst_abs.reference, 0.25);
  EXPECT_EQ(m->worst_abs.Coordinates(), "(b=1, h=0, i=2, d=3)");
  // Relative L2 by hand.
  double ref2 = 0;
  for (double x : ref.span<const double>()) ref2 += x * x;
  EXPECT_NEAR(m->rel_l2, std::sqrt(0.25 * 0.25 + 0.01 * 0.01) / std::sqrt(ref2), 1e-15);
  // The damaged row is the worst row by relative L2.
  EXPECT_EQ(m->worst_row_rel_l2.Coordinates(), "(b=1, h=0, i=2)");
  // Signed bias: mean(0.25, -0.01) / rms over all 48 elements.
  const double n = static_cast<double>(m->compared);
  EXPECT_NEAR(m->bias, (0.24 / n) / std::sqrt((0.0625 + 1e-4) / n), 1e-12);
}

TEST(Compare, KeySideTensorsNameJ) {
  Problem p = SmallProblem();
  p.heads_kv = 1;
  const Tensor ref = Iota(p.KShape());
  Tensor obs = ref.Clone();
  obs.at<double>({0, 1, 0, 2}) = 9;
  auto m = Compare("dk", obs, ref, Format::kBF16, LayoutOf(p, "dk"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->worst_abs.Coordinates(), "(b=0, h=0, j=1, d=2)");
}

TEST(Compare, PackedVarlenLocatesSequenceAndPosition) {
  Problem p = SmallProblem();
  p.batch = 3;
  p.cu_seqlens_q = std::vector<int32_t>{0, 2, 2, 5};  // the middle sequence is empty
  p.cu_seqlens_k = std::vector<int32_t>{0, 2, 2, 5};
  const Tensor ref = Iota(p.OShape());  // [5, 2, 4]
  Tensor obs = ref.Clone();
  obs.at<double>({3, 1, 0}) += 1;  // token 3 = sequence 2, position 1
  auto m = Compare("o", obs, ref, Format::kF16, LayoutOf(p, "o"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->worst_abs.Coordinates(), "(b=2, h=1, i=1, d=0)");
  // lse [H, total]: rows are (h, sequence) runs along the tokens.
  const Tensor lref = Iota(p.LseShape());
  Tensor lobs = lref.Clone();
  lobs.at<double>({1, 4}) += 1;
  auto l = Compare("lse", lobs, lref, Format::kF32, LayoutOf(p, "lse"));
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l->worst_abs.Coordinates(), "(b=2, h=1, i=2)");
  EXPECT_EQ(l->rows.size(), 2u * 2);  // 2 heads x 2 non-empty sequences
  EXPECT_EQ(l->worst_row_rel_l2.Coordinates(), "(b=2, h=1)");
}

TEST(Compare, PermutationWithTheSameNormIsVisible) {
  // flash-attention PR #2553: a layout bug that permutes elements keeps every norm. The
  // tensor norms agree exactly, but per-element and per-row metrics see it.
  const Problem p = SmallProblem();
  const Tensor ref = Iota(p.OShape());
  Tensor obs = ref.Clone();
  // Swap two d entries of one row.
  std::swap(obs.at<double>({0, 1, 1, 0}), obs.at<double>({0, 1, 1, 3}));
  auto m = Compare("o", obs, ref, Format::kBF16, LayoutOf(p, "o"));
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->obs_l2, m->ref_l2);
  EXPECT_NEAR(m->max_abs_error, 0.03, 1e-12);
  EXPECT_GT(m->max_ulp, 3.0);
  EXPECT_EQ(m->worst_abs.Coordinates().substr(0, 17), "(b=0, h=1, i=1, d");
  EXPECT_LT(m->min_row_cosine, 1.0 - 1e-6);
  EXPECT_EQ(m->worst_row_cosine.Coordinates(), "(b=0, h=1, i=1)");
}

TEST(Compare, NonFiniteMismatchesAreCounted) {
  const Problem p = SmallProblem();
  const Tensor ref = Iota(p.OShape());
  Tensor obs = ref.Clone();
  obs.at<double>({1, 0, 1, 2}) = kNan;
  obs.at<double>({1, 1, 1, 2}) = kInf;
  auto m = Compare("o", obs, ref, Format::kBF16, LayoutOf(p, "o"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->nonfinite_mismatches, 2);
  EXPECT_EQ(m->first_nonfinite.Coordinates(), "(b=1, h=1, i=0, d=2)");
  EXPECT_EQ(m->compared, m->elements - 2);
  EXPECT_EQ(m->max_abs_error, 0);  // the finite pairs are exact
}

TEST(Compare, NanReferenceNeverMatches) {
  // tracel-ai/cubecl PR #1070: NaN compared with NaN must not pass silently.
  const Tensor ref = Tensor::FromF64({3}, {1.0, kNan, 2.0});
  auto m = Compare("x", ref.Clone(), ref, Format::kF32, Layout::Flat(1));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->nonfinite_mismatches, 1);
  EXPECT_EQ(m->reference_nans, 1);
  EXPECT_EQ(m->first_nonfinite.Coordinates(), "[1]");
}

TEST(Compare, EmptyRowLse) {
  const Tensor ref = Tensor::FromF64({1, 1, 3}, {-kInf, 1.0, 2.0});
  Problem p;
  p.seqlen_q = 3;
  const Layout l = LayoutOf(p, "lse");
  auto same = Compare("lse", ref.Clone(), ref, Format::kF32, l);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->nonfinite_mismatches, 0);
  EXPECT_EQ(same->matched_nonfinite, 1);
  const Tensor plus = Tensor::FromF64({1, 1, 3}, {kInf, 1.0, 2.0});
  EXPECT_EQ(Compare("lse", plus, ref, Format::kF32, l)->nonfinite_mismatches, 1);
  CompareOptions declared;
  declared.allow_pos_inf_for_neg_inf = true;
  EXPECT_EQ(Compare("lse", plus, ref, Format::kF32, l, declared)->nonfinite_mismatches, 0);
  // A finite lse for an empty row is wrong.
  const Tensor finite = Tensor::FromF64({1, 1, 3}, {0.0, 1.0, 2.0});
  EXPECT_EQ(Compare("lse", finite, ref, Format::kF32, l, declared)->nonfinite_mismatches, 1);
}

TEST(Compare, CosineAndZeroRows) {
  // Row 0: reference zero (an empty row of o), observed zero -> cosine 1. Row 1: observed
  // non-zero where the reference is zero -> cosine 0. Row 2: opposite vector -> cosine -1.
  const Tensor ref = Tensor::FromF64({3, 2}, {0, 0, 0, 0, 1, 2});
  const Tensor obs = Tensor::FromF64({3, 2}, {0, 0, 1e-3, 0, -1, -2});
  Layout l;
  l.axes = {AxisRole::kSeq, AxisRole::kDim};
  auto m = Compare("o", obs, ref, Format::kF32, l);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->rows.size(), 3u);
  EXPECT_EQ(m->rows[0].Cosine(), 1.0);
  EXPECT_EQ(m->rows[1].Cosine(), 0.0);
  EXPECT_DOUBLE_EQ(m->rows[2].Cosine(), -1.0);
  EXPECT_DOUBLE_EQ(m->min_row_cosine, -1.0);
  EXPECT_EQ(m->worst_row_cosine.Coordinates(), "(i=2)");
  EXPECT_EQ(m->rows[1].RelL2(), kInf);
}

// Every field Compare fills, bitwise (doubles by their bits: NaN rows compare equal).
void ExpectSameMetrics(const TensorMetrics& a, const TensorMetrics& b) {
  const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
  const auto same_loc = [](const Location& x, const Location& y) {
    EXPECT_EQ(x.ToString(), y.ToString());
    EXPECT_EQ(x.flat, y.flat);
  };
  EXPECT_EQ(a.compared, b.compared);
  EXPECT_EQ(bits(a.max_abs_error), bits(b.max_abs_error));
  same_loc(a.worst_abs, b.worst_abs);
  EXPECT_EQ(bits(a.max_ulp), bits(b.max_ulp));
  same_loc(a.worst_ulp, b.worst_ulp);
  EXPECT_EQ(bits(a.ref_max_abs), bits(b.ref_max_abs));
  for (auto [x, y] : {std::pair{a.err_l2, b.err_l2}, {a.ref_l2, b.ref_l2}, {a.obs_l2, b.obs_l2},
                      {a.dot, b.dot}, {a.rel_l2, b.rel_l2}, {a.cosine, b.cosine},
                      {a.mean_error, b.mean_error}, {a.rms_error, b.rms_error},
                      {a.bias, b.bias}, {a.min_row_cosine, b.min_row_cosine},
                      {a.max_row_rel_l2, b.max_row_rel_l2}}) {
    EXPECT_EQ(bits(x), bits(y));
  }
  EXPECT_EQ(a.nonfinite_mismatches, b.nonfinite_mismatches);
  EXPECT_EQ(a.reference_nans, b.reference_nans);
  EXPECT_EQ(a.matched_nonfinite, b.matched_nonfinite);
  same_loc(a.first_nonfinite, b.first_nonfinite);
  same_loc(a.worst_row_cosine, b.worst_row_cosine);
  same_loc(a.worst_row_rel_l2, b.worst_row_rel_l2);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  EXPECT_EQ(a.row_begin, b.row_begin);
  for (size_t r = 0; r < a.rows.size(); ++r) {
    const RowMetrics& x = a.rows[r];
    const RowMetrics& y = b.rows[r];
    EXPECT_EQ(x.where.ToString(), y.where.ToString()) << "row " << r;
    EXPECT_EQ(x.length, y.length) << "row " << r;
    EXPECT_EQ(x.nonfinite_mismatches, y.nonfinite_mismatches) << "row " << r;
    for (auto [u, v] : {std::pair{x.max_abs_error, y.max_abs_error},
                        {x.ref_max_abs, y.ref_max_abs}, {x.err_l2, y.err_l2},
                        {x.ref_l2, y.ref_l2}, {x.obs_l2, y.obs_l2}, {x.dot, y.dot}}) {
      ASSERT_EQ(bits(u), bits(v)) << "row " << r;
    }
  }
}

TEST(Compare, ThreadCountDoesNotChangeTheMetrics) {
  // Large enough to be split (pieces of whole lines of the last axis), with ties for the
  // largest error in different pieces, non-finite pairs, and a packed lse whose rows end at
  // sequence boundaries inside a line (a zero-length sequence among them).
  Problem p = SmallProblem();
  p.batch = 2;
  p.seqlen_q = 700;
  p.heads_q = 4;
  p.heads_kv = 4;
  p.head_dim = p.head_dim_v = 64;
  Tensor ref = Iota(p.OShape());
  ref.at<double>({0, 5, 0, 0}) = 1;  // two equal largest errors (100): the first is named
  ref.at<double>({1, 650, 3, 63}) = 1;
  Tensor obs = ref.Clone();
  uint64_t x = 12345;
  for (double& v : obs.span<double>()) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v += static_cast<double>(static_cast<int64_t>(x >> 40) % 7 - 3) * 0.25;
  }
  obs.at<double>({0, 10, 1, 3}) = kNan;
  obs.at<double>({1, 600, 2, 5}) = kInf;
  obs.at<double>({0, 5, 0, 0}) = 101;
  obs.at<double>({1, 650, 3, 63}) = 101;
  Problem v = SmallProblem();
  v.batch = 4;
  v.heads_q = v.heads_kv = 4;
  v.cu_seqlens_q = std::vector<int32_t>{0, 9000, 9000, 15000, 20000};
  v.cu_seqlens_k = v.cu_seqlens_q;
  Tensor lref = Iota(v.LseShape());  // [4, 20000]
  Tensor lobs = lref.Clone();
  for (double& e : lobs.span<double>()) e *= 1 + 1e-7;
  lobs.at<double>({2, 14999}) = -kInf;
  for (const auto& [o, r, layout] :
       {std::tuple{&obs, &ref, LayoutOf(p, "o")}, std::tuple{&lobs, &lref, LayoutOf(v, "lse")}}) {
    auto one = Compare("t", *o, *r, Format::kBF16, layout, {.threads = 1});
    auto three = Compare("t", *o, *r, Format::kBF16, layout, {.threads = 3});
    ASSERT_TRUE(one.ok() && three.ok());
    ExpectSameMetrics(*one, *three);
    EXPECT_GE(one->rows.size(), 12u);
    if (layout.axes.size() == 4) EXPECT_EQ(one->worst_abs.flat, ref.dim(3) * ref.dim(2) * 5);
  }
}

TEST(Compare, ShapeMismatchIsAnErrorNamingTheTensor) {
  const Tensor a = Tensor::FromF64({2}, {1, 2});
  const Tensor b = Tensor::FromF64({3}, {1, 2, 3});
  auto m = Compare("dv", a, b, Format::kF32, Layout::Flat(1));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("'dv'"), std::string::npos);
}

TEST(Compare, WidensLowPrecisionCodes) {
  // bf16 codes 0x3F80 (1.0) and 0x3F81 (1 + 2^-7) against an f64 reference of 1: one ULP.
  Tensor obs = Tensor::Zeros(DType::kBF16, {2});
  obs.at<uint16_t>({0}) = 0x3F80;
  obs.at<uint16_t>({1}) = 0x3F81;
  const Tensor ref = Tensor::FromF64({2}, {1.0, 1.0});
  auto m = Compare("o", obs, ref, Format::kBF16, Layout::Flat(1));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->max_ulp, 1.0);
  EXPECT_EQ(m->worst_ulp.flat, 1);
}

}  // namespace
}  // namespace attest
