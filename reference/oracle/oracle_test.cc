// Tests of the float64 oracle (oracle.h) against known answers and invariants: uniform and
// one-hot attention, constant V, Sk = 1, empty rows, keys seen by no query, bitwise
// determinism across thread counts and tile-independent semantics, kept scores = recomputed
// scores bitwise, GQA = repeated MHA,
// strided inputs, input errors, precision names. Certification against MP is in
// oracle_cert_test.cc.
#include "reference/oracle/oracle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "reference/oracle/oracle_exp.h"
#include "reference/oracle/oracle_mp.h"
#include "reference/oracle/oracle_test_util.h"
#include "reference/problem/mask.h"

namespace attest {
namespace {

using oracle_test::Base;
using oracle_test::FeatureProblems;
using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;
using oracle_test::RandomInputs;

constexpr double kU = 0x1p-53;

OracleOptions Tiles(int64_t tq, int64_t tk, int threads = 2) {
  OracleOptions o;
  o.tile_q = tq;
  o.tile_k = tk;
  o.threads = threads;
  return o;
}

TEST(OracleTest, UniformScoresGiveTheMeanOfVAndLogN) {
  // Every key row equal: every score of a row is the same s, so o = mean(v), lse = log n + s.
  Problem p = Base(1, 1, 1, 5, 37, 8, 8);
  auto in = RandomInputs(p, 1);
  for (int64_t j = 1; j < p.seqlen_k; ++j) {
    for (int64_t d = 0; d < p.head_dim; ++d)
      in.k.at<double>({0, j, 0, d}) = in.k.at<double>({0, 0, 0, d});
  }
  const ForwardOut f = Forward<double>(p, in.q, in.k, in.v, Tiles(2, 8));
  for (int64_t i = 0; i < p.seqlen_q; ++i) {
    double s = 0;
    for (int64_t d = 0; d < p.head_dim; ++d)
      s += in.q.at<double>({0, i, 0, d}) * in.k.at<double>({0, 0, 0, d});
    s *= p.EffectiveScale();
    EXPECT_NEAR(f.lse.at<double>({0, 0, i}), std::log(37.0) + s, 8 * kU * (std::abs(s) + 4));
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      double mean = 0;
      for (int64_t j = 0; j < p.seqlen_k; ++j) mean += in.v.at<double>({0, j, 0, d});
      mean /= 37.0;
      EXPECT_NEAR(f.o.at<double>({0, i, 0, d}), mean, 64 * kU * 4);
    }
  }
}

TEST(OracleTest, OneHugeScoreSelectsItsValue) {
  Problem p = Base(1, 1, 1, 3, 20, 4, 4);
  p.scale = 1.0;
  auto in = RandomInputs(p, 2);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t d = 0; d < 4; ++d) in.q.at<double>({0, i, 0, d}) = d == 0 ? 1.0 : 0.0;
  }
  for (int64_t j = 0; j < 20; ++j) {
    for (int64_t d = 0; d < 4; ++d)
      in.k.at<double>({0, j, 0, d}) = d == 0 ? (j == 11 ? 900.0 : 1.0) : 0.0;
  }
  const ForwardOut f = Forward<double>(p, in.q, in.k, in.v, Tiles(64, 4));
  for (int64_t i = 0; i < 3; ++i) {
    // Other weights are exp(1 - 900): far below u, so o is v_11 exactly and lse = 900.
    EXPECT_EQ(f.lse.at<double>({0, 0, i}), 900.0);
    for (int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(f.o.at<double>({0, i, 0, d}), in.v.at<double>({0, 11, 0, d}));
  }
}

TEST(OracleTest, ConstantVHasZeroScoreGradientsAndDvSumsDo) {
  Problem p = Base(1, 2, 1, 9, 14, 8, 8);
  p.causal = true;  // Sq < Sk: every row sees some key
  auto in = RandomInputs(p, 3);
  for (int64_t j = 0; j < 14; ++j) {
    for (int64_t d = 0; d < 8; ++d)
      in.v.at<double>({0, j, 0, d}) = 0.25 * static_cast<double>(d + 1);
  }
  const BackwardOut b = Backward<double>(p, in.q, in.k, in.v, in.dout, Tiles(4, 4));
  // o = the constant row; dS = P (dO.v - dO.o) = 0 up to rounding, so dq, dk ~ 0.
  for (int64_t i = 0; i < 9; ++i) {
    for (int64_t d = 0; d < 8; ++d)
      EXPECT_NEAR(b.o.at<double>({0, i, 0, d}), 0.25 * (d + 1), 8 * kU * 2);
  }
  EXPECT_LE(MaxAbs(b.dq), ErrorBound(b.stats, OracleTensor::kDq));
  EXPECT_LE(MaxAbs(b.dk), ErrorBound(b.stats, OracleTensor::kDk));
  // sum_j dv_j = sum over (h, i) of dO_i (each row's weights sum to one).
  for (int64_t d = 0; d < 8; ++d) {
    double sdv = 0, sdo = 0;
    for (int64_t j = 0; j < 14; ++j) sdv += b.dv.at<double>({0, j, 0, d});
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 9; ++i) sdo += in.dout.at<double>({0, i, h, d});
    }
    EXPECT_NEAR(sdv, sdo, 1e-13);
  }
}

TEST(OracleTest, SingleKeyCopiesVAndHasNoScoreGradient) {
  Problem p = Base(2, 2, 2, 5, 1, 8, 8);
  const auto in = RandomInputs(p, 4);
  const BackwardOut b = Backward<double>(p, in.q, in.k, in.v, in.dout, {});
  for (int64_t bb = 0; bb < 2; ++bb) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 5; ++i) {
        double s = 0;
        for (int64_t d = 0; d < 8; ++d)
          s += in.q.at<double>({bb, i, h, d}) * in.k.at<double>({bb, 0, h, d});
        EXPECT_NEAR(b.lse.at<double>({bb, h, i}), s * p.EffectiveScale(), 1e-14);
        for (int64_t d = 0; d < 8; ++d) {
          EXPECT_EQ(b.o.at<double>({bb, i, h, d}), in.v.at<double>({bb, 0, h, d}));
        }
      }
      for (int64_t d = 0; d < 8; ++d) {
        double sdo = 0;
        for (int64_t i = 0; i < 5; ++i) sdo += in.dout.at<double>({bb, i, h, d});
        EXPECT_NEAR(b.dv.at<double>({bb, 0, h, d}), sdo, 1e-14);
      }
    }
  }
  EXPECT_LE(MaxAbs(b.dq), ErrorBound(b.stats, OracleTensor::kDq));
  EXPECT_LE(MaxAbs(b.dk), ErrorBound(b.stats, OracleTensor::kDk));
}

// Every feature problem: empty rows are exactly (o, lse, dq, delta) = (0, -inf, 0, 0); keys no
// query sees have dk = dv = 0 exactly; visible rows are finite.
TEST(OracleTest, EmptyRowsAndUnseenKeysAreExact) {
  uint64_t seed = 10;
  int64_t empty_total = 0, unseen_total = 0;
  for (const auto& np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    const Problem& p = np.p;
    const auto in = RandomInputs(p, ++seed, np.q_sigma);
    const BackwardOut b = Backward<double>(p, in.q, in.k, in.v, in.dout, Tiles(4, 3));
    int64_t empty = 0, unseen = 0;
    for (int64_t bb = 0; bb < p.batch; ++bb) {
      const MaskView mask(p, bb);
      const Sequence& seq = mask.sequence();
      const double* lse = b.lse.data<double>();
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t i = 0; i < seq.q_len; ++i) {
          bool any = false;
          for (int64_t j = 0; j < seq.k_len; ++j) any = any || mask.Visible(i, j);
          const int64_t row = seq.q_begin + i;
          const double* o = b.o.data<double>() + (row * p.heads_q + h) * p.head_dim_v;
          const double* dq = b.dq.data<double>() + (row * p.heads_q + h) * p.head_dim;
          const int64_t li =
              p.varlen() ? h * p.TotalQ() + row : (bb * p.heads_q + h) * p.seqlen_q + i;
          if (!any) {
            ++empty;
            EXPECT_EQ(lse[li], -INFINITY);
            EXPECT_EQ(b.delta.data<double>()[li], 0.0);
            for (int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_EQ(o[d], 0.0);
            for (int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(dq[d], 0.0);
          } else {
            EXPECT_TRUE(std::isfinite(lse[li]));
          }
        }
      }
      for (int64_t g = 0; g < p.heads_kv; ++g) {
        for (int64_t j = 0; j < seq.k_len; ++j) {
          bool seen = false;
          for (int64_t i = 0; i < seq.q_len; ++i) seen = seen || mask.Visible(i, j);
          if (seen) continue;
          ++unseen;
          const int64_t row = seq.k_begin + j;
          for (int64_t d = 0; d < p.head_dim; ++d)
            EXPECT_EQ(b.dk.data<double>()[(row * p.heads_kv + g) * p.head_dim + d], 0.0);
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            EXPECT_EQ(b.dv.data<double>()[(row * p.heads_kv + g) * p.head_dim_v + d], 0.0);
        }
      }
    }
    EXPECT_EQ(b.stats.empty_rows, empty);
    EXPECT_EQ(b.stats.unseen_keys, unseen);
    empty_total += empty;
    unseen_total += unseen;
  }
  // The feature list must actually exercise both.
  EXPECT_GT(empty_total, 0);
  EXPECT_GT(unseen_total, 0);
}

TEST(OracleTest, ZeroLengthSequencesGiveEmptyOutputs) {
  for (const auto& [sq, sk] : {std::pair<int64_t, int64_t>{4, 0}, {0, 5}, {0, 0}}) {
    Problem p = Base(2, 2, 1, sq, sk, 8, 4);
    const auto in = RandomInputs(p, 12);
    for (Precision pr : {Precision::kDouble, Precision::kMp128}) {
      const BackwardOut b = Backward(pr, p, in.q, in.k, in.v, in.dout);
      EXPECT_EQ(b.stats.empty_rows, 2 * 2 * sq);
      EXPECT_EQ(b.stats.unseen_keys, 2 * 1 * sk);
      for (double x : b.lse.span<const double>()) EXPECT_EQ(x, -INFINITY);
      for (const Tensor* t : {&b.o, &b.dq, &b.dk, &b.dv, &b.delta}) EXPECT_EQ(MaxAbs(*t), 0.0);
    }
  }
}

TEST(OracleTest, ResultsAreBitwiseIndependentOfThreadCount) {
  uint64_t seed = 30;
  for (const auto& np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    const auto in = RandomInputs(np.p, ++seed, np.q_sigma);
    const BackwardOut ref = Backward<double>(np.p, in.q, in.k, in.v, in.dout, Tiles(4, 5, 1));
    for (int threads : {2, 3, 8}) {
      const BackwardOut b = Backward<double>(np.p, in.q, in.k, in.v, in.dout, Tiles(4, 5, threads));
      EXPECT_TRUE(b.o.BitwiseEqual(ref.o));
      EXPECT_TRUE(b.lse.BitwiseEqual(ref.lse));
      EXPECT_TRUE(b.dq.BitwiseEqual(ref.dq));
      EXPECT_TRUE(b.dk.BitwiseEqual(ref.dk));
      EXPECT_TRUE(b.dv.BitwiseEqual(ref.dv));
      EXPECT_TRUE(b.delta.BitwiseEqual(ref.delta));
    }
  }
  // And on a larger problem where tiles are BLAS-sized.
  Problem p = Base(1, 4, 2, 300, 333, 64, 64);
  p.causal = true;
  const auto in = RandomInputs(p, 77);
  const BackwardOut ref = Backward<double>(p, in.q, in.k, in.v, in.dout, Tiles(64, 128, 1));
  const BackwardOut b = Backward<double>(p, in.q, in.k, in.v, in.dout, Tiles(64, 128, 5));
  EXPECT_TRUE(b.dq.BitwiseEqual(ref.dq));
  EXPECT_TRUE(b.dk.BitwiseEqual(ref.dk));
  EXPECT_TRUE(b.dv.BitwiseEqual(ref.dv));
  EXPECT_TRUE(b.o.BitwiseEqual(ref.o));
}

// The backward reuses a query tile's scores from its forward when they fit in
// score_cache_bytes and recomputes them otherwise: the same product on the same operands, so the
// results and the statistics must be the same bits either way, also when some sequences of a
// varlen batch fit and others do not.
TEST(OracleTest, KeptScoresGiveTheBitsOfRecomputedOnes) {
  auto expect_same = [](const BackwardOut& a, const BackwardOut& b) {
    EXPECT_TRUE(a.o.BitwiseEqual(b.o));
    EXPECT_TRUE(a.lse.BitwiseEqual(b.lse));
    EXPECT_TRUE(a.dq.BitwiseEqual(b.dq));
    EXPECT_TRUE(a.dk.BitwiseEqual(b.dk));
    EXPECT_TRUE(a.dv.BitwiseEqual(b.dv));
    EXPECT_TRUE(a.delta.BitwiseEqual(b.delta));
    EXPECT_EQ(a.stats.score_abs_max, b.stats.score_abs_max);
    EXPECT_EQ(a.stats.col_mass_max, b.stats.col_mass_max);
    EXPECT_EQ(a.stats.sum_len_k, b.stats.sum_len_k);
    EXPECT_EQ(a.stats.sum_len_q, b.stats.sum_len_q);
    EXPECT_EQ(a.stats.max_queries, b.stats.max_queries);
    EXPECT_EQ(a.stats.unseen_keys, b.stats.unseen_keys);
  };
  uint64_t seed = 90;
  for (const auto& np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    const auto in = RandomInputs(np.p, ++seed, np.q_sigma);
    for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{4, 5}, {3, 2}, {0, 0}}) {
      OracleOptions keep = Tiles(tq, tk), recompute = Tiles(tq, tk);
      recompute.score_cache_bytes = 0;
      expect_same(Backward<double>(np.p, in.q, in.k, in.v, in.dout, keep),
                  Backward<double>(np.p, in.q, in.k, in.v, in.dout, recompute));
    }
  }
  // BLAS-sized tiles, softcap + ALiBi + GQA + causal.
  Problem p = Base(1, 4, 2, 300, 333, 64, 48);
  p.causal = true;
  p.softcap = 5.0;
  p.alibi_slopes = std::vector<double>{0.25, 0.125, 0.0625, 0.03125};
  const auto in = RandomInputs(p, 78, 2.0);
  OracleOptions recompute = Tiles(64, 128);
  recompute.score_cache_bytes = 0;
  expect_same(Backward<double>(p, in.q, in.k, in.v, in.dout, Tiles(64, 128)),
              Backward<double>(p, in.q, in.k, in.v, in.dout, recompute));
  // Varlen: with 8 x 7 x 16 bytes (softcap: two strips) only the sequences of <= 7 keys keep
  // their scores.
  Problem v = Base(4, 2, 1, 9, 12, 8, 8);
  v.cu_seqlens_q = std::vector<int32_t>{0, 5, 5, 14, 17};
  v.cu_seqlens_k = std::vector<int32_t>{0, 7, 7, 19, 19};
  v.softcap = 3.0;
  const auto vin = RandomInputs(v, 79);
  OracleOptions mixed = Tiles(8, 4);
  mixed.score_cache_bytes = 8 * 7 * 16;
  recompute = Tiles(8, 4);
  recompute.score_cache_bytes = 0;
  expect_same(Backward<double>(v, vin.q, vin.k, vin.v, vin.dout, mixed),
              Backward<double>(v, vin.q, vin.k, vin.v, vin.dout, recompute));
}

TEST(OracleTest, TileSizesChangeOnlyRounding) {
  uint64_t seed = 50;
  for (const auto& np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    const auto in = RandomInputs(np.p, ++seed, np.q_sigma);
    const BackwardOut a = Backward<double>(np.p, in.q, in.k, in.v, in.dout, Tiles(64, 256));
    const BackwardOut b = Backward<double>(np.p, in.q, in.k, in.v, in.dout, Tiles(1, 1));
    for (const auto& [t, x, y] : {std::tuple{OracleTensor::kO, &a.o, &b.o},
                                  {OracleTensor::kLse, &a.lse, &b.lse},
                                  {OracleTensor::kDq, &a.dq, &b.dq},
                                  {OracleTensor::kDk, &a.dk, &b.dk},
                                  {OracleTensor::kDv, &a.dv, &b.dv}}) {
      EXPECT_LE(MaxAbsDiff(*x, *y), ErrorBound(a.stats, t) + ErrorBound(b.stats, t)) << Name(t);
    }
  }
}

TEST(OracleTest, GqaEqualsMhaWithRepeatedKeysAndValues) {
  Problem gqa = Base(2, 6, 2, 11, 14, 8, 5);
  gqa.causal = true;
  gqa.alibi_slopes = std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.03, 0.01};
  Problem mha = gqa;
  mha.heads_kv = 6;
  const auto in = RandomInputs(gqa, 8);
  Tensor k = Tensor::Zeros(DType::kF64, mha.KShape()), v = Tensor::Zeros(DType::kF64, mha.VShape());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < 14; ++j) {
      for (int64_t h = 0; h < 6; ++h) {
        for (int64_t d = 0; d < 8; ++d)
          k.at<double>({b, j, h, d}) = in.k.at<double>({b, j, h / 3, d});
        for (int64_t d = 0; d < 5; ++d)
          v.at<double>({b, j, h, d}) = in.v.at<double>({b, j, h / 3, d});
      }
    }
  }
  const BackwardOut g = Backward<double>(gqa, in.q, in.k, in.v, in.dout, Tiles(4, 4));
  const BackwardOut m = Backward<double>(mha, in.q, k, v, in.dout, Tiles(4, 4));
  EXPECT_LE(MaxAbsDiff(g.o, m.o), ErrorBound(g.stats, OracleTensor::kO));
  EXPECT_LE(MaxAbsDiff(g.lse, m.lse), ErrorBound(g.stats, OracleTensor::kLse));
  EXPECT_LE(MaxAbsDiff(g.dq, m.dq), ErrorBound(g.stats, OracleTensor::kDq));
  // dk/dv of a kv head: the sum over its query heads of the MHA gradients.
  Tensor dk = Tensor::Zeros(DType::kF64, gqa.KShape()),
         dv = Tensor::Zeros(DType::kF64, gqa.VShape());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < 14; ++j) {
      for (int64_t h = 0; h < 6; ++h) {
        for (int64_t d = 0; d < 8; ++d)
          dk.at<double>({b, j, h / 3, d}) += m.dk.at<double>({b, j, h, d});
        for (int64_t d = 0; d < 5; ++d)
          dv.at<double>({b, j, h / 3, d}) += m.dv.at<double>({b, j, h, d});
      }
    }
  }
  EXPECT_LE(MaxAbsDiff(g.dk, dk), 2 * ErrorBound(g.stats, OracleTensor::kDk));
  EXPECT_LE(MaxAbsDiff(g.dv, dv), 2 * ErrorBound(g.stats, OracleTensor::kDv));
  EXPECT_GT(MaxAbs(g.dk), 1e-3);
}

TEST(OracleTest, StridedInputsGiveTheSameResult) {
  Problem p = Base(2, 3, 3, 7, 9, 8, 8);
  const auto in = RandomInputs(p, 9);
  // q stored as [B, H, S, D] and viewed back as [B, S, H, D].
  Tensor qt = in.q.Permute({0, 2, 1, 3}).Clone();
  Tensor qview = qt.Permute({0, 2, 1, 3});
  ASSERT_FALSE(qview.contiguous());
  const BackwardOut a = Backward<double>(p, in.q, in.k, in.v, in.dout, {});
  const BackwardOut b = Backward<double>(p, qview, in.k, in.v, in.dout, {});
  EXPECT_TRUE(a.dq.BitwiseEqual(b.dq));
  EXPECT_TRUE(a.o.BitwiseEqual(b.o));
}

TEST(OracleTest, RejectsBadShapesAndDtypes) {
  Problem p = Base(1, 2, 2, 4, 5, 8, 8);
  const auto in = RandomInputs(p, 10);
  Problem other = p;
  other.seqlen_k = 6;
  EXPECT_THROW(Forward<double>(other, in.q, in.k, in.v), std::invalid_argument);
  Tensor k32 = Tensor::Zeros(DType::kF32, p.KShape());
  try {
    Forward<double>(p, in.q, k32, in.v);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("k:"), std::string::npos) << e.what();
  }
  Problem bad = p;
  bad.heads_kv = 3;
  EXPECT_THROW(Forward(Precision::kMp128, bad, in.q, in.k, in.v), std::invalid_argument);
}

// docs/semantics.md "Non-finite inputs": NaN or infinity in q, k, v or do is refused (every
// precision, forward and backward), naming the tensor and element, instead of a NaN row
// passing as an empty one (o = 0, lse = -inf) beside a NaN dq.
TEST(OracleTest, RefusesNonFiniteInputsNamingTheElement) {
  Problem p = Base(1, 2, 2, 4, 5, 8, 8);
  const auto in = RandomInputs(p, 11);
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  Tensor q = in.q.Clone();
  q.span<double>()[1 * 2 * 8 + 1 * 8 + 3] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(message([&] { Forward<double>(p, q, in.k, in.v); }),
            "oracle: input q[0, 1, 1, 3] is NaN: the oracle refuses non-finite inputs (NaN or "
            "infinity in q, k, v or do)");
  EXPECT_NE(message([&] { Forward(Precision::kMp128, p, q, in.k, in.v); }).find("q[0, 1, 1, 3]"),
            std::string::npos);
  Tensor dout = in.dout.Clone();
  dout.span<double>()[0] = -std::numeric_limits<double>::infinity();
  EXPECT_NE(message([&] { Backward<double>(p, in.q, in.k, in.v, dout); })
                .find("input do[0, 0, 0, 0] is -inf"),
            std::string::npos);
}

// The tile exp kernel: at most 1 ulp from the correctly rounded exp (MPFR at 200 bits) over
// the softmax range, exact specials, subnormal results within one subnormal ulp.
TEST(OracleTest, ExpKernelIsWithinOneUlp) {
  using Big = Mp256;  // exp correctly rounded to 257 bits, then once to double
  std::mt19937_64 rng(2026);
  std::vector<double> x;
  std::uniform_real_distribution<double> wide(-745.0, 0.0), narrow(-2.0, 2.0), up(0.0, 709.7);
  for (int n = 0; n < 40000; ++n) x.push_back(wide(rng));
  for (int n = 0; n < 40000; ++n) x.push_back(narrow(rng));
  for (int n = 0; n < 2000; ++n) x.push_back(up(rng));
  for (double v : {0.0, -0.0, -1e-300, 1e-17, -0.3465735902799726, 0.3465735902799726,
                   -708.3964185322641, -708.4, -744.44, -745.1, 709.78})
    x.push_back(v);
  std::vector<double> y = x;
  oracle_internal::ExpInPlace(y.data(), static_cast<int64_t>(y.size()));
  double worst = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    const double exact = static_cast<double>(exp(Big(x[e])));
    const double ulp = std::nextafter(std::abs(exact), INFINITY) - std::abs(exact);
    const double err = std::abs(y[e] - exact) / ulp;
    if (exact >= 0x1p-1022) worst = std::max(worst, err);
    ASSERT_LE(err, 1.0) << "exp(" << x[e] << ")";  // faithful, subnormals included
  }
  std::printf("  exp kernel: max error %.3f ulp over %zu arguments\n", worst, x.size());
  double specials[] = {-INFINITY, -746.0, -1e308, INFINITY, 710.0, NAN};
  oracle_internal::ExpInPlace(specials, 6);
  EXPECT_EQ(specials[0], 0.0);
  EXPECT_EQ(specials[1], 0.0);
  EXPECT_EQ(specials[2], 0.0);
  EXPECT_EQ(specials[3], INFINITY);
  EXPECT_EQ(specials[4], INFINITY);
  EXPECT_TRUE(std::isnan(specials[5]));
}

TEST(OracleTest, PrecisionNames) {
  EXPECT_EQ(ParsePrecision("double"), Precision::kDouble);
  EXPECT_EQ(ParsePrecision("f64"), Precision::kDouble);
  EXPECT_EQ(ParsePrecision("mp128"), Precision::kMp128);
  EXPECT_EQ(ParsePrecision("mp256"), Precision::kMp256);
  EXPECT_FALSE(ParsePrecision("mp512").has_value());
  for (Precision pr : {Precision::kDouble, Precision::kMp128, Precision::kMp256}) {
    EXPECT_EQ(ParsePrecision(Name(pr)), pr);
  }
}

TEST(OracleTest, DispatchMatchesTypedCalls) {
  Problem p = Base(1, 2, 1, 6, 7, 8, 8);
  p.softcap = 3.0;
  const auto in = RandomInputs(p, 11);
  const ForwardOut a = Forward(Precision::kDouble, p, in.q, in.k, in.v);
  const ForwardOut b = Forward<double>(p, in.q, in.k, in.v);
  EXPECT_TRUE(a.o.BitwiseEqual(b.o));
  const BackwardOut c = Backward(Precision::kMp256, p, in.q, in.k, in.v, in.dout);
  EXPECT_EQ(c.stats.unit_roundoff, std::ldexp(1.0, -257));
  EXPECT_LE(MaxAbsDiff(c.o, a.o), ErrorBound(a.stats, OracleTensor::kO));
}

}  // namespace
}  // namespace attest
