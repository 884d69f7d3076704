// The learnable relative bias in the oracle (oracle.h OracleOptions::rel_bias,
// docs/semantics.md "Learnable relative bias"): the float64 path and the MP path against an
// independent dense float64 reference written here (two passes per row, its own mask rules,
// layouts and diagonal indexing), agreeing to 1e-10 relative on o, lse, dq, dk, dv and
// drel_bias with GQA, softcap, ALiBi, causal empty rows, windows, packed batches and a
// learnable sink; a zero bias is bitwise no bias; double against mp256 within ErrorBound
// (drel_bias included); mp256's drel_bias against central finite differences of its forward;
// thread-count independence, sampled runs and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_generic.h"
#include "reference/oracle/oracle_mp.h"
#include "reference/oracle/oracle_test_util.h"

namespace attest {
namespace {

using oracle_test::Base;
using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;
using oracle_test::NamedProblem;
using oracle_test::RandomInputs;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct BiasCase {
  NamedProblem np;
  std::vector<double> sink;  // [Hq] when np.p.sink
};

// Problems with a relative bias: every feature the dense reference below implements.
std::vector<BiasCase> BiasCases() {
  std::vector<BiasCase> out;
  {
    Problem p = Base(2, 2, 2, 13, 17, 8, 8);
    out.push_back({{"plain", p}, {}});
  }
  {
    Problem p = Base(2, 4, 1, 19, 11, 8, 8);  // Sq > Sk bottom-right: 8 empty rows, GQA 4
    p.causal = true;
    out.push_back({{"gqa4_causal_empty_rows", p}, {}});
  }
  {
    Problem p = Base(1, 4, 2, 14, 17, 8, 8);
    p.softcap = 4.0;
    p.causal = true;
    p.alibi_slopes = std::vector<double>{0.25, 0.125, 0.0625, 0.03125};
    out.push_back({{"softcap_alibi_causal_gqa2", p, 2.0}, {}});
  }
  {
    Problem p = Base(4, 2, 1, 9, 12, 8, 8);
    p.cu_seqlens_q = std::vector<int32_t>{0, 5, 5, 14, 17};  // sequence 1: zero-length
    p.cu_seqlens_k = std::vector<int32_t>{0, 7, 7, 19, 19};  // sequence 3: no keys at all
    out.push_back({{"varlen_packed", p}, {}});
  }
  {
    Problem p = Base(3, 2, 2, 8, 10, 8, 6);
    p.cu_seqlens_q = std::vector<int32_t>{0, 8, 11, 11};
    p.cu_seqlens_k = std::vector<int32_t>{0, 4, 14, 18};
    p.causal = true;
    p.window_left = 3;
    out.push_back({{"varlen_causal_window", p}, {}});
  }
  {
    Problem p = Base(2, 4, 2, 19, 11, 8, 8);  // with a learnable sink, empty rows
    p.causal = true;
    p.softcap = 3.0;
    p.sink = true;
    out.push_back({{"sink_gqa2_causal_softcap", p}, {1.5, kNegInf, -0.5, 3.0}});
  }
  {
    Problem p = Base(3, 2, 1, 9, 12, 8, 8);
    p.cu_seqlens_q = std::vector<int32_t>{0, 5, 5, 14};
    p.cu_seqlens_k = std::vector<int32_t>{0, 7, 9, 19};
    p.causal = true;
    p.sink = true;
    out.push_back({{"sink_varlen_causal", p}, {0.25, 2.0}});
  }
  for (BiasCase& c : out) c.np.p.rel_bias = true;
  return out;
}

// A bias table of the problem's shape: normal(0, sigma), seeded.
Tensor RandomBias(const Problem& p, uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(static_cast<size_t>(p.heads_q * p.RelBiasWidth()));
  for (double& e : x) e = dist(rng);
  return Tensor::FromF64(p.RelBiasShape(), x);
}

Tensor Vec(const std::vector<double>& s) {
  return Tensor::FromF64({static_cast<int64_t>(s.size())}, s);
}

// ---- The dense reference: its own layouts, mask rules and two-pass softmax. ------------

struct DenseOut {
  std::vector<double> o, lse, dq, dk, dv, drel;  // layouts of oracle.h
};

DenseOut Dense(const Problem& p, const oracle_test::Inputs& in, const std::vector<double>& bias,
               std::vector<double> sink) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const int64_t tq = p.varlen() ? p.cu_seqlens_q->back() : p.batch * p.seqlen_q;
  const int64_t tk = p.varlen() ? p.cu_seqlens_k->back() : p.batch * p.seqlen_k;
  const int64_t width = p.seqlen_q + p.seqlen_k - 1;
  const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(d));
  if (sink.empty()) sink.assign(static_cast<size_t>(hq), kNegInf);
  const double* q = in.q.data<double>();
  const double* k = in.k.data<double>();
  const double* v = in.v.data<double>();
  const double* dout = in.dout.data<double>();
  DenseOut r;
  r.o.assign(static_cast<size_t>(tq * hq * dv), 0.0);
  r.lse.assign(static_cast<size_t>(tq * hq), 0.0);
  r.dq.assign(static_cast<size_t>(tq * hq * d), 0.0);
  r.dk.assign(static_cast<size_t>(tk * hkv * d), 0.0);
  r.dv.assign(static_cast<size_t>(tk * hkv * dv), 0.0);
  r.drel.assign(static_cast<size_t>(hq * width), 0.0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.varlen() ? (*p.cu_seqlens_q)[b] : b * p.seqlen_q;
    const int64_t k0 = p.varlen() ? (*p.cu_seqlens_k)[b] : b * p.seqlen_k;
    const int64_t nq = p.varlen() ? (*p.cu_seqlens_q)[b + 1] - q0 : p.seqlen_q;
    const int64_t nk = p.varlen() ? (*p.cu_seqlens_k)[b + 1] - k0 : p.seqlen_k;
    const int64_t off = p.causal_align == CausalAlign::kBottomRight ? nk - nq : 0;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[h] : 0.0;
      for (int64_t i = 0; i < nq; ++i) {
        const double* qi = q + ((q0 + i) * hq + h) * d;
        const double* doi = dout + ((q0 + i) * hq + h) * dv;
        std::vector<double> s(nk), t(nk, 0.0), pr(nk, 0.0), dp(nk, 0.0);
        std::vector<bool> vis(nk);
        double mx = sink[h];
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t diag = i + off;
          vis[j] = (!p.causal || j <= diag) && (p.window_left < 0 || j >= diag - p.window_left) &&
                   (p.window_right < 0 || j <= diag + p.window_right);
          if (!vis[j]) continue;
          const double* kj = k + ((k0 + j) * hkv + g) * d;
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e];
          double x = scale * dot;
          if (p.softcap > 0) {
            t[j] = std::tanh(x / p.softcap);
            x = p.softcap * t[j];
          }
          s[j] = x - slope * std::abs(static_cast<double>(diag - j)) +
                 bias[static_cast<size_t>(h * width + (i - j) + p.seqlen_k - 1)];
          mx = std::max(mx, s[j]);
        }
        const size_t lrow = p.varlen() ? static_cast<size_t>(h * tq + q0 + i)
                                       : static_cast<size_t>((b * hq + h) * p.seqlen_q + i);
        if (mx == kNegInf) {  // no key and no sink
          r.lse[lrow] = kNegInf;
          continue;
        }
        double z = std::exp(sink[h] - mx);
        for (int64_t j = 0; j < nk; ++j) z += vis[j] ? std::exp(s[j] - mx) : 0.0;
        const double lse = mx + std::log(z);
        r.lse[lrow] = lse;
        double* oi = &r.o[static_cast<size_t>(((q0 + i) * hq + h) * dv)];
        double delta = 0;  // sum_j P_ij dP_ij, from P (the oracle takes dO . o)
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[j]) continue;
          pr[j] = std::exp(s[j] - lse);
          const double* vj = v + ((k0 + j) * hkv + g) * dv;
          for (int64_t e = 0; e < dv; ++e) {
            oi[e] += pr[j] * vj[e];
            dp[j] += doi[e] * vj[e];
          }
          delta += pr[j] * dp[j];
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[j]) continue;
          const double ds_bias = pr[j] * (dp[j] - delta);  // d/d(bias): after the softcap
          double ds = ds_bias;
          if (p.softcap > 0) ds *= 1 - t[j] * t[j];
          r.drel[static_cast<size_t>(h * width + (i - j) + p.seqlen_k - 1)] += ds_bias;
          const double* kj = k + ((k0 + j) * hkv + g) * d;
          double* dkj = &r.dk[static_cast<size_t>(((k0 + j) * hkv + g) * d)];
          double* dvj = &r.dv[static_cast<size_t>(((k0 + j) * hkv + g) * dv)];
          double* dqi = &r.dq[static_cast<size_t>(((q0 + i) * hq + h) * d)];
          for (int64_t e = 0; e < d; ++e) {
            dqi[e] += scale * ds * kj[e];
            dkj[e] += scale * ds * qi[e];
          }
          for (int64_t e = 0; e < dv; ++e) dvj[e] += pr[j] * doi[e];
        }
      }
    }
  }
  return r;
}

// max |x - ref| / max |ref| (0 when both vanish); equal infinities count as equal.
double RelErr(const Tensor& x, const std::vector<double>& ref) {
  const Tensor r = Tensor::FromF64(x.shape(), ref);
  const double m = MaxAbs(r);
  const double e = MaxAbsDiff(x, r);
  return e == 0 ? 0 : e / m;
}

void ExpectMatchesDense(const std::string& name, const BackwardOut& b, const DenseOut& ref) {
  const std::pair<const char*, std::pair<const Tensor*, const std::vector<double>*>> pairs[] = {
      {"o", {&b.o, &ref.o}},    {"lse", {&b.lse, &ref.lse}}, {"dq", {&b.dq, &ref.dq}},
      {"dk", {&b.dk, &ref.dk}}, {"dv", {&b.dv, &ref.dv}},
      {"drel_bias", {&b.drel_bias, &ref.drel}}};
  for (const auto& [t, xy] : pairs) {
    const double err = RelErr(*xy.first, *xy.second);
    std::printf("  %-34s %-9s max|err| / max|ref| = %.2e\n", name.c_str(), t, err);
    EXPECT_LE(err, 1e-10) << name << " " << t;
  }
}

TEST(OracleRelBiasTest, DoubleAndMp256AgreeWithAnIndependentDenseReference) {
  uint64_t seed = 600;
  for (const BiasCase& c : BiasCases()) {
    SCOPED_TRACE(c.np.name);
    const auto in = RandomInputs(c.np.p, ++seed, c.np.q_sigma);
    const Tensor bias = RandomBias(c.np.p, seed);
    const Tensor sink = Vec(c.sink);
    const auto b = bias.span<const double>();
    const DenseOut ref = Dense(c.np.p, in, {b.begin(), b.end()}, c.sink);
    OracleOptions opt;
    opt.rel_bias = &bias;
    if (c.np.p.sink) opt.sink = &sink;
    opt.threads = 2;
    for (int64_t tile : {0, 3}) {
      opt.tile_q = opt.tile_k = tile;
      const BackwardOut d = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, opt);
      ExpectMatchesDense(c.np.name + "/double/tiles" + std::to_string(tile), d, ref);
      const ForwardOut f = Forward<double>(c.np.p, in.q, in.k, in.v, opt);
      EXPECT_TRUE(f.o.BitwiseEqual(d.o));
      EXPECT_TRUE(f.lse.BitwiseEqual(d.lse));
    }
    ExpectMatchesDense(c.np.name + "/mp256",
                       Backward<Mp256>(c.np.p, in.q, in.k, in.v, in.dout, opt), ref);
    // Not vacuous: the bias moves the outputs, and its gradient is not zero.
    Problem none = c.np.p;
    none.rel_bias = false;
    OracleOptions plain = opt;
    plain.rel_bias = nullptr;
    const BackwardOut nb = Backward<double>(none, in.q, in.k, in.v, in.dout, plain);
    EXPECT_GT(RelErr(nb.o, ref.o), 1e-3);
    EXPECT_GT(MaxAbs(Tensor::FromF64(c.np.p.RelBiasShape(), ref.drel)), 1e-3);
  }
}

TEST(OracleRelBiasTest, ZeroBiasIsBitwiseNoBias) {
  uint64_t seed = 700;
  for (const BiasCase& c : BiasCases()) {
    SCOPED_TRACE(c.np.name);
    Problem none = c.np.p;
    none.rel_bias = false;
    const auto in = RandomInputs(none, ++seed, c.np.q_sigma);
    const Tensor zero = Tensor::Zeros(DType::kF64, c.np.p.RelBiasShape());
    const Tensor sink = Vec(c.sink);
    for (int64_t tile : {0, 4}) {
      OracleOptions plain;
      plain.tile_q = plain.tile_k = tile;
      if (c.np.p.sink) plain.sink = &sink;
      OracleOptions with = plain;
      with.rel_bias = &zero;
      const BackwardOut a = Backward<double>(none, in.q, in.k, in.v, in.dout, plain);
      const BackwardOut b = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, with);
      for (const auto& [x, y] : {std::pair{&a.o, &b.o}, {&a.lse, &b.lse}, {&a.dq, &b.dq},
                                 {&a.dk, &b.dk}, {&a.dv, &b.dv}, {&a.delta, &b.delta}}) {
        EXPECT_TRUE(x->BitwiseEqual(*y));
      }
      EXPECT_TRUE(b.drel_bias.defined());
      EXPECT_FALSE(a.drel_bias.defined());
    }
  }
}

// |x - y| <= ErrorBound(sx) + ErrorBound(sy) for every tensor, and the bound is not vacuous
// (below 1e-10 (1 + a) of the tensor's max-abs; for drel_bias, whose diagonal sums may cancel,
// of the sum of its terms' magnitudes, R G V).
void ExpectCertified(const std::string& name, const BackwardOut& x, const BackwardOut& y) {
  const std::pair<OracleTensor, std::pair<const Tensor*, const Tensor*>> pairs[] = {
      {OracleTensor::kO, {&x.o, &y.o}},       {OracleTensor::kLse, {&x.lse, &y.lse}},
      {OracleTensor::kDq, {&x.dq, &y.dq}},    {OracleTensor::kDk, {&x.dk, &y.dk}},
      {OracleTensor::kDv, {&x.dv, &y.dv}},    {OracleTensor::kDelta, {&x.delta, &y.delta}},
      {OracleTensor::kDsink, {&x.dsink, &y.dsink}},
      {OracleTensor::kDrelBias, {&x.drel_bias, &y.drel_bias}}};
  for (const auto& [t, xy] : pairs) {
    if (!xy.first->defined()) continue;
    const double err = MaxAbsDiff(*xy.first, *xy.second);
    const double bound = ErrorBound(x.stats, t) + ErrorBound(y.stats, t);
    const double mag = MaxAbs(*xy.second);
    std::printf("  %-34s %-9s max|err| %.3e  bound %.3e  margin %.2e\n", name.c_str(),
                std::string(Name(t)).c_str(), err, bound, bound > 0 ? err / bound : 0.0);
    EXPECT_LE(err, bound) << name << " " << Name(t);
    const double cond =
        1 + std::max(x.stats.score_abs_max + x.stats.rel_bias_abs_max, x.stats.sink_abs_max);
    const double gv = x.stats.do_norm_max * x.stats.v_norm_max;
    if (t == OracleTensor::kDrelBias) {
      EXPECT_LT(bound, 1e-10 * cond * x.stats.rel_bias_mass_max * gv) << name;
    } else if (t == OracleTensor::kDsink) {
      EXPECT_LT(bound, 1e-10 * cond * x.stats.sink_mass_max * gv) << name;
    } else if (mag > 0) {
      EXPECT_LT(bound / mag, 1e-10 * cond) << name << " " << Name(t) << ": vacuous bound";
    }
  }
}

TEST(OracleRelBiasTest, DoubleMatchesMp256WithinTheBound) {
  uint64_t seed = 800;
  for (const BiasCase& c : BiasCases()) {
    SCOPED_TRACE(c.np.name);
    const auto in = RandomInputs(c.np.p, ++seed, c.np.q_sigma);
    const Tensor bias = RandomBias(c.np.p, seed, 2.0);
    const Tensor sink = Vec(c.sink);
    OracleOptions opt;
    opt.rel_bias = &bias;
    if (c.np.p.sink) opt.sink = &sink;
    const BackwardOut mp = Backward<Mp256>(c.np.p, in.q, in.k, in.v, in.dout, opt);
    for (int64_t tile : {0, 3}) {
      opt.tile_q = opt.tile_k = tile;
      opt.threads = 2;
      const BackwardOut d = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, opt);
      ExpectCertified(c.np.name + "/tiles" + std::to_string(tile), d, mp);
    }
  }
}

TEST(OracleRelBiasTest, Mp256DrelBiasMatchesFiniteDifferencesOfItsForward) {
  using T = Mp256;
  using oracle_internal::GenericRun;
  const T step = T(1e-20);
  const auto free_caches = [] {
#if ATTEST_ORACLE_HAVE_MPFR
    mpfr_free_cache();
#endif
  };
  uint64_t seed = 900;
  for (const BiasCase& c : BiasCases()) {
    SCOPED_TRACE(c.np.name);
    const auto in = RandomInputs(c.np.p, ++seed, c.np.q_sigma);
    const Tensor bias = RandomBias(c.np.p, seed);
    const Tensor sink = Vec(c.sink);
    OracleOptions opt;
    opt.rel_bias = &bias;
    if (c.np.p.sink) opt.sink = &sink;
    GenericRun<T> base(c.np.p, in.q, in.k, in.v, &in.dout, opt, free_caches);
    base.RunForward();
    std::vector<T> dq, dk, dv, delta, drel;
    base.RunBackward(dq, dk, dv, delta, &drel);
    // Every seventh element of the table (diagonals of every head).
    const int64_t width = c.np.p.RelBiasWidth();
    for (int64_t e = 0; e < c.np.p.heads_q * width; e += 7) {
      T loss[2];
      for (int side = 0; side < 2; ++side) {
        GenericRun<T> run(c.np.p, in.q, in.k, in.v, &in.dout, opt, free_caches);
        run.rel_bias[static_cast<size_t>(e)] += side == 0 ? step : -step;
        run.RunForward();
        loss[side] = 0;
        for (size_t x = 0; x < run.o.size(); ++x) loss[side] += run.dout[x] * run.o[x];
      }
      const T numeric = (loss[0] - loss[1]) / (2 * step);
      const double err = static_cast<double>(abs(numeric - drel[static_cast<size_t>(e)]));
      const double mag = static_cast<double>(abs(numeric));
      EXPECT_LE(err, 1e-30 * (mag + 1e-10)) << c.np.name << " element " << e;
    }
  }
}

TEST(OracleRelBiasTest, BitwiseTheSameOnEveryThreadCountAndSampledLeavesNaN) {
  const BiasCase c = BiasCases()[3];  // packed: items of several sequences per head
  const auto in = RandomInputs(c.np.p, 9, c.np.q_sigma);
  const Tensor bias = RandomBias(c.np.p, 9);
  OracleOptions one;
  one.rel_bias = &bias;
  one.threads = 1;
  one.tile_q = one.tile_k = 4;
  OracleOptions four = one;
  four.threads = 4;
  const BackwardOut a = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, one);
  const BackwardOut b = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, four);
  EXPECT_TRUE(a.drel_bias.BitwiseEqual(b.drel_bias) && a.o.BitwiseEqual(b.o) &&
              a.dq.BitwiseEqual(b.dq) && a.dk.BitwiseEqual(b.dk));
  // A sampled backward keeps the flagged rows' lse, and leaves drel_bias NaN.
  std::vector<uint8_t> rows(static_cast<size_t>(c.np.p.TotalQ()), 0);
  rows[3] = rows[12] = 1;
  OracleOptions sampled = one;
  sampled.query_rows = &rows;
  const BackwardOut s = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, sampled);
  const int64_t tq = c.np.p.TotalQ();
  for (int64_t h = 0; h < c.np.p.heads_q; ++h) {
    for (int64_t i : {3, 12}) {  // lse [Hq, total_q]
      EXPECT_EQ(a.lse.data<double>()[h * tq + i], s.lse.data<double>()[h * tq + i]);
    }
  }
  EXPECT_TRUE(std::isnan(s.drel_bias.data<double>()[0]));
  // The sampled forward gathers the flagged rows into tiles of their own (each row keeps its
  // sequence-local index for the bias): their o and lse are the whole run's, bitwise.
  const ForwardOut g = Forward<double>(c.np.p, in.q, in.k, in.v, sampled);
  const int64_t dv = c.np.p.head_dim_v, hq = c.np.p.heads_q;
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t i : {3, 12}) {
      EXPECT_EQ(a.lse.data<double>()[h * tq + i], g.lse.data<double>()[h * tq + i]);
      for (int64_t e = 0; e < dv; ++e) {
        const int64_t x = (i * hq + h) * dv + e;
        EXPECT_EQ(a.o.data<double>()[x], g.o.data<double>()[x]);
      }
    }
  }
}

TEST(OracleRelBiasTest, BadBiasesAreRefusedNamingTheBias) {
  Problem p = Base(1, 2, 1, 4, 5, 8, 8);
  const auto in = RandomInputs(p, 3);
  Problem with = p;
  with.rel_bias = true;
  const Tensor ok = RandomBias(with, 1);
  std::vector<double> bad(static_cast<size_t>(2 * 8), 0.5);
  bad[5] = std::nan("");
  const Tensor nan = Tensor::FromF64({2, 8}, bad);
  bad[5] = std::numeric_limits<double>::infinity();
  const Tensor inf = Tensor::FromF64({2, 8}, bad);
  const Tensor narrow = Tensor::FromF64({2, 7}, std::vector<double>(14, 0.0));
  const auto refuses = [&](const Problem& prob, const Tensor* b, const std::string& what) {
    OracleOptions opt;
    opt.rel_bias = b;
    try {
      (void)Backward<double>(prob, in.q, in.k, in.v, in.dout, opt);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("rel_bias"), std::string::npos) << e.what();
    }
  };
  refuses(p, &ok, "a bias tensor without problem.rel_bias");
  refuses(with, nullptr, "problem.rel_bias without a tensor");
  refuses(with, &nan, "NaN");
  refuses(with, &inf, "+inf");
  refuses(with, &narrow, "shape [2, 7]");
  OracleOptions opt;
  opt.rel_bias = &ok;
  EXPECT_NO_THROW((void)Forward<double>(with, in.q, in.k, in.v, opt));
}

}  // namespace
}  // namespace attest
