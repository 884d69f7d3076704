// Paged KV and seqused in the oracle (oracle_paged.h, docs/semantics.md "Paged KV and
// seqused"): paged results are bitwise those of the same logical problem with contiguous k, v
// (float64 and MP128, forward and backward, with GQA, causal empty rows, windows, ALiBi,
// softcap, a sink and packed batches), and the float64 path agrees to 1e-10 with an
// independent dense reference written here that reads keys through the page table itself and
// applies seqused and the diagonal rules on the used lengths. Inputs come from the generator,
// which puts NaN, huge values and other sequences' rows wherever nothing may be read: the
// oracle refuses non-finite inputs, so passing at all shows it read none of them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "reference/data/generate.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_mp.h"
#include "reference/oracle/oracle_test_util.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

using oracle_test::Base;
using oracle_test::MaxAbs;
using oracle_test::MaxAbsDiff;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct PagedCase {
  std::string name;
  Problem p;
};

std::vector<PagedCase> Cases() {
  std::vector<PagedCase> out;
  {
    Problem p = Base(2, 2, 2, 13, 37, 8, 8);
    p.page_size = 8;
    out.push_back({"paged_plain", p});
  }
  {
    Problem p = Base(3, 4, 2, 9, 21, 8, 6);
    p.page_size = 4;
    p.causal = true;
    p.seqused_q = std::vector<int32_t>{9, 0, 5};
    p.seqused_k = std::vector<int32_t>{21, 3, 10};  // sequence 1: 3 keys < 5 queries
    out.push_back({"paged_seqused_causal_gqa", p});
  }
  {
    Problem p = Base(3, 2, 1, 8, 11, 8, 8);
    p.page_size = 3;
    p.num_pages = 20;  // no gaps: the default table packs the pool backwards
    p.cu_seqlens_q = std::vector<int32_t>{0, 6, 6, 14};
    p.cu_seqlens_k = std::vector<int32_t>{0, 11, 20, 20};
    p.causal = true;
    p.window_left = 2;
    p.window_right = 1;
    p.softcap = 3.0;
    p.alibi_slopes = std::vector<double>{0.25, 0.125};
    p.seqused_q = std::vector<int32_t>{5, 0, 8};
    p.seqused_k = std::vector<int32_t>{10, 9, 0};
    out.push_back({"paged_varlen_window_alibi_softcap", p});
  }
  {
    Problem p = Base(2, 2, 2, 10, 12, 8, 8);
    p.causal = true;
    p.causal_align = CausalAlign::kTopLeft;
    p.seqused_q = std::vector<int32_t>{7, 10};
    p.seqused_k = std::vector<int32_t>{12, 5};
    out.push_back({"seqused_top_left", p});
  }
  for (PagedCase& c : out) FillPagedDefaults(c.p);
  return out;
}

Problem Contiguous(Problem p) {
  p.page_size = 0;
  p.num_pages = 0;
  p.page_table.reset();
  return p;
}

GeneratedInputs Inputs(const Problem& p) {
  GeneratorSpec spec;
  spec.name = "gaussian";
  spec.seed = 7;
  auto in = GenerateInputs(p, spec);
  EXPECT_TRUE(in.ok()) << (in.ok() ? "" : in.error().message);
  return std::move(*in);
}

// The contiguous problem's dk / dv placed in the pool (KeyRow), zero elsewhere.
Tensor ToPool(const Problem& paged, const Problem& contiguous, const Tensor& t,
              const Shape& shape) {
  Tensor pool = Tensor::Zeros(DType::kF64, shape);
  const int64_t w = shape[2] * shape[3];
  for (int64_t b = 0; b < paged.batch; ++b) {
    const Sequence s = SequenceOf(contiguous, b);
    for (int64_t j = 0; j < s.k_len; ++j) {
      for (int64_t e = 0; e < w; ++e) {
        pool.data<double>()[KeyRow(paged, b, j) * w + e] =
            t.data<const double>()[(s.k_begin + j) * w + e];
      }
    }
  }
  return pool;
}

TEST(OraclePagedTest, PagedEqualsContiguousBitwise) {
  for (const PagedCase& c : Cases()) {
    if (!c.p.paged()) continue;
    for (bool sink : {false, true}) {
      Problem p = c.p;
      p.sink = sink;
      const Problem cp = Contiguous(p);
      const GeneratedInputs a = Inputs(p), b = Inputs(cp);
      const Tensor sinks = Tensor::FromF64({p.heads_q}, std::vector<double>(p.heads_q, 0.5));
      OracleOptions options;
      if (sink) options.sink = &sinks;
      const BackwardOut x = Backward<double>(p, a.q, a.k, a.v, a.dout, options);
      const BackwardOut y = Backward<double>(cp, b.q, b.k, b.v, b.dout, options);
      const std::string name = c.name + (sink ? "/sink" : "");
      EXPECT_TRUE(x.o.BitwiseEqual(y.o)) << name;
      EXPECT_TRUE(x.lse.BitwiseEqual(y.lse)) << name;
      EXPECT_TRUE(x.dq.BitwiseEqual(y.dq)) << name;
      EXPECT_TRUE(x.delta.BitwiseEqual(y.delta)) << name;
      EXPECT_TRUE(x.dk.BitwiseEqual(ToPool(p, cp, y.dk, p.KShape()))) << name;
      EXPECT_TRUE(x.dv.BitwiseEqual(ToPool(p, cp, y.dv, p.VShape()))) << name;
      if (sink) EXPECT_TRUE(x.dsink.BitwiseEqual(y.dsink)) << name;
      const ForwardOut f = Forward<double>(p, a.q, a.k, a.v, options);
      EXPECT_TRUE(f.o.BitwiseEqual(x.o) && f.lse.BitwiseEqual(x.lse)) << name;
    }
  }
}

TEST(OraclePagedTest, Mp128PagedEqualsContiguousBitwise) {
  const PagedCase c = Cases()[1];
  const Problem cp = Contiguous(c.p);
  const GeneratedInputs a = Inputs(c.p), b = Inputs(cp);
  const BackwardOut x = Backward<Mp128>(c.p, a.q, a.k, a.v, a.dout);
  const BackwardOut y = Backward<Mp128>(cp, b.q, b.k, b.v, b.dout);
  EXPECT_TRUE(x.o.BitwiseEqual(y.o));
  EXPECT_TRUE(x.lse.BitwiseEqual(y.lse));
  EXPECT_TRUE(x.dq.BitwiseEqual(y.dq));
  EXPECT_TRUE(x.dk.BitwiseEqual(ToPool(c.p, cp, y.dk, c.p.KShape())));
  EXPECT_TRUE(x.dv.BitwiseEqual(ToPool(c.p, cp, y.dv, c.p.VShape())));
}

// ---- The dense reference: its own indexing of pages, rows and lse, two-pass softmax. ----

struct DenseOut {
  std::vector<double> o, lse, dq, dk, dv;  // the problem's layouts
};

DenseOut Dense(const Problem& p, const GeneratedInputs& in) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const bool packed = p.cu_seqlens_q.has_value();
  const int64_t tq = packed ? p.cu_seqlens_q->back() : p.batch * p.seqlen_q;
  const int64_t key_rows =
      p.page_size > 0 ? p.num_pages * p.page_size
                      : (packed ? p.cu_seqlens_k->back() : p.batch * p.seqlen_k);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double* q = in.q.data<const double>();
  const double* k = in.k.data<const double>();
  const double* v = in.v.data<const double>();
  const double* dout = in.dout.data<const double>();
  DenseOut r;
  r.o.assign(static_cast<size_t>(tq * hq * dv), 0.0);
  r.lse.assign(static_cast<size_t>(tq * hq), kNegInf);
  r.dq.assign(static_cast<size_t>(tq * hq * d), 0.0);
  r.dk.assign(static_cast<size_t>(key_rows * hkv * d), 0.0);
  r.dv.assign(static_cast<size_t>(key_rows * hkv * dv), 0.0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q0 = packed ? (*p.cu_seqlens_q)[b] : b * p.seqlen_q;
    const int64_t k0 = packed ? (*p.cu_seqlens_k)[b] : b * p.seqlen_k;
    const int64_t nq = p.seqused_q ? (*p.seqused_q)[b]
                                   : (packed ? (*p.cu_seqlens_q)[b + 1] - q0 : p.seqlen_q);
    const int64_t nk = p.seqused_k ? (*p.seqused_k)[b]
                                   : (packed ? (*p.cu_seqlens_k)[b + 1] - k0 : p.seqlen_k);
    auto krow = [&](int64_t j) {
      if (p.page_size == 0) return k0 + j;
      return int64_t{(*p.page_table)[b][j / p.page_size]} * p.page_size + j % p.page_size;
    };
    const int64_t off = p.causal_align == CausalAlign::kBottomRight ? nk - nq : 0;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[h] : 0.0;
      for (int64_t i = 0; i < nq; ++i) {
        const double* qi = q + ((q0 + i) * hq + h) * d;
        const double* doi = dout + ((q0 + i) * hq + h) * dv;
        std::vector<double> s(nk), t(nk, 0.0), pr(nk, 0.0), dp(nk, 0.0);
        std::vector<bool> vis(nk);
        double mx = kNegInf;
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t diag = i + off;
          vis[j] = (!p.causal || j <= diag) && (p.window_left < 0 || j >= diag - p.window_left) &&
                   (p.window_right < 0 || j <= diag + p.window_right);
          if (!vis[j]) continue;
          const double* kj = k + (krow(j) * hkv + g) * d;
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
        if (mx == kNegInf) continue;  // empty row
        double z = 0;
        for (int64_t j = 0; j < nk; ++j) z += vis[j] ? std::exp(s[j] - mx) : 0.0;
        const double lse = mx + std::log(z);
        r.lse[static_cast<size_t>(packed ? h * tq + q0 + i : (b * hq + h) * p.seqlen_q + i)] = lse;
        double* oi = &r.o[static_cast<size_t>(((q0 + i) * hq + h) * dv)];
        double delta = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[j]) continue;
          pr[j] = std::exp(s[j] - lse);
          const double* vj = v + (krow(j) * hkv + g) * dv;
          for (int64_t e = 0; e < dv; ++e) {
            oi[e] += pr[j] * vj[e];
            dp[j] += doi[e] * vj[e];
          }
          delta += pr[j] * dp[j];
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[j]) continue;
          double ds = pr[j] * (dp[j] - delta);
          if (p.softcap > 0) ds *= 1 - t[j] * t[j];
          const double* kj = k + (krow(j) * hkv + g) * d;
          double* dkj = &r.dk[static_cast<size_t>((krow(j) * hkv + g) * d)];
          double* dvj = &r.dv[static_cast<size_t>((krow(j) * hkv + g) * dv)];
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

TEST(OraclePagedTest, AgreesWithAnIndependentDenseReference) {
  for (const PagedCase& c : Cases()) {
    const GeneratedInputs in = Inputs(c.p);
    const BackwardOut x = Backward<double>(c.p, in.q, in.k, in.v, in.dout);
    const DenseOut ref = Dense(c.p, in);
    const std::pair<const char*, std::pair<const Tensor*, const std::vector<double>*>> pairs[] = {
        {"o", {&x.o, &ref.o}},    {"lse", {&x.lse, &ref.lse}}, {"dq", {&x.dq, &ref.dq}},
        {"dk", {&x.dk, &ref.dk}}, {"dv", {&x.dv, &ref.dv}}};
    for (const auto& [t, xy] : pairs) {
      const Tensor r = Tensor::FromF64(xy.first->shape(), *xy.second);
      const double m = MaxAbs(r), e = MaxAbsDiff(*xy.first, r);
      const double err = e == 0 ? 0 : e / m;
      std::printf("  %-36s %-4s max|err| / max|ref| = %.2e\n", c.name.c_str(), t, err);
      EXPECT_LE(err, 1e-10) << c.name << " " << t;
    }
  }
}

TEST(OraclePagedTest, GeneratedPoolsAreHostileAndSampledRowsAreRefused) {
  const PagedCase c = Cases()[0];
  const GeneratedInputs in = Inputs(c.p);
  int64_t nan = 0;
  for (double x : in.k.span<const double>()) nan += std::isnan(x) ? 1 : 0;
  EXPECT_GT(nan, 0) << "the generator leaves no NaN in the unreferenced pages";
  std::vector<uint8_t> rows(static_cast<size_t>(c.p.TotalQ()), 1);
  OracleOptions options;
  options.query_rows = &rows;
  EXPECT_THROW(Forward<double>(c.p, in.q, in.k, in.v, options), std::invalid_argument);
}

}  // namespace
}  // namespace attest
