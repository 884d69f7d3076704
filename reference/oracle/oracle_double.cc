// The float64 oracle (oracle.h; docs/design.md "Oracle"): FlashAttention-style tiling on the CPU
// (Dao, FlashAttention-2, arXiv 2307.08691, Alg. 1 and 2) with exactness-first choices.
//
// Tiles: query tiles of tile_q rows and key tiles of tile_k keys, both aligned to multiples
// of their size from the start of each sequence; a (query tile, key tile) pair is computed
// only if some row may see some key of it (tile_walk.h), and always by the same product
// call on the same operands, so the forward's scores and the backward's are bitwise equal.
//
// Forward, work items (batch, query head, query tile): for each key tile in ascending order,
// S = scale Q K^T, then per row the score transform and the mask (-inf), the online
// softmax (running max m; when it grows, O and the denominator l are rescaled by
// exp(m_old - m_new)), P = exp(s - m), l += row sum of P with compensation (Sum2), and
// O += P V. At the end o = O / l and lse = m + log l. An online softmax rather than
// two passes: one Q K^T instead of two, and the rescalings add at most u (|dm| + 1) each,
// which ErrorBound accounts for. Memory per worker: a tile_q x tile_k tile and O.
//
// Backward, work items (batch, query head): for each query tile in ascending order, the
// forward above for that tile (its o, lse, never a kernel's), delta = rowsum(dO o) of its
// rows by compensated dot products; then for each key tile that the tile's rows may see, in
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

namespace attest {
namespace {

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
        in_(CheckInputs(p, q, k, v, dout)),
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
  // A sampled backward with flagged keys: every query tile's forward runs (for lse, delta).
  bool all_query_tiles_ = false;
  bool in_backward_ = false;  // RunForward called by RunBackward
};

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
    st.sum_len_k = std::max(st.sum_len_k, max_tk + sc.tiles[ur]);
    if (sc.m[ur] == kNegInf) {
      EmptyRow(orow, dv, &lse);
      ++st.empty_rows;
      continue;
    }
    const double l = sc.l[ur] + sc.comp[ur];
    const double* acc = &sc.acc_v[static_cast<size_t>(r * dv)];
    for (int64_t d = 0; d < dv; ++d) orow[d] = acc[d] / l;
    lse = sc.m[ur] + std::log(l);
    st.lse_abs_max = std::max(st.lse_abs_max, std::abs(lse));
  }
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
  out.lse = RowsToLse(lse_rows_);
  out.delta = RowsToLse(delta_rows_);
  out.stats = stats_;
  return out;
}

}  // namespace

OracleTiles AutoTiles(const Problem&) { return OracleTiles{128, 128}; }

template <>
ForwardOut Forward<double>(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const OracleOptions& options) {
  return DoubleOracle(p, q, k, v, nullptr, options).RunForward();
}

template <>
BackwardOut Backward<double>(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& dout, const OracleOptions& options) {
  return DoubleOracle(p, q, k, v, &dout, options).RunBackward();
}

}  // namespace attest
