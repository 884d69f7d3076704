// The straightforward oracle loop, generic in the scalar (oracle.h): every score, weight and
// sum is computed in T (boost::multiprecision for certification and golden files; also
// instantiated for double in tests as an independent check of the BLAS path). One query row
// at a time, keys in ascending order, work items (batch, kv head) over std::threads so that
// every result is a fixed sequence of operations whatever the thread count. Memory: the
// inputs converted to T, the forward's o and lse in T (the backward differentiates the
// unrounded MP forward), and one row of k_len scores.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "reference/oracle/oracle_internal.h"
#include "reference/problem/tile_walk.h"

namespace attest::oracle_internal {

template <class T>
std::vector<T> ToScalar(const double* x, int64_t n) {
  std::vector<T> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) out.emplace_back(x[e]);  // exact: T has >= 53 bits
  return out;
}

template <class T>
T Dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

template <class T>
struct GenericRun {
  const Problem& p;
  Inputs in;
  Norms norms;
  std::vector<MaskView> masks;
  int threads;
  std::vector<T> q, k, v, dout;  // inputs in T
  std::vector<T> sink;           // [Hq] in T when Problem::sink
  std::vector<T> rel_bias;       // [Hq, W] in T when Problem::rel_bias
  std::vector<T> o, lse;         // forward: [total_q, Hq, Dv] and [total_q, Hq]
  std::vector<char> empty;       // [total_q, Hq]: the row sees no key
  OracleStats stats;
  std::function<void()> worker_exit;  // per-thread cleanup of the scalar type's library

  GenericRun(const Problem& prob, const Tensor& tq, const Tensor& tk, const Tensor& tv,
             const Tensor* tdo, const OracleOptions& options, std::function<void()> exit_hook = {})
      : p(prob),
        in(CheckInputs(prob, tq, tk, tv, tdo, options.sink, options.rel_bias)),
        norms(ComputeNorms(prob, in)),
        masks(MaskViews(prob)),
        threads(ThreadCount(options, prob.batch * prob.heads_kv)),
        worker_exit(std::move(exit_hook)) {
    q = ToScalar<T>(in.Q(), in.q.numel());
    k = ToScalar<T>(in.K(), in.k.numel());
    v = ToScalar<T>(in.V(), in.v.numel());
    if (tdo != nullptr) dout = ToScalar<T>(in.DO(), in.dout.numel());
    if (in.HasSink()) sink = ToScalar<T>(in.sink.data(), static_cast<int64_t>(in.sink.size()));
    stats.sink_abs_max = SinkAbsMax(in);
    if (in.HasRelBias()) {
      rel_bias = ToScalar<T>(in.rel_bias.data(), static_cast<int64_t>(in.rel_bias.size()));
    }
    stats.rel_bias_abs_max = RelBiasAbsMax(in);
    stats.unit_roundoff = std::ldexp(1.0, -std::numeric_limits<T>::digits);
    stats.scale = p.EffectiveScale();
    stats.softcap = p.softcap;
    stats.head_dim = p.head_dim;
    stats.head_dim_v = p.head_dim_v;
    stats.v_abs_max = norms.v_abs;
    stats.v_norm_max = norms.v_norm;
    stats.k_abs_max = norms.k_abs;
  }

  const T* QRow(int64_t row, int64_t h) const {
    return &q[static_cast<size_t>(RowOffset(row, p.heads_q, h, p.head_dim))];
  }
  const T* KRow(int64_t row, int64_t g) const {
    return &k[static_cast<size_t>(RowOffset(row, p.heads_kv, g, p.head_dim))];
  }
  const T* VRow(int64_t row, int64_t g) const {
    return &v[static_cast<size_t>(RowOffset(row, p.heads_kv, g, p.head_dim_v))];
  }
  const T* DoRow(int64_t row, int64_t h) const {
    return &dout[static_cast<size_t>(RowOffset(row, p.heads_q, h, p.head_dim_v))];
  }

  // The transformed score of a visible pair, with the pre-softcap score in *pre (for the
  // softcap derivative), and the pair's score magnitude folded into `st`.
  T Score(const MaskView& mask, int64_t h, int64_t i, int64_t j, T* pre, OracleStats& st) const {
    const Sequence& seq = mask.sequence();
    const int64_t g = p.KvHead(h);
    const double scale = stats.scale;
    const double slope = AlibiSlope(p, h);
    const int64_t dist = mask.AlibiDistance(i, j);
    *pre = T(scale) * Dot(QRow(seq.q_begin + i, h), KRow(seq.k_begin + j, g), p.head_dim);
    const double a = std::abs(scale) *
                         norms.q[static_cast<size_t>((seq.q_begin + i) * p.heads_q + h)] *
                         norms.k[static_cast<size_t>((seq.k_begin + j) * p.heads_kv + g)] +
                     std::abs(slope * static_cast<double>(dist));
    st.score_abs_max = std::max(st.score_abs_max, a);
    const T s = TransformScore<T>(*pre, p.softcap, slope, dist);
    return in.HasRelBias() ? T(s + rel_bias[RelBiasIndex(h, i, j)]) : s;
  }
  // rel_bias[h, i - j + Sk - 1] (Problem::rel_bias), row-major [Hq, W].
  size_t RelBiasIndex(int64_t h, int64_t i, int64_t j) const {
    return static_cast<size_t>(h * p.RelBiasWidth() + i - j + p.seqlen_k - 1);
  }

  void RunForward() {
    using std::exp;
    using std::isinf;
    using std::log;
    const int64_t rows = p.TotalQ();
    o.assign(static_cast<size_t>(rows * p.heads_q * p.head_dim_v), T(0));
    lse.assign(static_cast<size_t>(rows * p.heads_q), -std::numeric_limits<T>::infinity());
    empty.assign(static_cast<size_t>(rows * p.heads_q), 1);
    std::vector<OracleStats> partial(static_cast<size_t>(threads));
    // Items (b, h): each writes only the rows of its own batch entry and head.
    ParallelFor(
        p.batch * p.heads_q, threads,
        [&](int64_t item, int worker) {
          const int64_t b = item / p.heads_q, h = item % p.heads_q;
          const MaskView& mask = masks[static_cast<size_t>(b)];
          const Sequence& seq = mask.sequence();
          const int64_t g = p.KvHead(h);
          OracleStats& st = partial[static_cast<size_t>(worker)];
          std::vector<T> s(static_cast<size_t>(seq.k_len));
          std::vector<int64_t> keys;
          for (int64_t i = 0; i < seq.q_len; ++i) {
            const int64_t row = seq.q_begin + i;
            keys.clear();
            T m = -std::numeric_limits<T>::infinity();
            T pre;
            ForEachVisibleKey(mask, i, [&](int64_t j) {
              keys.push_back(j);
              s[static_cast<size_t>(j)] = Score(mask, h, i, j, &pre, st);
              if (s[static_cast<size_t>(j)] > m) m = s[static_cast<size_t>(j)];
            });
            st.max_keys = std::max<int64_t>(st.max_keys, static_cast<int64_t>(keys.size()));
            const size_t r = static_cast<size_t>(row * p.heads_q + h);
            // The sink is one more logit in the denominator, with no value (-inf: none).
            const bool has_sink = in.HasSink() && !isinf(sink[static_cast<size_t>(h)]);
            if (keys.empty()) {
              ++st.empty_rows;
              if (has_sink) lse[r] = sink[static_cast<size_t>(h)];
              continue;  // o = 0, lse = -inf (already) or the sink
            }
            if (has_sink && sink[static_cast<size_t>(h)] > m) m = sink[static_cast<size_t>(h)];
            T l = has_sink ? T(exp(sink[static_cast<size_t>(h)] - m)) : T(0);
            T* orow = &o[static_cast<size_t>(RowOffset(row, p.heads_q, h, p.head_dim_v))];
            for (int64_t j : keys) {
              const T e = exp(s[static_cast<size_t>(j)] - m);
              l += e;
              const T* vrow = VRow(seq.k_begin + j, g);
              for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] += e * vrow[d];
            }
            for (int64_t d = 0; d < p.head_dim_v; ++d) orow[d] /= l;
            lse[r] = m + log(l);
            empty[r] = 0;
            st.lse_abs_max = std::max(st.lse_abs_max, std::abs(static_cast<double>(lse[r])));
          }
        },
        worker_exit);
    for (const auto& st : partial) MergeStats(stats, st);
    stats.sum_len_k = stats.max_keys + (AnyFiniteSink(in) ? 1 : 0);
  }

  // dsink [Hq] from the forward's lse and the backward's delta (RunBackward first): the sum
  // over every row of head h, in T.
  std::vector<T> Dsink(const std::vector<T>& delta) {
    using std::exp;
    using std::isinf;
    std::vector<T> out(static_cast<size_t>(p.heads_q), T(0));
    stats.sink_rows = p.TotalQ();
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const T& sv = sink[static_cast<size_t>(h)];
      if (isinf(sv)) continue;  // -inf: no sink, dsink = 0
      T sum = 0, mass = 0;
      for (int64_t row = 0; row < p.TotalQ(); ++row) {
        const size_t r = static_cast<size_t>(row * p.heads_q + h);
        const T w = exp(sv - lse[r]);
        mass += w;
        sum -= w * delta[r];
      }
      out[static_cast<size_t>(h)] = sum;
      stats.sink_mass_max = std::max(stats.sink_mass_max, static_cast<double>(mass));
    }
    return out;
  }

  // dq, dk, dv, delta in T (and with Problem::rel_bias drel_bias [Hq, W]: the items' sums
  // per (b, h), then over b ascending); requires RunForward first.
  void RunBackward(std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv,
                   std::vector<T>& delta, std::vector<T>* drel_bias = nullptr) {
    using std::exp;
    using std::tanh;
    const int64_t ratio = p.gqa_ratio();
    dq.assign(static_cast<size_t>(p.TotalQ() * p.heads_q * p.head_dim), T(0));
    dk.assign(static_cast<size_t>(p.TotalK() * p.heads_kv * p.head_dim), T(0));
    dv.assign(static_cast<size_t>(p.TotalK() * p.heads_kv * p.head_dim_v), T(0));
    delta.assign(static_cast<size_t>(p.TotalQ() * p.heads_q), T(0));
    const int64_t width = p.RelBiasWidth();
    const bool bias = in.HasRelBias() && drel_bias != nullptr;
    // Per (b, h): dS sums, P sums and term counts of each diagonal.
    std::vector<T> rb_sum, rb_mass;
    std::vector<int64_t> rb_terms;
    if (bias) {
      const size_t n = static_cast<size_t>(p.batch * p.heads_q * width);
      rb_sum.assign(n, T(0));
      rb_mass.assign(n, T(0));
      rb_terms.assign(n, 0);
    }
    std::vector<OracleStats> partial(static_cast<size_t>(threads));
    // Items (b, kv head): the query heads of one group and the keys of one kv head, so that
    // dq rows and dk/dv rows of different items are disjoint.
    ParallelFor(
        p.batch * p.heads_kv, threads,
        [&](int64_t item, int worker) {
          const int64_t b = item / p.heads_kv, g = item % p.heads_kv;
          const MaskView& mask = masks[static_cast<size_t>(b)];
          const Sequence& seq = mask.sequence();
          OracleStats& st = partial[static_cast<size_t>(worker)];
          std::vector<T> mass(static_cast<size_t>(seq.k_len), T(0));
          std::vector<int64_t> seen(static_cast<size_t>(seq.k_len), 0);
          std::vector<T> dq_acc(static_cast<size_t>(p.head_dim));
          for (int64_t h = g * ratio; h < (g + 1) * ratio; ++h) {
            for (int64_t i = 0; i < seq.q_len; ++i) {
              const int64_t row = seq.q_begin + i;
              const size_t r = static_cast<size_t>(row * p.heads_q + h);
              if (empty[r]) continue;  // dq = 0, delta = 0
              const T* dorow = DoRow(row, h);
              const T* qrow = QRow(row, h);
              delta[r] = Dot(dorow, &o[r * static_cast<size_t>(p.head_dim_v)], p.head_dim_v);
              std::fill(dq_acc.begin(), dq_acc.end(), T(0));
              T pre;
              ForEachVisibleKey(mask, i, [&](int64_t j) {
                const int64_t krow = seq.k_begin + j;
                const T s = Score(mask, h, i, j, &pre, st);
                const T pij = exp(s - lse[r]);
                const T dp = Dot(dorow, VRow(krow, g), p.head_dim_v);
                T ds = pij * (dp - delta[r]);
                if (bias) {  // added after the softcap: dS before 1 - tanh^2
                  const size_t e =
                      static_cast<size_t>(b * p.heads_q * width) + RelBiasIndex(h, i, j);
                  rb_sum[e] += ds;
                  rb_mass[e] += pij;
                  ++rb_terms[e];
                }
                if (p.softcap > 0) {
                  // d/dx [cap tanh(x / cap)] = 1 - tanh^2(x / cap); ALiBi is a constant bias.
                  const T t = tanh(pre / T(p.softcap));
                  ds *= T(1) - t * t;
                }
                const T* krow_p = KRow(krow, g);
                T* dk_row = &dk[static_cast<size_t>(RowOffset(krow, p.heads_kv, g, p.head_dim))];
                T* dv_row = &dv[static_cast<size_t>(RowOffset(krow, p.heads_kv, g, p.head_dim_v))];
                for (int64_t d = 0; d < p.head_dim; ++d) {
                  dq_acc[static_cast<size_t>(d)] += ds * krow_p[d];
                  dk_row[d] += ds * qrow[d];
                }
                for (int64_t d = 0; d < p.head_dim_v; ++d) dv_row[d] += pij * dorow[d];
                mass[static_cast<size_t>(j)] += pij;
                ++seen[static_cast<size_t>(j)];
              });
              T* dq_row = &dq[static_cast<size_t>(RowOffset(row, p.heads_q, h, p.head_dim))];
              for (int64_t d = 0; d < p.head_dim; ++d) {
                dq_row[d] = T(stats.scale) * dq_acc[static_cast<size_t>(d)];
              }
            }
          }
          for (int64_t j = 0; j < seq.k_len; ++j) {
            const int64_t krow = seq.k_begin + j;
            T* dk_row = &dk[static_cast<size_t>(RowOffset(krow, p.heads_kv, g, p.head_dim))];
            for (int64_t d = 0; d < p.head_dim; ++d) dk_row[d] *= T(stats.scale);
            st.col_mass_max =
                std::max(st.col_mass_max, static_cast<double>(mass[static_cast<size_t>(j)]));
            st.max_queries = std::max(st.max_queries, seen[static_cast<size_t>(j)]);
            if (seen[static_cast<size_t>(j)] == 0) ++st.unseen_keys;
          }
        },
        worker_exit);
    OracleStats merged;
    for (const auto& st : partial) MergeStats(merged, st);
    stats.col_mass_max = merged.col_mass_max;
    stats.max_queries = merged.max_queries;
    stats.unseen_keys = merged.unseen_keys;
    stats.sum_len_q = merged.max_queries;
    stats.q_abs_max = norms.q_abs;
    stats.do_abs_max = norms.do_abs;
    stats.do_norm_max = norms.do_norm;
    if (bias) {
      drel_bias->assign(static_cast<size_t>(p.heads_q * width), T(0));
      for (int64_t e = 0; e < p.heads_q * width; ++e) {
        T mass = 0;
        int64_t terms = 0;
        for (int64_t b = 0; b < p.batch; ++b) {
          const size_t f = static_cast<size_t>(b * p.heads_q * width + e);
          (*drel_bias)[static_cast<size_t>(e)] += rb_sum[f];
          mass += rb_mass[f];
          terms += rb_terms[f];
        }
        stats.rel_bias_mass_max = std::max(stats.rel_bias_mass_max, static_cast<double>(mass));
        stats.rel_bias_terms = std::max(stats.rel_bias_terms, terms + p.batch);
      }
    }
  }
};

// Rounds each element once to double (MPFR: round to nearest).
template <class T>
Tensor ToTensor(const Shape& shape, const std::vector<T>& x) {
  Tensor t = Tensor::Zeros(DType::kF64, shape);
  double* out = t.data<double>();
  for (size_t e = 0; e < x.size(); ++e) out[e] = static_cast<double>(x[e]);
  return t;
}

// lse in T is stored [rows, Hq]; the public layout is [B, Hq, Sq] or [Hq, total_q].
template <class T>
Tensor LseToTensor(const Problem& p, const std::vector<T>& per_row) {
  Tensor t = Tensor::Zeros(DType::kF64, p.LseShape());
  double* out = t.data<double>();
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = SequenceOf(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < seq.q_len; ++i) {
        out[LseOffset(p, b, h, seq, i)] =
            static_cast<double>(per_row[static_cast<size_t>((seq.q_begin + i) * p.heads_q + h)]);
      }
    }
  }
  return t;
}

template <class T>
ForwardOut GenericForward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                          const OracleOptions& options,
                          const std::function<void()>& worker_exit = {}) {
  GenericRun<T> run(p, q, k, v, nullptr, options, worker_exit);
  run.RunForward();
  return {ToTensor(p.OShape(), run.o), LseToTensor(p, run.lse), run.stats};
}

template <class T>
BackwardOut GenericBackward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& dout, const OracleOptions& options,
                            const std::function<void()>& worker_exit = {}) {
  GenericRun<T> run(p, q, k, v, &dout, options, worker_exit);
  run.RunForward();
  std::vector<T> dq, dk, dv, delta, drel_bias;
  run.RunBackward(dq, dk, dv, delta, &drel_bias);
  BackwardOut out;
  out.dq = ToTensor(p.QShape(), dq);
  out.dk = ToTensor(p.KShape(), dk);
  out.dv = ToTensor(p.VShape(), dv);
  out.delta = LseToTensor(p, delta);
  if (run.in.HasSink()) out.dsink = ToTensor(p.SinkShape(), run.Dsink(delta));
  if (run.in.HasRelBias()) out.drel_bias = ToTensor(p.RelBiasShape(), drel_bias);
  out.o = ToTensor(p.OShape(), run.o);
  out.lse = LseToTensor(p, run.lse);
  out.stats = run.stats;
  return out;
}

}  // namespace attest::oracle_internal
