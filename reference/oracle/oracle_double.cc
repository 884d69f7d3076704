// The float64 oracle's forward (DoubleOracle::RunForward, ForwardTile; the class is in
// oracle_double.h, the backward in oracle_double_backward.cc), what both passes end with
// (unsampled rows blanked, rows to lse tensors) and the Forward<double> and Backward<double>
// entry points.
//
// Forward, work items (batch, query head, query tile): for each key tile in ascending order,
// S = scale Q K^T, then per row the score transform and the mask (-inf), the online
// softmax (running max m; when it grows, O and the denominator l are rescaled by
// exp(m_old - m_new)), P = exp(s - m), l += row sum of P with compensation (Sum2), and
// O += P V. At the end o = O / l and lse = m + log l. An online softmax rather than
// two passes: one Q K^T instead of two, and the rescalings add at most u (|dm| + 1) each,
// which ErrorBound accounts for. Memory per worker: a tile_q x tile_k tile and O.
//
// Speed (docs/bench-oracle.md has the profile): the six products are ~70 % of the time, so
// what is around them is kept small. They are oracle_gemm.h's panel products, not OpenBLAS
// dgemm (which this file called before): dgemm packs both operands on every call,
// and here one of them is P or dS, new in every tile and only 2 D flops per element, so the
// packing was ~13 % of the time. The B operands (K^T, V^T, K, V, Q, dO) are packed into
// panels once per worker and (sequence, head) (PackKv, PackQdo: O(S D) per worker), the A
// operands (Q and dO rows, P, dS and their transposes) are read where they lie. On the
// acceptance shape (S = 4096, D = 128, 2 threads) that took fwd+bwd from 2.12 s to 1.70 s,
// and its per-core rate on the tile shapes is above OpenBLAS's (105 vs 74 GFLOP/s for
// 256 x 128 x 512 with packing). The products' rounding is fixed (oracle_gemm.h) and the
// same on every ISA, so results are now also independent of the machine's BLAS. Tiles
// default to AutoTiles (oracle.h). Elementwise work is one fused pass per row (oracle_exp.h:
// exp <= 1 ulp instead of glibc's scalar exp, lane-compensated sums, branch-free row
// statistics), vectorised per ISA.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_double.h"
#include "reference/oracle/oracle_exp.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/oracle/oracle_paged.h"
#include "reference/problem/tile_walk.h"

namespace attest {
namespace double_oracle {

void DoubleOracle::BlankUnsampled(double* o, double* dq, double* dk, double* dv) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t d = p_.head_dim, dvw = p_.head_dim_v;
  if (GatheredForward()) {  // the forward alone: exactly the flagged rows were computed
    for (int64_t row = 0; row < p_.TotalQ(); ++row) {
      if ((*options_.query_rows)[static_cast<size_t>(row)] != 0) continue;
      for (int64_t h = 0; h < p_.heads_q; ++h) {
        std::fill_n(o + RowOffset(row, p_.heads_q, h, dvw), dvw, nan);
        lse_rows_[RowIndex(row, h)] = nan;
      }
    }
    return;
  }
  for (int64_t b = 0; b < p_.batch; ++b) {
    const Sequence seq = SequenceOf(p_, b);
    for (int64_t i0 = 0; i0 < seq.q_len; i0 += tile_q_) {
      const int64_t tq = std::min(tile_q_, seq.q_len - i0);
      if (QueryTileWanted(seq, i0, tq)) continue;
      for (int64_t row = seq.q_begin + i0; row < seq.q_begin + i0 + tq; ++row) {
        for (int64_t h = 0; h < p_.heads_q; ++h) {
          std::fill_n(o + RowOffset(row, p_.heads_q, h, dvw), dvw, nan);
          lse_rows_[RowIndex(row, h)] = nan;
          if (dq == nullptr) continue;
          std::fill_n(dq + RowOffset(row, p_.heads_q, h, d), d, nan);
          delta_rows_[RowIndex(row, h)] = nan;
        }
      }
    }
    if (dk == nullptr) continue;
    for (int64_t j0 = 0; j0 < seq.k_len; j0 += tile_k_) {
      const int64_t tk = std::min(tile_k_, seq.k_len - j0);
      if (KeyTileWanted(seq, j0, tk)) continue;
      for (int64_t row = seq.k_begin + j0; row < seq.k_begin + j0 + tk; ++row) {
        for (int64_t g = 0; g < p_.heads_kv; ++g) {
          std::fill_n(dk + RowOffset(row, p_.heads_kv, g, d), d, nan);
          std::fill_n(dv + RowOffset(row, p_.heads_kv, g, dvw), dvw, nan);
        }
      }
    }
  }
}

void DoubleOracle::ForwardTile(const Tile& item, Scratch& sc, OracleStats& st, double* o,
                               bool keep) {
  const TileWalk& walk = walks_[static_cast<size_t>(item.b)];
  const Sequence& seq = walk.mask().sequence();
  const int64_t tq = item.tq, dv = p_.head_dim_v, key_tiles = KeyTiles(seq);
  const bool sink_term = AnyFiniteSink(in_);
  sc.acc_v.assign(static_cast<size_t>(tq * dv), 0.0);
  sc.m.assign(static_cast<size_t>(tq), kNegInf);
  sc.l.assign(static_cast<size_t>(tq), 0.0);
  sc.comp.assign(static_cast<size_t>(tq), 0.0);
  sc.tiles.assign(static_cast<size_t>(tq), 0);
  sc.keys.assign(static_cast<size_t>(tq), 0);
  sc.s.resize(static_cast<size_t>(tq * tile_k_));
  const size_t strip = static_cast<size_t>(tq * (keep ? seq.k_len : tile_k_));
  sc.strip.Reserve(strip);
  if (p_.softcap > 0) sc.strip_th.Reserve(strip);
  sc.visible.assign(static_cast<size_t>(tq * key_tiles), 0);
  if (item.rows != nullptr) {
    sc.q_gather.resize(static_cast<size_t>(tq * p_.head_dim));
    for (int64_t r = 0; r < tq; ++r) {
      const double* q = QRow(seq.q_begin + item.rows[r], item.h);
      std::copy(q, q + p_.head_dim, sc.q_gather.data() + r * p_.head_dim);
    }
  }
  int64_t max_tk = 0;
  const auto key_tile = [&](int64_t kt, int64_t j0, int64_t tk) {
    Tile t = item;
    t.j0 = j0;
    t.tk = tk;
    double* sblock = StripBlock(sc.strip, t, keep);
    double* thblock = p_.softcap > 0 ? StripBlock(sc.strip_th, t, keep) : nullptr;
    Scores(t, seq, sc, sblock);
    GatherKeyNorms(t, seq, sc);
    bool any = false;
    for (int64_t r = 0; r < tq; ++r) {
      const size_t ur = static_cast<size_t>(r);
      double* srow = sblock + r * t.tk;
      double* prow = &sc.s[static_cast<size_t>(r * t.tk)];
      int64_t count = 0;
      const double mx =
          TransformRow(t, sc, r, srow, thblock ? thblock + r * t.tk : nullptr, &count, st);
      if (count == 0) {
        std::fill(prow, prow + t.tk, 0.0);
        continue;
      }
      sc.visible[static_cast<size_t>(r * key_tiles + kt)] = 1;
      any = true;
      ++sc.tiles[ur];
      sc.keys[ur] += count;
      if (mx > sc.m[ur]) {
        if (sc.m[ur] != kNegInf) {
          double f = sc.m[ur] - mx;
          ExpInPlace(&f, 1);
          sc.l[ur] *= f;
          sc.comp[ur] *= f;
          double* acc = &sc.acc_v[static_cast<size_t>(r * dv)];
          for (int64_t d = 0; d < dv; ++d) acc[d] *= f;
        }
        sc.m[ur] = mx;
      }
      // P = exp(s - m) (-inf: 0) and l += rowsum(P), compensated: the tile's lane sum,
      // then its addition to l with the error kept.
      const CompensatedSum tile_sum = ExpShiftSum(srow, prow, t.tk, sc.m[ur]);
      double sum = sc.l[ur], comp = sc.comp[ur] + tile_sum.comp;
      TwoSumAdd(sum, comp, tile_sum.sum);
      sc.l[ur] = sum;
      sc.comp[ur] = comp;
    }
    if (!any) return;
    max_tk = std::max(max_tk, t.tk);
    GemmPanels(tq, dv, t.tk, sc.s.data(), t.tk, 1, sc.v_rows.Rows(t.j0), 1.0,
               /*accumulate=*/true, sc.acc_v.data(), dv);
  };
  if (item.rows != nullptr) {
    walk.ForEachKeyTileOfRows(item.rows, tq, key_tile);
  } else {
    walk.ForEachKeyTile(item.i0, tq, key_tile);
  }
  for (int64_t r = 0; r < tq; ++r) {
    const size_t ur = static_cast<size_t>(r);
    const int64_t row = seq.q_begin + item.Row(r);
    double* orow = o + RowOffset(row, p_.heads_q, item.h, dv);
    double& lse = lse_rows_[RowIndex(row, item.h)];
    st.max_keys = std::max(st.max_keys, sc.keys[ur]);
    st.sum_len_k = std::max(st.sum_len_k, max_tk + sc.tiles[ur] + (sink_term ? 1 : 0));
    if (sc.m[ur] == kNegInf) {
      EmptyRow(orow, dv, &lse);
      // A row with no visible key: o = 0, lse = sink_h (-inf without a sink), exactly.
      if (in_.HasSink()) lse = in_.sink[static_cast<size_t>(item.h)];
      ++st.empty_rows;
      continue;
    }
    FinishRow(item.h, sc.m[ur], sc.l[ur] + sc.comp[ur], &sc.acc_v[static_cast<size_t>(r * dv)],
              orow, &lse);
    st.lse_abs_max = std::max(st.lse_abs_max, std::abs(lse));
  }
}

void DoubleOracle::FinishRow(int64_t h, double m, double l, const double* acc, double* orow,
                             double* lse) const {
  const int64_t dv = p_.head_dim_v;
  // The sink joins the finished online softmax as one more logit with no value: with
  // m' = max(m, sink), f = exp(m - m'), l' = l f + exp(sink - m') and O f / l'. A sink of
  // -inf is skipped, so that it gives bitwise the answer of no sink.
  const double sink = in_.HasSink() ? in_.sink[static_cast<size_t>(h)] : kNegInf;
  if (sink == kNegInf) {
    for (int64_t d = 0; d < dv; ++d) orow[d] = acc[d] / l;
    *lse = m + std::log(l);
    return;
  }
  const double m2 = std::max(m, sink);
  const double f = std::exp(m - m2);  // 1 exactly when the sink is below the row max
  const double l2 = l * f + std::exp(sink - m2);
  for (int64_t d = 0; d < dv; ++d) orow[d] = acc[d] * f / l2;
  *lse = m2 + std::log(l2);
}

ForwardOut DoubleOracle::RunForward() {
  std::vector<Tile> items;
  std::vector<std::vector<int64_t>> gathered(static_cast<size_t>(p_.batch));
  for (int64_t b = 0; b < p_.batch; ++b) {
    const Sequence seq = SequenceOf(p_, b);
    if (GatheredForward()) {
      const std::vector<int64_t>& rows = gathered[static_cast<size_t>(b)] = GatheredRows(seq);
      const int64_t n = static_cast<int64_t>(rows.size());
      for (int64_t h = 0; h < p_.heads_q; ++h) {
        for (int64_t r0 = 0; r0 < n; r0 += tile_q_) {
          const int64_t tq = std::min(tile_q_, n - r0);
          items.push_back({b, h, p_.KvHead(h), rows[static_cast<size_t>(r0)], tq, 0, 0,
                           rows.data() + r0});
        }
      }
      continue;
    }
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      for (int64_t i0 = 0; i0 < seq.q_len; i0 += tile_q_) {
        const int64_t tq = std::min(tile_q_, seq.q_len - i0);
        if (!all_query_tiles_ && !QueryTileWanted(seq, i0, tq)) continue;
        items.push_back({b, h, p_.KvHead(h), i0, tq, 0, 0});
      }
    }
  }
  const int threads = ThreadCount(options_, static_cast<int64_t>(items.size()));
  ForwardOut out;
  out.o = Tensor::Zeros(DType::kF64, p_.OShape());
  lse_rows_.assign(static_cast<size_t>(p_.TotalQ() * p_.heads_q), kNegInf);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  std::vector<OracleStats> partial(static_cast<size_t>(threads));
  double* o = out.o.data<double>();
  ParallelFor(static_cast<int64_t>(items.size()), threads, [&](int64_t n, int w) {
    const Tile& item = items[static_cast<size_t>(n)];
    Scratch& sc = scratch[static_cast<size_t>(w)];
    PackKv(item.b, item.g, /*backward=*/false, sc);
    ForwardTile(item, sc, partial[static_cast<size_t>(w)], o, /*keep=*/false);
  });
  for (const auto& st : partial) MergeStats(stats_, st);
  if (Sampled() && !in_backward_) BlankUnsampled(o, nullptr, nullptr, nullptr);
  out.lse = RowsToLse(lse_rows_);
  out.stats = stats_;
  return out;
}

Tensor DoubleOracle::RowsToLse(const std::vector<double>& rows) const {
  Tensor t = Tensor::Zeros(DType::kF64, p_.LseShape());
  double* x = t.data<double>();
  for (int64_t b = 0; b < p_.batch; ++b) {
    const Sequence seq = SequenceOf(p_, b);
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      for (int64_t i = 0; i < seq.q_len; ++i) {
        x[LseOffset(p_, b, h, seq, i)] = rows[RowIndex(seq.q_begin + i, h)];
      }
    }
  }
  return t;
}

}  // namespace double_oracle

OracleTiles AutoTiles(const Problem&) { return OracleTiles{128, 128}; }

template <>
ForwardOut Forward<double>(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const OracleOptions& options) {
  if (HasLogicalView(p)) return oracle_internal::LogicalForward<double>(p, q, k, v, options);
  return double_oracle::DoubleOracle(p, q, k, v, nullptr, options).RunForward();
}

template <>
BackwardOut Backward<double>(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& dout, const OracleOptions& options) {
  if (HasLogicalView(p)) return oracle_internal::LogicalBackward<double>(p, q, k, v, dout, options);
  return double_oracle::DoubleOracle(p, q, k, v, &dout, options).RunBackward();
}

}  // namespace attest
