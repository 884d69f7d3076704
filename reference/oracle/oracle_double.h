// The float64 oracle's state and tile helpers (DoubleOracle), shared by its forward
// (oracle_double.cc) and its backward (oracle_double_backward.cc). Not part of the public API;
// its includers are compiled without FMA contraction (CMakeLists.txt), as its inline code assumes.
//
// The float64 oracle (oracle.h; docs/design.md "Oracle"): FlashAttention-style tiling on the CPU
// (Dao, FlashAttention-2, arXiv 2307.08691, Alg. 1 and 2) with exactness-first choices.
//
// Tiles: query tiles of tile_q rows and key tiles of tile_k keys, both aligned to multiples
// of their size from the start of each sequence; a (query tile, key tile) pair is computed
// only if some row may see some key of it (tile_walk.h), and always by the same product
// call on the same operands, so the forward's scores and the backward's are bitwise equal.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_exp.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/tile_walk.h"

namespace attest::double_oracle {

using namespace oracle_internal;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// An uninitialised array of doubles for the multi-MiB buffers (operand panels, score strips,
// dk/dv accumulators): a vector would zero what is about to be overwritten.
// (Transparent huge pages for them, via madvise, were tried: on this VM the cost of faulting
// in fresh 2 MiB pages exceeded the TLB savings; docs/bench-oracle.md.)
class BigArray {
 public:
  size_t size() const { return size_; }
  double* data() { return data_.get(); }
  const double* data() const { return data_.get(); }
  double& operator[](size_t e) { return data_[e]; }
  // At least n elements; contents undefined after a reallocation.
  void Reserve(size_t n) {
    if (n <= size_) return;
    const size_t bytes = (n * sizeof(double) + 63) / 64 * 64;
    data_.reset(static_cast<double*>(std::aligned_alloc(64, bytes)));
    if (!data_) throw std::bad_alloc();
    size_ = n;
  }
  // At least n elements, the first n of them 0.
  void AssignZeros(size_t n) {
    Reserve(n);
    if (n > 0) std::memset(data_.get(), 0, n * sizeof(double));
  }

 private:
  struct Free {
    void operator()(double* p) const { std::free(p); }
  };
  std::unique_ptr<double[], Free> data_;
  size_t size_ = 0;
};

struct Tile {
  int64_t b = 0, h = 0, g = 0;
  int64_t i0 = 0, tq = 0;  // query rows [i0, i0 + tq) of the sequence
  int64_t j0 = 0, tk = 0;  // keys [j0, j0 + tk)
  // A gathered tile (the sampled forward, DoubleOracle::GatheredForward): its tq query rows
  // are rows[0, tq) of the sequence, ascending, instead of [i0, i0 + tq).
  const int64_t* rows = nullptr;
  int64_t Row(int64_t r) const { return rows != nullptr ? rows[r] : i0 + r; }
};

// Compensated summation: Knuth's TwoSum (branch-free, unlike Neumaier's comparison) feeds
// each addition's exact error into a running compensation (Ogita-Rump-Oishi Sum2; Higham
// §4.3): |error| <= u |sum| + gamma_{n-1}^2 sum |x_i|, as if summed in twice the precision.
inline void TwoSumAdd(double& sum, double& comp, double x) {
  const double t = sum + x;
  const double bp = t - sum;
  comp += (sum - (t - bp)) + (x - bp);
  sum = t;
}

class DoubleOracle {
 public:
  DoubleOracle(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor* dout, const OracleOptions& options)
      : p_(p),
        in_(CheckInputs(p, q, k, v, dout, options.sink, options.rel_bias)),
        norms_(ComputeNorms(p, in_)),
        masks_(MaskViews(p)),
        tile_q_(options.tile_q > 0 ? options.tile_q : AutoTiles(p).q),
        tile_k_(options.tile_k > 0 ? options.tile_k : AutoTiles(p).k),
        options_(options) {
    walks_.reserve(masks_.size());
    for (const MaskView& mask : masks_) walks_.emplace_back(mask, tile_k_);
    CheckSample(options.query_rows, p.TotalQ(), "query_rows", "query");
    CheckSample(options.key_rows, p.TotalK(), "key_rows", "key");
    stats_.unit_roundoff = std::ldexp(1.0, -53);
    stats_.scale = p.EffectiveScale();
    stats_.softcap = p.softcap;
    stats_.head_dim = p.head_dim;
    stats_.head_dim_v = p.head_dim_v;
    stats_.v_abs_max = norms_.v_abs;
    stats_.v_norm_max = norms_.v_norm;
    stats_.k_abs_max = norms_.k_abs;
    stats_.sink_abs_max = SinkAbsMax(in_);
    stats_.rel_bias_abs_max = RelBiasAbsMax(in_);
  }

  ForwardOut RunForward();
  BackwardOut RunBackward();

 private:
  struct Scratch {
    // s: P of one tile (tq x tk); dp: dP, then dS; acc_v: the forward's O rows; m, l, comp:
    // online-softmax row state; knorm: ||k_j|| of one key tile.
    std::vector<double> s, dp, acc_v, m, l, comp, knorm;
    std::vector<double> q_gather;  // a gathered tile's Q rows (tq x D, contiguous)
    // The transformed scores (and with softcap tanh(s / cap)) of one query tile: every key
    // tile's block (tq x tk at offset tq j0) when the backward reuses them, else one tile.
    BigArray strip, strip_th;
    // Backward accumulators, contiguous (the outputs' rows are H D apart): dQ of one query
    // tile (tq x D); with MHA, dK and dV of the item's head ([Sk, D], [Sk, Dv]).
    std::vector<double> acc_q;
    BigArray acc_k, acc_kv;
    std::vector<uint8_t> visible;  // [row r][key tile]: row r sees some key of the tile
    // Operand panels (PackKv, PackQdo) and which (b * Hkv + g) the kv ones hold.
    BigArray kt, vt, k_panels, v_panels, q_panels, do_panels;
    Panels k_rows, v_rows, q_rows, do_rows;
    int64_t packed_kv = -1;
    bool packed_kv_backward = false;
    std::vector<int64_t> tiles, keys, chain, chain_tq;
  };

  // Sampled rows (OracleOptions::query_rows, key_rows).
  static void CheckSample(const std::vector<uint8_t>* flags, int64_t rows, const char* field,
                          const char* what) {
    if (flags != nullptr && static_cast<int64_t>(flags->size()) != rows) {
      throw std::invalid_argument("OracleOptions::" + std::string(field) + ": " +
                                  std::to_string(flags->size()) + " flags for " +
                                  std::to_string(rows) + " " + what + " rows");
    }
  }
  bool Sampled() const { return options_.query_rows != nullptr || options_.key_rows != nullptr; }
  static bool AnyFlag(const std::vector<uint8_t>* flags, int64_t begin, int64_t n) {
    if (flags == nullptr) return false;
    for (int64_t r = begin; r < begin + n; ++r) {
      if ((*flags)[static_cast<size_t>(r)] != 0) return true;
    }
    return false;
  }
  // Whether query rows [i0, i0 + tq) of seq get o, lse, dq and delta; keys [j0, j0 + tk) dk
  // and dv (everything, unless sampled).
  bool QueryTileWanted(const Sequence& seq, int64_t i0, int64_t tq) const {
    return !Sampled() || AnyFlag(options_.query_rows, seq.q_begin + i0, tq);
  }
  bool KeyTileWanted(const Sequence& seq, int64_t j0, int64_t tk) const {
    return !Sampled() || AnyFlag(options_.key_rows, seq.k_begin + j0, tk);
  }
  // NaN in the rows a sampled run leaves out: o, lse_rows_ (and with the backward dq,
  // delta_rows_, dk, dv).
  void BlankUnsampled(double* o, double* dq, double* dk, double* dv);
  // The forward alone on sampled query rows computes only the flagged rows: per sequence,
  // they are gathered, ascending, into tiles of up to tile_q rows (GatheredRows), which run
  // as ForwardTile runs a tile of consecutive rows. Each row's result is bitwise the same
  // (GemmPanels gives every element the same rounding sequence whatever rows share its call,
  // oracle_gemm.h; a row's softmax state sees only the key tiles where it has visible keys, in
  // ascending order, as in its own tile), at a cost in proportion to the rows flagged rather
  // than to the tiles holding them (every tile holds a sampled boundary row, verify/metrics/sample.h).
  bool GatheredForward() const {
    return options_.query_rows != nullptr && !in_backward_;
  }
  std::vector<int64_t> GatheredRows(const Sequence& seq) const {
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < seq.q_len; ++i) {
      if ((*options_.query_rows)[static_cast<size_t>(seq.q_begin + i)] != 0) rows.push_back(i);
    }
    return rows;
  }

  // Rows of the [rows, H, width] inputs; consecutive rows of a head are ld() apart.
  const double* QRow(int64_t row, int64_t h) const {
    return in_.Q() + RowOffset(row, p_.heads_q, h, p_.head_dim);
  }
  const double* KRow(int64_t row, int64_t g) const {
    return in_.K() + RowOffset(row, p_.heads_kv, g, p_.head_dim);
  }
  const double* VRow(int64_t row, int64_t g) const {
    return in_.V() + RowOffset(row, p_.heads_kv, g, p_.head_dim_v);
  }
  const double* DoRow(int64_t row, int64_t h) const {
    return in_.DO() + RowOffset(row, p_.heads_q, h, p_.head_dim_v);
  }
  int64_t QLd() const { return p_.heads_q * p_.head_dim; }
  int64_t KLd() const { return p_.heads_kv * p_.head_dim; }
  int64_t VLd() const { return p_.heads_kv * p_.head_dim_v; }
  int64_t DoLd() const { return p_.heads_q * p_.head_dim_v; }

  // The B operands of the tile products as panels (oracle_gemm.h), packed once per worker
  // and (sequence, head) rather than per tile: K^T and V^T of every key tile (tile-relative
  // panels: a key tile's columns start a panel), K and V of the sequence (rows = keys), Q
  // and dO of the sequence (rows = queries). Extra memory per worker: ~6 sequence x head
  // operands, O(S D), never O(Sq Sk).
  int64_t KeyTileBlock(int64_t width) const { return PanelCount(tile_k_) * width * kPanelWidth; }
  Panels KeyTilePanels(const BigArray& tiles, int64_t width, int64_t kt) const {
    return {tiles.data() + kt * KeyTileBlock(width), width * kPanelWidth};
  }
  void PackKeyTiles(const double* x, int64_t ld, int64_t width, const Sequence& seq,
                    BigArray& out) const {
    const int64_t key_tiles = KeyTiles(seq);
    out.Reserve(static_cast<size_t>(std::max<int64_t>(1, key_tiles * KeyTileBlock(width))));
    for (int64_t kt = 0; kt < key_tiles; ++kt) {
      const int64_t j0 = kt * tile_k_, tk = std::min(tile_k_, seq.k_len - j0);
      PackPanels(x + j0 * ld, width, tk, 1, ld, out.data() + kt * KeyTileBlock(width));
    }
  }
  static Panels PackRows(const double* x, int64_t ld, int64_t rows, int64_t width,
                         BigArray& out) {
    out.Reserve(static_cast<size_t>(std::max<int64_t>(1, PanelCount(width) * rows * kPanelWidth)));
    PackPanels(x, rows, width, ld, 1, out.data());
    return {out.data(), rows * kPanelWidth};
  }
  // Packs what the forward of (b, kv head g) needs (K^T tiles, V rows), and with `backward`
  // also V^T tiles and K rows; kept while the worker stays on the same (b, g).
  void PackKv(int64_t b, int64_t g, bool backward, Scratch& sc) const {
    const int64_t key = b * p_.heads_kv + g;
    if (sc.packed_kv == key && (sc.packed_kv_backward || !backward)) return;
    const Sequence& seq = masks_[static_cast<size_t>(b)].sequence();
    PackKeyTiles(KRow(seq.k_begin, g), KLd(), p_.head_dim, seq, sc.kt);
    sc.v_rows = PackRows(VRow(seq.k_begin, g), VLd(), seq.k_len, p_.head_dim_v, sc.v_panels);
    if (backward) {
      PackKeyTiles(VRow(seq.k_begin, g), VLd(), p_.head_dim_v, seq, sc.vt);
      sc.k_rows = PackRows(KRow(seq.k_begin, g), KLd(), seq.k_len, p_.head_dim, sc.k_panels);
    }
    sc.packed_kv = key;
    sc.packed_kv_backward = backward;
  }
  // Q and dO rows of (b, query head h), for dK and dV.
  void PackQdo(int64_t b, int64_t h, Scratch& sc) const {
    const Sequence& seq = masks_[static_cast<size_t>(b)].sequence();
    sc.q_rows = PackRows(QRow(seq.q_begin, h), QLd(), seq.q_len, p_.head_dim, sc.q_panels);
    sc.do_rows =
        PackRows(DoRow(seq.q_begin, h), DoLd(), seq.q_len, p_.head_dim_v, sc.do_panels);
  }
  size_t RowIndex(int64_t row, int64_t h) const {
    return static_cast<size_t>(row * p_.heads_q + h);
  }

  // ||k_j|| of the tile's keys, contiguous (for TransformRow's statistics).
  void GatherKeyNorms(const Tile& t, const Sequence& seq, Scratch& sc) const {
    sc.knorm.resize(static_cast<size_t>(t.tk));
    for (int64_t c = 0; c < t.tk; ++c) {
      sc.knorm[static_cast<size_t>(c)] =
          norms_.k[static_cast<size_t>((seq.k_begin + t.j0 + c) * p_.heads_kv + t.g)];
    }
  }

  // S = scale Q_tile K_tile^T into s (tq x tk, leading dimension tk). Needs PackKv.
  // A gathered tile's Q rows are in sc.q_gather (ForwardTile fills it).
  void Scores(const Tile& t, const Sequence& seq, const Scratch& sc, double* s) const {
    const bool gathered = t.rows != nullptr;
    GemmPanels(t.tq, t.tk, p_.head_dim,
               gathered ? sc.q_gather.data() : QRow(seq.q_begin + t.i0, t.h),
               gathered ? p_.head_dim : QLd(), 1,
               KeyTilePanels(sc.kt, p_.head_dim, t.j0 / tile_k_), stats_.scale,
               /*accumulate=*/false, s, t.tk);
  }
  int64_t KeyTiles(const Sequence& seq) const { return (seq.k_len + tile_k_ - 1) / tile_k_; }
  // Whether the backward of a query tile of `seq` reuses the scores of its forward.
  bool KeepScores(const Sequence& seq) const {
    const int64_t per_score = static_cast<int64_t>(sizeof(double)) * (p_.softcap > 0 ? 2 : 1);
    return options_.score_cache_bytes > 0 &&
           seq.k_len <= options_.score_cache_bytes / per_score / tile_q_;
  }
  // The block of a query tile's score strip that holds key tile t (see Scratch::strip).
  static double* StripBlock(BigArray& strip, const Tile& t, bool keep) {
    return strip.data() + (keep ? t.tq * t.j0 : 0);
  }

  // Row r of the score tile, transformed and masked (TileWalk::TransformRow; with softcap,
  // tanh(s / cap) goes to th for the backward's derivative). Returns the row max (-inf if
  // nothing is visible) and counts the visible entries into *count; the row's score
  // magnitude goes into st.score_abs_max. Needs GatherKeyNorms for the tile.
  double TransformRow(const Tile& t, const Scratch& sc, int64_t r, double* s, double* th,
                      int64_t* count, OracleStats& st) const {
    const int64_t i = t.Row(r);
    const TileWalk& walk = walks_[static_cast<size_t>(t.b)];
    const IndexRange span =
        walk.TransformRow(i, t.j0, t.tk, p_.softcap, AlibiSlope(p_, t.h), s, th);
    const int64_t lo = span.begin, hi = span.end;
    *count = 0;
    if (lo >= hi) return kNegInf;
    if (in_.HasRelBias()) {
      // s_ij += rel_bias[h, i - j + Sk - 1], last (masked entries stay -inf).
      const double* bias = RelBiasDiagonal(t.h, i - t.j0);
      for (int64_t c = lo; c < hi; ++c) s[c] += bias[-c];
    }
    double mx = kNegInf, nk = 0;
    const int64_t n = RowStats(s + lo, sc.knorm.data() + lo, hi - lo, &mx, &nk);
    *count = n;
    if (n > 0) {
      // a = |scale| ||q_i|| max ||k_j|| + |slope| max |dist| over the visible range.
      const Sequence& seq = walk.mask().sequence();
      const int64_t diag = i + walk.mask().offset();
      const double nq = norms_.q[RowIndex(seq.q_begin + i, t.h)];
      const double dist = static_cast<double>(
          std::max(std::abs(diag - (t.j0 + lo)), std::abs(diag - (t.j0 + hi - 1))));
      st.score_abs_max = std::max(st.score_abs_max,
                                  std::abs(stats_.scale) * nq * nk +
                                      std::abs(AlibiSlope(p_, t.h)) * dist);
    }
    return mx;
  }

  // The forward of query tile `item` (keys: all its rows may see): o rows, lse_rows_, and
  // sc.visible; the transformed scores stay in sc.strip if `keep` (KeepScores).
  void ForwardTile(const Tile& item, Scratch& sc, OracleStats& st, double* o, bool keep);
  // Forward and backward of every query tile of (b, h), in ascending order; with
  // `forward_done` only the backward (o, lse_rows_ and delta_rows_ given; scores recomputed).
  void BackwardItem(int64_t b, int64_t h, bool forward_done, Scratch& sc, OracleStats& st,
                    double* o, double* dq, double* dk, double* dv, double* mass, int64_t* seen);
  // delta_i = dO_i . o_i by Dot2 (Ogita-Rump-Oishi: exact products via FMA, compensated
  // sum); 0 on empty rows (o = 0 there).
  double Delta(const double* dorow, const double* orow) const {
    double sum = 0, comp = 0;
    for (int64_t d = 0; d < p_.head_dim_v; ++d) {
      const double prod = dorow[d] * orow[d];
      TwoSumAdd(sum, comp, prod);
      comp += std::fma(dorow[d], orow[d], -prod);
    }
    return sum + comp;
  }
  // A row's end: o = acc / l and lse = m + log l, the sink folded in first
  // (oracle_double.cc).
  void FinishRow(int64_t h, double m, double l, const double* acc, double* orow,
                 double* lse) const;
  // dsink from lse_rows_ and delta_rows_ (oracle_double_backward.cc), and its statistics.
  Tensor Dsink();
  // &rel_bias[h, d + Sk - 1]: the bias of the pair (i, j) with i - j = d (index [-c] for the
  // pair (i, j + c)).
  const double* RelBiasDiagonal(int64_t h, int64_t d) const {
    return in_.rel_bias.data() + h * p_.RelBiasWidth() + d + p_.seqlen_k - 1;
  }
  // dS of row r of a tile (tk entries; P in prow says which count) into the (b, h) item's
  // drel_bias sums, rel_sums_ (oracle_double_backward.cc).
  void AccumulateRelBias(const Tile& t, int64_t r, const double* prow, const double* dsrow);
  // drel_bias from rel_sums_ (oracle_double_backward.cc), and its statistics.
  Tensor DrelBias();
  // lse_rows_ (or delta_rows_) into a tensor of the problem's lse shape.
  Tensor RowsToLse(const std::vector<double>& rows) const;

  const Problem& p_;
  Inputs in_;
  Norms norms_;
  std::vector<MaskView> masks_;
  std::vector<TileWalk> walks_;  // one per batch entry, over masks_
  int64_t tile_q_, tile_k_;
  OracleOptions options_;
  OracleStats stats_;
  std::vector<double> lse_rows_, delta_rows_;  // [rows, Hq]
  // drel_bias per (b, h) item, [B, Hq, W]: compensated sums of dS, sums of P, term counts
  // (each item writes its own slice, so the result does not depend on the threads).
  struct RelSums {
    std::vector<double> sum, comp, mass;
    std::vector<int64_t> terms;
  } rel_sums_;
  // A sampled backward with flagged keys: every query tile's forward runs (for lse, delta).
  bool all_query_tiles_ = false;
  bool in_backward_ = false;  // RunForward called by RunBackward
};

}  // namespace attest::double_oracle
