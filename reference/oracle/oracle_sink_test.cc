// The learnable sink in the oracle (oracle.h OracleOptions::sink, docs/semantics.md "Learnable
// sink"): the float64 path and the MP path against an independent dense float64 reference
// written here (two passes per row, the sink as an extra logit, its own mask rules and
// layouts), agreeing to 1e-10 relative on o, lse, dq, dk, dv and dsink with GQA, softcap,
// ALiBi, causal empty rows, windows and packed batches; the exact rules (a sink of -inf is
// bitwise no sink, empty rows give lse = sink, huge sinks give o = 0); MP256's dsink against
// central finite differences of its forward; input errors. Certification of the sink against
// MPFR within ErrorBound is in oracle_cert_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
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

struct SinkCase {
  NamedProblem np;
  std::vector<double> sink;  // [Hq]
};

Tensor SinkTensor(const std::vector<double>& s) {
  return Tensor::FromF64({static_cast<int64_t>(s.size())}, s);
}

// Problems with a sink: every feature the dense reference below implements, with ordinary,
// large, huge and -inf sinks among the heads.
std::vector<SinkCase> SinkCases() {
  std::vector<SinkCase> out;
  {
    Problem p = Base(2, 2, 2, 13, 17, 8, 8);
    out.push_back({{"plain", p}, {0.75, -1.5}});
  }
  {
    Problem p = Base(2, 4, 1, 19, 11, 8, 8);  // Sq > Sk bottom-right: 8 empty rows, GQA 4
    p.causal = true;
    out.push_back({{"gqa4_causal_empty_rows", p}, {2.0, kNegInf, -3.0, 1e30}});
  }
  {
    Problem p = Base(1, 4, 2, 14, 17, 8, 8);
    p.softcap = 4.0;
    p.causal = true;
    p.alibi_slopes = std::vector<double>{0.25, 0.125, 0.0625, 0.03125};
    out.push_back({{"softcap_alibi_causal_gqa2", p, 2.0}, {1.25, 9.5, -0.5, 40.0}});
  }
  {
    Problem p = Base(4, 2, 1, 9, 12, 8, 8);
    p.cu_seqlens_q = std::vector<int32_t>{0, 5, 5, 14, 17};  // sequence 1: zero-length
    p.cu_seqlens_k = std::vector<int32_t>{0, 7, 7, 19, 19};  // sequence 3: no keys at all
    out.push_back({{"varlen_packed", p}, {0.5, -2.0}});
  }
  {
    Problem p = Base(3, 2, 2, 8, 10, 8, 6);
    p.cu_seqlens_q = std::vector<int32_t>{0, 8, 11, 11};
    p.cu_seqlens_k = std::vector<int32_t>{0, 4, 14, 18};
    p.causal = true;
    p.window_left = 3;
    out.push_back({{"varlen_causal_window", p}, {3.0, 0.0}});
  }
  {
    Problem p = Base(1, 2, 2, 19, 11, 8, 8);
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    p.window_left = 0;
    p.window_right = 0;
    out.push_back({{"top_left_window_0_0", p}, {-0.25, 12.0}});
  }
  for (SinkCase& c : out) c.np.p.sink = true;
  return out;
}

// ---- The dense reference: its own layouts, mask rules and two-pass softmax. ------------

struct DenseOut {
  std::vector<double> o, lse, dq, dk, dv, dsink;  // layouts of oracle.h (lse [B,Hq,Sq]/[Hq,T])
};

DenseOut Dense(const Problem& p, const oracle_test::Inputs& in, const std::vector<double>& sink) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const int64_t tq = p.varlen() ? p.cu_seqlens_q->back() : p.batch * p.seqlen_q;
  const int64_t tk = p.varlen() ? p.cu_seqlens_k->back() : p.batch * p.seqlen_k;
  const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(d));
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
  r.dsink.assign(static_cast<size_t>(hq), 0.0);
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
          s[j] = x - slope * std::abs(static_cast<double>(diag - j));
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
        r.dsink[h] -= std::exp(sink[h] - lse) * delta;
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[j]) continue;
          double ds = pr[j] * (dp[j] - delta);
          if (p.softcap > 0) ds *= 1 - t[j] * t[j];
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
      {"dk", {&b.dk, &ref.dk}}, {"dv", {&b.dv, &ref.dv}},    {"dsink", {&b.dsink, &ref.dsink}}};
  for (const auto& [t, xy] : pairs) {
    const double err = RelErr(*xy.first, *xy.second);
    std::printf("  %-34s %-5s max|err| / max|ref| = %.2e\n", name.c_str(), t, err);
    EXPECT_LE(err, 1e-10) << name << " " << t;
  }
}

TEST(OracleSinkTest, DoubleAndMp256AgreeWithAnIndependentDenseReference) {
  uint64_t seed = 300;
  for (const SinkCase& c : SinkCases()) {
    SCOPED_TRACE(c.np.name);
    const auto in = RandomInputs(c.np.p, ++seed, c.np.q_sigma);
    const Tensor sink = SinkTensor(c.sink);
    const DenseOut ref = Dense(c.np.p, in, c.sink);
    OracleOptions opt;
    opt.sink = &sink;
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
    // Not vacuous: the finite sinks move the gradient.
    EXPECT_GT(MaxAbs(SinkTensor(ref.dsink)), 1e-6);
  }
}

TEST(OracleSinkTest, SinkOfMinusInfinityIsBitwiseNoSink) {
  uint64_t seed = 400;
  for (const SinkCase& c : SinkCases()) {
    SCOPED_TRACE(c.np.name);
    Problem none = c.np.p;
    none.sink = false;
    const auto in = RandomInputs(none, ++seed, c.np.q_sigma);
    const Tensor sink = SinkTensor(std::vector<double>(static_cast<size_t>(none.heads_q), kNegInf));
    for (int64_t tile : {0, 4}) {
      OracleOptions plain;
      plain.tile_q = plain.tile_k = tile;
      OracleOptions with = plain;
      with.sink = &sink;
      const BackwardOut a = Backward<double>(none, in.q, in.k, in.v, in.dout, plain);
      const BackwardOut b = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, with);
      for (const auto& [x, y] : {std::pair{&a.o, &b.o}, {&a.lse, &b.lse}, {&a.dq, &b.dq},
                                 {&a.dk, &b.dk}, {&a.dv, &b.dv}, {&a.delta, &b.delta}}) {
        EXPECT_TRUE(x->BitwiseEqual(*y));
      }
      EXPECT_EQ(MaxAbs(b.dsink), 0.0);
    }
    OracleOptions with;
    with.sink = &sink;
    const BackwardOut a = Backward<Mp128>(none, in.q, in.k, in.v, in.dout, {});
    const BackwardOut b = Backward<Mp128>(c.np.p, in.q, in.k, in.v, in.dout, with);
    EXPECT_TRUE(a.o.BitwiseEqual(b.o) && a.lse.BitwiseEqual(b.lse) && a.dq.BitwiseEqual(b.dq) &&
                a.dk.BitwiseEqual(b.dk) && a.dv.BitwiseEqual(b.dv));
    EXPECT_EQ(MaxAbs(b.dsink), 0.0);
  }
}

TEST(OracleSinkTest, EmptyRowsGiveTheSinkAndHugeSinksGiveZero) {
  // Sq > Sk bottom-right causal: rows 0..7 see no key. Head 0: an ordinary sink; head 1: a
  // huge one (float32's largest finite value), which takes the whole softmax mass.
  Problem p = Base(1, 2, 1, 19, 11, 8, 8);
  p.causal = true;
  p.sink = true;
  const auto in = RandomInputs(p, 77);
  const double huge = 3.4028234663852886e38;
  const Tensor sink = SinkTensor({1.5, huge});
  for (const Precision prec : {Precision::kDouble, Precision::kMp128}) {
    OracleOptions opt;
    opt.sink = &sink;
    opt.tile_q = opt.tile_k = 4;
    const BackwardOut b = Backward(prec, p, in.q, in.k, in.v, in.dout, opt);
    const double* lse = b.lse.data<double>();  // [1, 2, 19]
    const double* o = b.o.data<double>();      // [1, 19, 2, 8]
    const double* dq = b.dq.data<double>();
    for (int64_t i = 0; i < 19; ++i) {
      for (int64_t h = 0; h < 2; ++h) {
        const bool empty = i < 8;
        if (empty || h == 1) {
          EXPECT_EQ(lse[h * 19 + i], h == 0 ? 1.5 : huge) << i;
          for (int64_t e = 0; e < 8; ++e) {
            EXPECT_EQ(o[(i * 2 + h) * 8 + e], 0.0);
            EXPECT_EQ(dq[(i * 2 + h) * 8 + e], 0.0);
          }
        } else {
          EXPECT_GT(lse[h * 19 + i], 1.5);
        }
      }
    }
    // Head 1's huge sink leaves nothing to the keys: dk and dv come from head 0 alone, and
    // dsink_1 = -sum exp(0) * (dO . 0) = 0.
    EXPECT_EQ(b.dsink.data<double>()[1], 0.0);
    EXPECT_NE(b.dsink.data<double>()[0], 0.0);
    EXPECT_EQ(b.stats.empty_rows, 16);
  }
}

TEST(OracleSinkTest, Mp256DsinkMatchesFiniteDifferencesOfItsForward) {
  using T = Mp256;
  using oracle_internal::GenericRun;
  const T step = T(1e-20);
  const auto free_caches = [] {
#if ATTEST_ORACLE_HAVE_MPFR
    mpfr_free_cache();
#endif
  };
  uint64_t seed = 500;
  for (const SinkCase& c : SinkCases()) {
    SCOPED_TRACE(c.np.name);
    const auto in = RandomInputs(c.np.p, ++seed, c.np.q_sigma);
    const Tensor sink = SinkTensor(c.sink);
    OracleOptions opt;
    opt.sink = &sink;
    GenericRun<T> base(c.np.p, in.q, in.k, in.v, &in.dout, opt, free_caches);
    base.RunForward();
    std::vector<T> dq, dk, dv, delta;
    base.RunBackward(dq, dk, dv, delta);
    const std::vector<T> dsink = base.Dsink(delta);
    for (int64_t h = 0; h < c.np.p.heads_q; ++h) {
      if (!std::isfinite(c.sink[static_cast<size_t>(h)])) continue;
      T loss[2];
      for (int side = 0; side < 2; ++side) {
        GenericRun<T> run(c.np.p, in.q, in.k, in.v, &in.dout, opt, free_caches);
        run.sink[static_cast<size_t>(h)] += side == 0 ? step : -step;
        run.RunForward();
        loss[side] = 0;
        for (size_t e = 0; e < run.o.size(); ++e) loss[side] += run.dout[e] * run.o[e];
      }
      const T numeric = (loss[0] - loss[1]) / (2 * step);
      const double err = static_cast<double>(abs(numeric - dsink[static_cast<size_t>(h)]));
      const double mag = static_cast<double>(abs(numeric)) + 1e-40;
      EXPECT_LE(err, 1e-30 * (mag + 1e-10)) << c.np.name << " head " << h;
    }
  }
}

TEST(OracleSinkTest, BitwiseTheSameOnEveryThreadCountAndTiling) {
  const SinkCase c = SinkCases()[2];
  const auto in = RandomInputs(c.np.p, 9, c.np.q_sigma);
  const Tensor sink = SinkTensor(c.sink);
  OracleOptions one;
  one.sink = &sink;
  one.threads = 1;
  OracleOptions four = one;
  four.threads = 4;
  const BackwardOut a = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, one);
  const BackwardOut b = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, four);
  EXPECT_TRUE(a.dsink.BitwiseEqual(b.dsink) && a.o.BitwiseEqual(b.o) &&
              a.dq.BitwiseEqual(b.dq) && a.dk.BitwiseEqual(b.dk));
}

TEST(OracleSinkTest, SampledRowsKeepTheWholeRunsBitsAndLeaveDsinkNaN) {
  // OracleOptions::query_rows: the flagged rows' o and lse are the whole run's, bitwise, with
  // the sink folded in; dsink needs every row, so a sampled backward leaves it NaN (a sink of
  // -inf: 0, no row needed).
  const SinkCase c = SinkCases()[1];
  const auto in = RandomInputs(c.np.p, 21, c.np.q_sigma);
  const Tensor sink = SinkTensor(c.sink);
  OracleOptions whole;
  whole.sink = &sink;
  whole.tile_q = whole.tile_k = 4;
  std::vector<uint8_t> rows(static_cast<size_t>(c.np.p.TotalQ()), 0);
  rows[3] = rows[17] = 1;
  OracleOptions sampled = whole;
  sampled.query_rows = &rows;
  const BackwardOut a = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, whole);
  const BackwardOut b = Backward<double>(c.np.p, in.q, in.k, in.v, in.dout, sampled);
  const int64_t sq = c.np.p.seqlen_q, hq = c.np.p.heads_q;
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t i : {3, 17}) {  // batch 0 rows of lse [B, Hq, Sq]
      EXPECT_EQ(a.lse.data<double>()[h * sq + i], b.lse.data<double>()[h * sq + i]);
    }
    const double ds = b.dsink.data<double>()[h];
    if (c.sink[static_cast<size_t>(h)] == kNegInf) {
      EXPECT_EQ(ds, 0.0);
    } else {
      EXPECT_TRUE(std::isnan(ds)) << h;
    }
  }
}

TEST(OracleSinkTest, BadSinksAreRefusedNamingTheSink) {
  Problem p = Base(1, 2, 1, 4, 5, 8, 8);
  const auto in = RandomInputs(p, 3);
  const Tensor ok = SinkTensor({0.5, 1.0});
  const Tensor nan = SinkTensor({0.5, std::nan("")});
  const Tensor pos_inf = SinkTensor({std::numeric_limits<double>::infinity(), 1.0});
  const Tensor short_one = SinkTensor({0.5});
  const auto refuses = [&](const Problem& prob, const Tensor* s, const std::string& what) {
    OracleOptions opt;
    opt.sink = s;
    try {
      (void)Backward<double>(prob, in.q, in.k, in.v, in.dout, opt);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("sink"), std::string::npos) << e.what();
    }
  };
  refuses(p, &ok, "a sink tensor without problem.sink");
  p.sink = true;
  refuses(p, nullptr, "problem.sink without a tensor");
  refuses(p, &nan, "NaN");
  refuses(p, &pos_inf, "+inf");
  refuses(p, &short_one, "shape [1]");
  OracleOptions opt;
  opt.sink = &ok;
  EXPECT_NO_THROW((void)Forward<double>(p, in.q, in.k, in.v, opt));
}

}  // namespace
}  // namespace attest
