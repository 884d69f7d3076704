// Certification of the float64 oracle (oracle.h): on every feature problem, double against
// mp256 within ErrorBound for o, lse, dq, dk, dv, delta, and with a learnable sink dsink too
// (bounds printed with the observed margin); the mp256 backward against central finite
// differences of the mp256 forward (directional derivatives of L = <dO, O>, ~40 correct
// digits); mp128 against mp256.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_generic.h"
#include "reference/oracle/oracle_mp.h"
#include "reference/oracle/oracle_test_util.h"

namespace attest {
namespace {

using oracle_test::FeatureProblems;
using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;
using oracle_test::NamedProblem;
using oracle_test::RandomInputs;

struct Pair {
  OracleTensor t;
  const Tensor* x;
  const Tensor* y;
};

// |x - y| <= ErrorBound(sx) + ErrorBound(sy) for every tensor; also that the bound is
// meaningful: relative to the tensor's max-abs it stays below 1e-10 (1 + a), a = the score
// magnitude (so an oracle accurate only to float32, ~1e-7 relative, would fail it).
void ExpectCertified(const std::string& name, const BackwardOut& x, const BackwardOut& y) {
  const Pair pairs[] = {
      {OracleTensor::kO, &x.o, &y.o},    {OracleTensor::kLse, &x.lse, &y.lse},
      {OracleTensor::kDq, &x.dq, &y.dq}, {OracleTensor::kDk, &x.dk, &y.dk},
      {OracleTensor::kDv, &x.dv, &y.dv}, {OracleTensor::kDelta, &x.delta, &y.delta},
      {OracleTensor::kDsink, &x.dsink, &y.dsink}};
  for (const Pair& pr : pairs) {
    if (!pr.x->defined()) continue;  // dsink: only with a sink
    const double err = MaxAbsDiff(*pr.x, *pr.y);
    const double bound = ErrorBound(x.stats, pr.t) + ErrorBound(y.stats, pr.t);
    const double mag = MaxAbs(*pr.y);
    std::printf("  %-28s %-5s max|err| %.3e  bound %.3e  margin %.2e  bound/max|x| %.2e\n",
                name.c_str(), std::string(Name(pr.t)).c_str(), err, bound,
                bound > 0 ? err / bound : 0.0, mag > 0 ? bound / mag : 0.0);
    EXPECT_LE(err, bound) << name << " " << Name(pr.t);
    // dsink sums signed terms (it may cancel to nearly 0): its bound is judged against the
    // sum of their magnitudes, S G V.
    const double cond = 1 + std::max(x.stats.score_abs_max, x.stats.sink_abs_max);
    if (pr.t == OracleTensor::kDsink) {
      EXPECT_LT(bound, 1e-10 * cond * x.stats.sink_mass_max * x.stats.do_norm_max *
                           x.stats.v_norm_max)
          << name << ": vacuous dsink bound";
      continue;
    }
    if (mag > 0)
      EXPECT_LT(bound / mag, 1e-10 * cond) << name << " " << Name(pr.t) << ": vacuous bound";
  }
}

TEST(OracleCertTest, DoubleMatchesMp256WithinTheBoundOnEveryFeature) {
  uint64_t seed = 100;
  for (const NamedProblem& np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    const auto in = RandomInputs(np.p, ++seed, np.q_sigma);
    const BackwardOut mp = Backward<Mp256>(np.p, in.q, in.k, in.v, in.dout, {});
    // Default tiles, and tiles small enough that every problem spans several query and key
    // tiles (online-softmax rescaling, partial tiles, skipped tiles).
    // (0 x 0: AutoTiles.)
    for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{0, 0}, {4, 5}, {3, 2}}) {
      OracleOptions opt;
      opt.tile_q = tq;
      opt.tile_k = tk;
      opt.threads = 2;
      const BackwardOut d = Backward<double>(np.p, in.q, in.k, in.v, in.dout, opt);
      ExpectCertified(np.name + "/tiles" + std::to_string(tq) + "x" + std::to_string(tk), d, mp);
      // The backward's forward is the forward.
      const ForwardOut f = Forward<double>(np.p, in.q, in.k, in.v, opt);
      EXPECT_TRUE(f.o.BitwiseEqual(d.o));
      EXPECT_TRUE(f.lse.BitwiseEqual(d.lse));
    }
  }
}

TEST(OracleCertTest, DoubleMatchesMp256WithinTheBoundWithALearnableSink) {
  // Every feature problem with a sink per query head: alternately ordinary (N(0, 2^2)) and
  // large (+-12, above and below the rows' maxima), -inf in the last head of problems with
  // three or more heads (no sink there).
  uint64_t seed = 700;
  for (NamedProblem np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    np.p.sink = true;
    std::mt19937_64 rng(++seed);
    std::normal_distribution<double> normal(0.0, 2.0);
    std::vector<double> values;
    for (int64_t h = 0; h < np.p.heads_q; ++h) {
      values.push_back(h % 2 == 0 ? normal(rng) : (h % 4 == 1 ? 12.0 : -12.0));
    }
    if (np.p.heads_q >= 3) values.back() = -std::numeric_limits<double>::infinity();
    const Tensor sink = Tensor::FromF64({np.p.heads_q}, values);
    const auto in = RandomInputs(np.p, seed, np.q_sigma);
    OracleOptions opt;
    opt.sink = &sink;
    const BackwardOut mp = Backward<Mp256>(np.p, in.q, in.k, in.v, in.dout, opt);
    opt.threads = 2;
    for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{0, 0}, {3, 2}}) {
      opt.tile_q = tq;
      opt.tile_k = tk;
      const BackwardOut d = Backward<double>(np.p, in.q, in.k, in.v, in.dout, opt);
      ExpectCertified(np.name + "/sink/tiles" + std::to_string(tq) + "x" + std::to_string(tk), d,
                      mp);
    }
  }
}

TEST(OracleCertTest, BoundHoldsForSharpSoftmaxAndLargeLogits) {
  // q scaled by 8 and 30: near-one-hot rows, score magnitudes ~ 60 and ~ 250.
  for (double sigma : {8.0, 30.0}) {
    Problem p = oracle_test::Base(1, 2, 1, 24, 40, 16, 16);
    p.causal = true;
    const auto in = RandomInputs(p, 7, sigma);
    const BackwardOut mp = Backward<Mp256>(p, in.q, in.k, in.v, in.dout, {});
    OracleOptions opt;
    opt.tile_q = 8;
    opt.tile_k = 16;
    const BackwardOut d = Backward<double>(p, in.q, in.k, in.v, in.dout, opt);
    ExpectCertified("sharp_sigma" + std::to_string(static_cast<int>(sigma)), d, mp);
  }
}

TEST(OracleCertTest, BoundHoldsWithBlasSizedTiles) {
  // 64 x 256 tiles (key tiles of two k blocks of the panel products, oracle_gemm.h; small
  // enough that the MP256 reference stays a few seconds) on a problem spanning 2 query tiles
  // and 2 key tiles per head, GQA 2,
  // causal with softcap and ALiBi: product shapes of the performance path's order.
  Problem p = oracle_test::Base(1, 2, 1, 80, 280, 64, 48);
  p.causal = true;
  p.softcap = 6.0;
  p.alibi_slopes = std::vector<double>{0.25, 0.0625};
  const auto in = RandomInputs(p, 31, 1.5);
  const BackwardOut mp = Backward<Mp256>(p, in.q, in.k, in.v, in.dout, {});
  OracleOptions opt;
  opt.tile_q = 64;
  opt.tile_k = 256;
  const BackwardOut d = Backward<double>(p, in.q, in.k, in.v, in.dout, opt);
  ExpectCertified("blas_tiles_gqa_softcap_alibi", d, mp);
}

TEST(OracleCertTest, Mp128AgreesWithMp256ToItsPrecision) {
  for (const NamedProblem& np : FeatureProblems()) {
    if (np.name != "softcap_alibi_causal" && np.name != "varlen" && np.name != "block_sparse") {
      continue;
    }
    const auto in = RandomInputs(np.p, 5, np.q_sigma);
    const BackwardOut a = Backward<Mp128>(np.p, in.q, in.k, in.v, in.dout, {});
    const BackwardOut b = Backward<Mp256>(np.p, in.q, in.k, in.v, in.dout, {});
    // Both round once to double: at most one ulp apart unless a value lies within 2^-128 of
    // a rounding boundary, which these inputs do not hit. Check 2 ulp of the max.
    for (const auto& [x, y] : {std::pair{&a.o, &b.o},
                               {&a.dq, &b.dq},
                               {&a.dk, &b.dk},
                               {&a.dv, &b.dv},
                               {&a.lse, &b.lse}}) {
      EXPECT_LE(MaxAbsDiff(*x, *y), 4.5e-16 * MaxAbs(*y)) << np.name;
    }
  }
}

// L(q, k, v) = <dO, O(q, k, v)> in T; its gradient is (dq, dk, dv) at dO.
template <class T>
T Loss(const oracle_internal::GenericRun<T>& run) {
  T l = 0;
  for (size_t e = 0; e < run.o.size(); ++e) l += run.dout[e] * run.o[e];
  return l;
}

TEST(OracleCertTest, Mp256BackwardMatchesFiniteDifferencesOfItsForward) {
  using T = Mp256;
  using oracle_internal::GenericRun;
  const T h = T(1e-20);  // central difference: O(h^2) = 1e-40 truncation, 1e-77 / h rounding
  uint64_t seed = 900;
  for (const NamedProblem& np : FeatureProblems()) {
    SCOPED_TRACE(np.name);
    const auto in = RandomInputs(np.p, ++seed, np.q_sigma);
    // MPFR's per-thread caches are freed by each worker (as the library's entry points do).
    const auto free_caches = [] {
#if ATTEST_ORACLE_HAVE_MPFR
      mpfr_free_cache();
#endif
    };
    GenericRun<T> base(np.p, in.q, in.k, in.v, &in.dout, {}, free_caches);
    base.RunForward();
    std::vector<T> dq, dk, dv, delta;
    base.RunBackward(dq, dk, dv, delta);
    // One random direction per input; perturb it alone.
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> dist;
    struct Arg {
      const char* name;
      std::vector<T> GenericRun<T>::*member;
      const std::vector<T>* grad;
    };
    for (const Arg& arg : {Arg{"q", &GenericRun<T>::q, &dq}, Arg{"k", &GenericRun<T>::k, &dk},
                           Arg{"v", &GenericRun<T>::v, &dv}}) {
      const size_t n = (base.*arg.member).size();
      std::vector<T> dir(n);
      for (auto& x : dir) x = T(dist(rng));
      T analytic = 0, grad_norm = 0;
      for (size_t e = 0; e < n; ++e) {
        analytic += (*arg.grad)[e] * dir[e];
        grad_norm += abs((*arg.grad)[e] * dir[e]);
      }
      T loss[2];
      for (int side = 0; side < 2; ++side) {
        GenericRun<T> run(np.p, in.q, in.k, in.v, &in.dout, {}, free_caches);
        auto& x = run.*arg.member;
        for (size_t e = 0; e < n; ++e) x[e] += (side == 0 ? h : -h) * dir[e];
        run.RunForward();
        loss[side] = Loss(run);
      }
      const T numeric = (loss[0] - loss[1]) / (2 * h);
      const double err = static_cast<double>(abs(numeric - analytic));
      // Rounding of the two losses (~2^-257 |L|) divided by h: a floor of 1e-50 |L|_abs that
      // matters only where the gradient vanishes (Sk = 1: dq = dk = 0).
      T loss_abs = 0;
      for (size_t e = 0; e < base.o.size(); ++e) loss_abs += abs(base.dout[e] * base.o[e]);
      const double mag = static_cast<double>(grad_norm) + 1e-20 * static_cast<double>(loss_abs);
      std::printf("  %-28s d%s: |fd - analytic| / sum|g dir| = %.2e\n", np.name.c_str(), arg.name,
                  err / mag);
      EXPECT_LE(err, 1e-30 * mag) << np.name << " d" << arg.name;
    }
  }
}

}  // namespace
}  // namespace attest
