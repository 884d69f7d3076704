// The float64 oracle's backward (DoubleOracle::RunBackward, BackwardItem; the class is in
// oracle_double.h, the forward in oracle_double.cc).
//
// Backward, work items (batch, query head): for each query tile in ascending order, the
// forward (oracle_double.cc) for that tile (its o, lse, never a kernel's), delta = rowsum(dO o)
// of its rows by compensated dot products; then for each key tile that the tile's rows may see, in
// ascending order: S, P = exp(s - lse), dP = dO V^T, dS = P (dP - delta) [(1 - tanh^2) with
// softcap], dV_rows += P^T dO, dK_rows += dS^T Q, dQ_rows += dS K_tile. S is
// the forward's: the tile's transformed scores (tile_q x Sk) are kept from its forward when
// they fit in OracleOptions::score_cache_bytes, else recomputed by the same product on the same
// operands; either way the same bits, and 6 products per tile pair instead of 7 when kept.
// dq rows accumulate over key tiles in ascending order (in a contiguous tile_q x D buffer);
// dk/dv rows over query tiles in ascending order (the same sums in the same order as FA2
// Alg. 2's key-tile-major loop, which this code computed until 2026-12: bitwise the same
// results), into the worker's contiguous [Sk, D + Dv] accumulators (MHA; copied to the
// outputs, whose rows are H D apart, at the end), or for a kv head shared by several query
// heads (GQA) into per-query-head partials that are summed in ascending head order at the
// end. Nothing depends on which thread ran what: results are bitwise independent of the
// thread count. Flops: 4 + 10 = 14 Sq Sk D (D = Dv; 12 when the scores are kept); extra
// memory per worker: tile_q x Sk scores and [Sk, D + Dv] accumulators; one
// [Hq, total_k, D + Dv] partial when Hq > Hkv, and the operand panels (below).
// Keeping the scores trades the recomputed Q K^T (1/7 of the flops) for writing and reading
// 8 bytes per score outside L2: ~6 % net on the 2-core VM of docs/bench-oracle.md. With
// fewer (batch, head) items than threads, the forward runs first on its own (parallel over
// query tiles as well) and the backward recomputes the scores: the same bits, more threads.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_double.h"
#include "reference/oracle/oracle_exp.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/tile_walk.h"

namespace attest::double_oracle {

void DoubleOracle::BackwardItem(int64_t b, int64_t h, bool forward_done, Scratch& sc,
                                OracleStats& st, double* o, double* dq, double* dk, double* dv,
                                double* mass, int64_t* seen) {
  const TileWalk& walk = walks_[static_cast<size_t>(b)];
  const Sequence& seq = walk.mask().sequence();
  const int64_t g = p_.KvHead(h), dd = p_.head_dim, ddv = p_.head_dim_v;
  const int64_t key_tiles = KeyTiles(seq);
  // dk/dv rows of this item's sequence, [k_len, D] and [k_len, Dv], zero: the worker's
  // accumulators when the kv head has one query head (copied to the outputs at the end),
  // else this query head's partial ([Hq, total_k, D] laid out and zeroed by the caller).
  const bool direct = p_.gqa_ratio() == 1;
  if (direct) {
    sc.acc_k.AssignZeros(static_cast<size_t>(seq.k_len * dd));
    sc.acc_kv.AssignZeros(static_cast<size_t>(seq.k_len * ddv));
  }
  double* dk_seq = direct ? sc.acc_k.data() : dk + seq.k_begin * dd;
  double* dv_seq = direct ? sc.acc_kv.data() : dv + seq.k_begin * ddv;
  const bool keep = !forward_done && KeepScores(seq);
  const double cap = p_.softcap;
  PackKv(b, g, /*backward=*/true, sc);
  PackQdo(b, h, sc);
  sc.dp.resize(static_cast<size_t>(tile_q_ * tile_k_));
  // Per key tile: how many query tiles added to its dk/dv rows, and the largest of them
  // (OracleStats::sum_len_q).
  sc.chain.assign(static_cast<size_t>(key_tiles), 0);
  sc.chain_tq.assign(static_cast<size_t>(key_tiles), 0);
  for (int64_t i0 = 0; i0 < seq.q_len; i0 += tile_q_) {
    const Tile item{b, h, g, i0, std::min(tile_q_, seq.q_len - i0), 0, 0};
    const int64_t tq = item.tq, row0 = seq.q_begin + i0;
    // Sampled: a tile whose rows are not asked for runs only for the keys that are.
    const bool want_q = QueryTileWanted(seq, i0, tq);
    if (!want_q && !all_query_tiles_) continue;
    sc.acc_q.assign(static_cast<size_t>(tq * dd), 0.0);
    if (forward_done) {
      sc.s.resize(static_cast<size_t>(tq * tile_k_));
      sc.strip.Reserve(static_cast<size_t>(tq * tile_k_));
      if (cap > 0) sc.strip_th.Reserve(static_cast<size_t>(tq * tile_k_));
      sc.visible.assign(static_cast<size_t>(tq * key_tiles), 0);
    } else {
      ForwardTile(item, sc, st, o, keep);
      for (int64_t r = 0; r < tq; ++r) {
        delta_rows_[RowIndex(row0 + r, h)] =
            Delta(DoRow(row0 + r, h), o + RowOffset(row0 + r, p_.heads_q, h, ddv));
      }
    }
    walk.ForEachKeyTile(i0, tq, [&](int64_t kt, int64_t j0, int64_t tk) {
      if (!want_q && !KeyTileWanted(seq, j0, tk)) return;
      Tile t = item;
      t.j0 = j0;
      t.tk = tk;
      double* sblock = StripBlock(sc.strip, t, keep);
      double* thblock = cap > 0 ? StripBlock(sc.strip_th, t, keep) : nullptr;
      if (!keep) {
        // The forward's scores again: the same product on the same operands, the same
        // transform (its statistics are the forward's, recorded again).
        Scores(t, seq, sc, sblock);
        GatherKeyNorms(t, seq, sc);
        for (int64_t r = 0; r < tq; ++r) {
          int64_t count = 0;
          TransformRow(t, sc, r, sblock + r * tk, thblock ? thblock + r * tk : nullptr, &count,
                       st);
          sc.visible[static_cast<size_t>(r * key_tiles + kt)] = count > 0 ? 1 : 0;
        }
      }
      bool any = false;
      for (int64_t r = 0; r < tq && !any; ++r) {
        any = sc.visible[static_cast<size_t>(r * key_tiles + kt)] != 0;
      }
      if (!any) return;
      // dP = dO_tile V_tile^T.
      GemmPanels(tq, tk, ddv, DoRow(row0, h), DoLd(), 1, KeyTilePanels(sc.vt, ddv, kt), 1.0,
                 /*accumulate=*/false, sc.dp.data(), tk);
      for (int64_t r = 0; r < tq; ++r) {
        double* prow = &sc.s[static_cast<size_t>(r * tk)];
        double* dprow = &sc.dp[static_cast<size_t>(r * tk)];
        if (!sc.visible[static_cast<size_t>(r * key_tiles + kt)]) {
          std::fill(prow, prow + tk, 0.0);
          std::fill(dprow, dprow + tk, 0.0);
          continue;
        }
        // P = exp(s - lse) (masked: -inf, exp gives 0), dS = P (dP - delta), the column
        // mass, and the visible count (visible entries are exactly the finite ones before
        // the exp, which can underflow).
        BackwardRow(sblock + r * tk, prow, dprow, tk, lse_rows_[RowIndex(row0 + r, h)],
                    delta_rows_[RowIndex(row0 + r, h)], mass + (seq.k_begin + t.j0),
                    seen + (seq.k_begin + t.j0));
        // The bias is added after the softcap: its gradient is dS before 1 - tanh^2.
        if (in_.HasRelBias()) AccumulateRelBias(t, r, sc.s.data(), sc.dp.data());
        if (cap > 0) {
          // d/dx [cap tanh(x / cap)] = 1 - tanh^2(x / cap); ALiBi is a constant bias.
          const double* throw_ = thblock + r * tk;
          for (int64_t c = 0; c < tk; ++c) {
            if (prow[c] != 0.0) dprow[c] *= 1.0 - throw_[c] * throw_[c];
          }
        }
      }
      ++sc.chain[static_cast<size_t>(kt)];
      sc.chain_tq[static_cast<size_t>(kt)] = std::max(sc.chain_tq[static_cast<size_t>(kt)], tq);
      // dV += P^T dO, dK += dS^T Q (unscaled), dQ += dS K (unscaled).
      GemmPanels(tk, ddv, tq, sc.s.data(), 1, tk, sc.do_rows.Rows(i0), 1.0,
                 /*accumulate=*/true, dv_seq + t.j0 * ddv, ddv);
      GemmPanels(tk, dd, tq, sc.dp.data(), 1, tk, sc.q_rows.Rows(i0), 1.0,
                 /*accumulate=*/true, dk_seq + t.j0 * dd, dd);
      GemmPanels(tq, dd, tk, sc.dp.data(), tk, 1, sc.k_rows.Rows(t.j0), 1.0,
                 /*accumulate=*/true, sc.acc_q.data(), dd);
    });
    for (int64_t r = 0; r < tq; ++r) {
      double* dqrow = dq + RowOffset(row0 + r, p_.heads_q, h, dd);
      const double* acc = &sc.acc_q[static_cast<size_t>(r * dd)];
      for (int64_t d = 0; d < dd; ++d) dqrow[d] = stats_.scale * acc[d];
    }
  }
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    st.sum_len_q =
        std::max(st.sum_len_q, sc.chain_tq[static_cast<size_t>(kt)] +
                                   sc.chain[static_cast<size_t>(kt)] + p_.gqa_ratio());
  }
  if (direct) {  // MHA: final values, dk = scale dS^T Q; GQA: unscaled partials, summed later.
    for (int64_t j = 0; j < seq.k_len; ++j) {
      double* dkrow = dk + RowOffset(seq.k_begin + j, p_.heads_kv, g, dd);
      double* dvrow = dv + RowOffset(seq.k_begin + j, p_.heads_kv, g, ddv);
      const double* acc_k = &sc.acc_k[static_cast<size_t>(j * dd)];
      const double* acc_v = &sc.acc_kv[static_cast<size_t>(j * ddv)];
      for (int64_t d = 0; d < dd; ++d) dkrow[d] = stats_.scale * acc_k[d];
      std::copy(acc_v, acc_v + ddv, dvrow);
    }
  }
}

BackwardOut DoubleOracle::RunBackward() {
  const int64_t dv = p_.head_dim_v, dd = p_.head_dim;
  const int64_t items = p_.batch * p_.heads_q;
  // Fewer (batch, head) items than threads and several query tiles per item: the forward
  // runs first on its own, parallel over query tiles too, and the backward recomputes the
  // scores (the same bits as keeping them, on more threads).
  bool forward_first = items < ThreadCount(options_, std::numeric_limits<int64_t>::max());
  bool several_tiles = false;
  for (int64_t b = 0; b < p_.batch; ++b) several_tiles |= SequenceOf(p_, b).q_len > tile_q_;
  forward_first = forward_first && several_tiles;
  BackwardOut out;
  delta_rows_.assign(static_cast<size_t>(p_.TotalQ() * p_.heads_q), 0.0);
  in_backward_ = true;
  all_query_tiles_ = AnyFlag(options_.key_rows, 0, p_.TotalK());
  if (forward_first) {
    ForwardOut fwd = RunForward();  // o, lse_rows_, and the forward's statistics in stats_
    out.o = std::move(fwd.o);
    const double* o = out.o.data<double>();
    for (int64_t row = 0; row < p_.TotalQ(); ++row) {
      for (int64_t h = 0; h < p_.heads_q; ++h) {
        delta_rows_[RowIndex(row, h)] =
            Delta(DoRow(row, h), o + RowOffset(row, p_.heads_q, h, dv));
      }
    }
  } else {
    out.o = Tensor::Zeros(DType::kF64, p_.OShape());
    lse_rows_.assign(static_cast<size_t>(p_.TotalQ() * p_.heads_q), kNegInf);
  }
  out.dq = Tensor::Zeros(DType::kF64, p_.QShape());
  out.dk = Tensor::Zeros(DType::kF64, p_.KShape());
  out.dv = Tensor::Zeros(DType::kF64, p_.VShape());
  const int64_t ratio = p_.gqa_ratio(), total_k = p_.TotalK();
  // GQA: per-query-head partials of dk/dv; MHA writes the outputs directly.
  BigArray part_k, part_v;
  if (ratio > 1) {
    part_k.AssignZeros(static_cast<size_t>(p_.heads_q * total_k * dd));
    part_v.AssignZeros(static_cast<size_t>(p_.heads_q * total_k * dv));
  }
  std::vector<double> mass(static_cast<size_t>(p_.heads_q * total_k), 0.0);
  if (in_.HasRelBias()) {
    const size_t n = static_cast<size_t>(items * p_.RelBiasWidth());
    rel_sums_ = {std::vector<double>(n, 0.0), std::vector<double>(n, 0.0),
                 std::vector<double>(n, 0.0), std::vector<int64_t>(n, 0)};
  }
  std::vector<int64_t> seen(static_cast<size_t>(p_.heads_q * total_k), 0);
  const int threads = ThreadCount(options_, items);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  std::vector<OracleStats> partial(static_cast<size_t>(threads));
  ParallelFor(items, threads, [&](int64_t n, int w) {
    const int64_t b = n / p_.heads_q, h = n % p_.heads_q;
    double* dk = ratio > 1 ? part_k.data() + h * total_k * dd : out.dk.data<double>();
    double* dvp = ratio > 1 ? part_v.data() + h * total_k * dv : out.dv.data<double>();
    BackwardItem(b, h, forward_first, scratch[static_cast<size_t>(w)],
                 partial[static_cast<size_t>(w)],
                 out.o.data<double>(), out.dq.data<double>(), dk, dvp,
                 mass.data() + h * total_k, seen.data() + h * total_k);
  });
  scratch.clear();
  if (ratio > 1) {
    // dk = scale * sum over the group's query heads, ascending.
    double* dk = out.dk.data<double>();
    double* dvt = out.dv.data<double>();
    for (int64_t row = 0; row < total_k; ++row) {
      for (int64_t g = 0; g < p_.heads_kv; ++g) {
        double* dkrow = dk + RowOffset(row, p_.heads_kv, g, dd);
        double* dvrow = dvt + RowOffset(row, p_.heads_kv, g, dv);
        for (int64_t h = g * ratio; h < (g + 1) * ratio; ++h) {
          const double* pk = part_k.data() + (h * total_k + row) * dd;
          const double* pv = part_v.data() + (h * total_k + row) * dv;
          for (int64_t d = 0; d < dd; ++d) dkrow[d] += pk[d];
          for (int64_t d = 0; d < dv; ++d) dvrow[d] += pv[d];
        }
        for (int64_t d = 0; d < dd; ++d) dkrow[d] *= stats_.scale;
      }
    }
  }
  // Forward and backward statistics of the workers (the column statistics below are 0 in
  // them; after forward_first, the forward's are already in stats_ and the workers' forward
  // fields are 0 or repeat them).
  for (const auto& st : partial) MergeStats(stats_, st);
  // Column statistics per (kv head, key): summed over the group's query heads.
  for (int64_t g = 0; g < p_.heads_kv; ++g) {
    for (int64_t row = 0; row < total_k; ++row) {
      double m = 0;
      int64_t n = 0;
      for (int64_t h = g * ratio; h < (g + 1) * ratio; ++h) {
        m += mass[static_cast<size_t>(h * total_k + row)];
        n += seen[static_cast<size_t>(h * total_k + row)];
      }
      stats_.col_mass_max = std::max(stats_.col_mass_max, m);
      stats_.max_queries = std::max(stats_.max_queries, n);
      if (n == 0) ++stats_.unseen_keys;
    }
  }
  stats_.q_abs_max = norms_.q_abs;
  stats_.do_abs_max = norms_.do_abs;
  stats_.do_norm_max = norms_.do_norm;
  if (Sampled()) {
    BlankUnsampled(out.o.data<double>(), out.dq.data<double>(), out.dk.data<double>(),
                   out.dv.data<double>());
  }
  if (in_.HasSink()) out.dsink = Dsink();
  if (in_.HasRelBias()) out.drel_bias = DrelBias();
  out.lse = RowsToLse(lse_rows_);
  out.delta = RowsToLse(delta_rows_);
  out.stats = stats_;
  return out;
}

Tensor DoubleOracle::Dsink() {
  // dsink_h = -sum_i exp(sink_h - lse_i) delta_i over every row i of head h (all sequences,
  // ascending rows), compensated; an empty row adds exp(0) * 0. A sampled run lacks rows.
  Tensor t = Tensor::Zeros(DType::kF64, p_.SinkShape());
  double* out = t.data<double>();
  const int64_t rows = p_.TotalQ();
  stats_.sink_rows = rows;
  for (int64_t h = 0; h < p_.heads_q; ++h) {
    const double sink = in_.sink[static_cast<size_t>(h)];
    if (sink == kNegInf) continue;  // no sink in this head: dsink = 0
    if (Sampled()) {
      out[h] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    double sum = 0, comp = 0, mass = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const size_t r = RowIndex(row, h);
      const double w = std::exp(sink - lse_rows_[r]);
      mass += w;
      TwoSumAdd(sum, comp, -(w * delta_rows_[r]));
    }
    out[h] = sum + comp;
    stats_.sink_mass_max = std::max(stats_.sink_mass_max, mass);
  }
  return t;
}

void DoubleOracle::AccumulateRelBias(const Tile& t, int64_t r, const double* prow,
                                     const double* dsrow) {
  // Entry c of row i is the pair (i, j0 + c), diagonal i - j0 - c + Sk - 1 of the item's
  // [W] slice. Entries with P = 0 (masked, or underflowed) have dS = 0 exactly and are left
  // out; the others are summed in ascending (tile, row, column) order, compensated.
  const int64_t width = p_.RelBiasWidth();
  const size_t base = static_cast<size_t>((t.b * p_.heads_q + t.h) * width +
                                          (t.Row(r) - t.j0) + p_.seqlen_k - 1);
  const double* pr = prow + r * t.tk;
  const double* ds = dsrow + r * t.tk;
  for (int64_t c = 0; c < t.tk; ++c) {
    if (pr[c] == 0.0) continue;
    const size_t e = base - static_cast<size_t>(c);
    TwoSumAdd(rel_sums_.sum[e], rel_sums_.comp[e], ds[c]);
    rel_sums_.mass[e] += pr[c];
    ++rel_sums_.terms[e];
  }
}

Tensor DoubleOracle::DrelBias() {
  // drel_bias[h, d] = sum over b (ascending) of the items' compensated sums, compensated
  // again; NaN in a sampled run (it lacks rows or keys).
  const int64_t width = p_.RelBiasWidth();
  Tensor t = Tensor::Zeros(DType::kF64, p_.RelBiasShape());
  double* out = t.data<double>();
  for (int64_t h = 0; h < p_.heads_q; ++h) {
    for (int64_t d = 0; d < width; ++d) {
      double sum = 0, comp = 0, mass = 0;
      int64_t terms = 0;
      for (int64_t b = 0; b < p_.batch; ++b) {
        const size_t e = static_cast<size_t>((b * p_.heads_q + h) * width + d);
        TwoSumAdd(sum, comp, rel_sums_.sum[e]);
        TwoSumAdd(sum, comp, rel_sums_.comp[e]);
        mass += rel_sums_.mass[e];
        terms += rel_sums_.terms[e];
      }
      out[h * width + d] = Sampled() ? std::numeric_limits<double>::quiet_NaN() : sum + comp;
      stats_.rel_bias_mass_max = std::max(stats_.rel_bias_mass_max, mass);
      stats_.rel_bias_terms = std::max(stats_.rel_bias_terms, terms + p_.batch);
    }
  }
  rel_sums_ = {};
  return t;
}

}  // namespace attest::double_oracle
