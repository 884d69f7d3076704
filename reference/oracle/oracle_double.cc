// The float64 oracle (oracle.h; DESIGN.md "Oracle"): FlashAttention-style tiling on the CPU
// (Dao, FlashAttention-2, arXiv 2307.08691, Alg. 1 and 2) with exactness-first choices.
//
// Tiles: query tiles of tile_q rows and key tiles of tile_k keys, both aligned to multiples
// of their size from the start of each sequence; a (query tile, key tile) pair is computed
// only if some row may see some key of it (mask.h KeyBounds), and always by the same dgemm
// call on the same operands, so the forward's scores and the backward's are bitwise equal.
//
// Forward, work items (batch, query head, query tile): for each key tile in ascending order,
// S = scale Q K^T (dgemm), then per row the score transform and the mask (-inf), the online
// softmax (running max m; when it grows, O and the denominator l are rescaled by
// exp(m_old - m_new)), P = exp(s - m), l += row sum of P with compensation (Sum2), and
// O += P V (dgemm). At the end o = O / l and lse = m + log l. An online softmax rather than
// two passes: one Q K^T instead of two, and the rescalings add at most u (|dm| + 1) each,
// which ErrorBound accounts for. Memory per worker: a tile_q x tile_k tile and O.
//
// Backward, work items (batch, query head) (FA2 Alg. 2 loop order): the forward above
// first (its o, lse, never a kernel's), delta = rowsum(dO o) by compensated dot products;
// then for each key tile in ascending order and each query tile that may see it, in
// ascending order: S, P = exp(s - lse), dP = dO V^T, dS = P (dP - delta) [(1 - tanh^2) with
// softcap], dV_tile += P^T dO, dK_tile += dS^T Q, dQ_rows += dS K_tile (dgemm each). dq rows
// belong to one item, so they accumulate in place over key tiles in a fixed order; dk/dv of a
// kv head shared by several query heads (GQA) go to per-query-head partials that are summed
// in ascending head order at the end. Nothing depends on which thread ran what: results are
// bitwise independent of the thread count. Flops: 4 + 10 = 14 Sq Sk D (D = Dv); extra
// memory: one [Hq, total_k, D + Dv] partial when Hq > Hkv, and head-major copies of the
// inputs (below).
//
// Speed (docs/bench-oracle.md has the profile): the dgemm calls are ~60 % of the time, so
// what is around them is kept small. Tiles default to AutoTiles (oracle.h): few, large
// calls amortise OpenBLAS's packing of both operands on every call. With several heads the
// inputs are read from head-major copies, so a tile's rows are contiguous for the packing.
// Elementwise work is one fused pass per row (oracle_exp.h: exp <= 1 ulp instead of glibc's
// scalar exp, lane-compensated sums, branch-free row statistics), vectorised per ISA.
//
// BLAS threading: the workers call single-threaded dgemm. OpenBLAS 0.3.21 (Debian 12) has
// only the process-wide openblas_set_num_threads (per-thread control arrived in 0.3.27 as
// openblas_set_num_threads_local), so a scope guard sets 1 for the duration of a call and
// restores the caller's setting when the last concurrent call ends.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_exp.h"
#include "reference/oracle/oracle_internal.h"

// Weak so that a non-OpenBLAS cblas still links (the guard then does nothing).
extern "C" {
void openblas_set_num_threads(int) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace attest {
namespace {

using namespace oracle_internal;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

class BlasSingleThreadScope {
 public:
  BlasSingleThreadScope() {
    std::lock_guard<std::mutex> lock(State().mutex);
    if (State().depth++ == 0 && openblas_get_num_threads && openblas_set_num_threads) {
      State().saved = openblas_get_num_threads();
      if (State().saved != 1) openblas_set_num_threads(1);
    }
  }
  ~BlasSingleThreadScope() {
    std::lock_guard<std::mutex> lock(State().mutex);
    if (--State().depth == 0 && openblas_set_num_threads && State().saved != 1) {
      openblas_set_num_threads(State().saved);
    }
  }
  BlasSingleThreadScope(const BlasSingleThreadScope&) = delete;
  BlasSingleThreadScope& operator=(const BlasSingleThreadScope&) = delete;

 private:
  struct Shared {
    std::mutex mutex;
    int depth = 0;
    int saved = 1;
  };
  static Shared& State() {
    static Shared shared;  // the one piece of process state: mirrors OpenBLAS's own
    return shared;
  }
};

// C = alpha op(A) op(B) + beta C, row-major.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

struct Tile {
  int64_t b = 0, h = 0, g = 0;
  int64_t i0 = 0, tq = 0;  // query rows [i0, i0 + tq) of the sequence
  int64_t j0 = 0, tk = 0;  // keys [j0, j0 + tk)
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
        q_(HeadMajor(in_.Q(), p.TotalQ(), p.heads_q, p.head_dim)),
        k_(HeadMajor(in_.K(), p.TotalK(), p.heads_kv, p.head_dim)),
        v_(HeadMajor(in_.V(), p.TotalK(), p.heads_kv, p.head_dim_v)),
        do_(HeadMajor(dout ? in_.DO() : nullptr, p.TotalQ(), p.heads_q, p.head_dim_v)),
        norms_(ComputeNorms(p, in_)),
        masks_(MaskViews(p)),
        tile_q_(options.tile_q > 0 ? options.tile_q : AutoTiles(p).q),
        tile_k_(options.tile_k > 0 ? options.tile_k : AutoTiles(p).k),
        options_(options) {
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
    std::vector<double> s, dp, th, acc_k, acc_v, m, l, comp, knorm;
    std::vector<int64_t> tiles, keys, rlo, rhi;
  };

  // An input as the dgemm calls read it: row `row` of head `h` at base + h head_stride +
  // row ld. With several heads the oracle reads a head-major copy ([H, rows, width], ld =
  // width) rather than the [rows, H, width] input (ld = H width): a tile's rows are then
  // contiguous, which OpenBLAS packs ~1.1x faster overall (fewer TLB misses, prefetchable)
  // at the price of one copy of the inputs, made only up to kHeadMajorMaxBytes per input
  // (the oracle must not double the memory of a huge problem). OpenBLAS packs a tile into the
  // same buffer layout whatever its leading dimension, so the results are the same (checked
  // bitwise against strided reads on MHA, GQA, causal and Dv != D problems).
  struct Operand {
    const double* base = nullptr;
    int64_t head_stride = 0, ld = 0;
    std::vector<double> copy;
    const double* Row(int64_t row, int64_t h) const { return base + h * head_stride + row * ld; }
  };
  static Operand HeadMajor(const double* x, int64_t rows, int64_t heads, int64_t width) {
    Operand op;
    constexpr int64_t kHeadMajorMaxBytes = int64_t{512} << 20;
    if (heads == 1 || x == nullptr ||
        rows * heads * width > kHeadMajorMaxBytes / static_cast<int64_t>(sizeof(double))) {
      op.base = x;
      op.head_stride = width;
      op.ld = heads * width;
      return op;
    }
    op.copy.resize(static_cast<size_t>(rows * heads * width));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t row = 0; row < rows; ++row) {
        const double* src = x + RowOffset(row, heads, h, width);
        std::copy(src, src + width, op.copy.data() + (h * rows + row) * width);
      }
    }
    op.base = op.copy.data();
    op.head_stride = rows * width;
    op.ld = width;
    return op;
  }

  const double* QRow(int64_t row, int64_t h) const { return q_.Row(row, h); }
  const double* KRow(int64_t row, int64_t g) const { return k_.Row(row, g); }
  const double* VRow(int64_t row, int64_t g) const { return v_.Row(row, g); }
  const double* DoRow(int64_t row, int64_t h) const { return do_.Row(row, h); }
  size_t RowIndex(int64_t row, int64_t h) const {
    return static_cast<size_t>(row * p_.heads_q + h);
  }

  // Key bounds [rlo, rhi) of every query row of a sequence (mask.h KeyBounds).
  static void AllRowBounds(const MaskView& mask, Scratch& sc) {
    sc.rlo.resize(static_cast<size_t>(mask.q_len()));
    sc.rhi.resize(static_cast<size_t>(mask.q_len()));
    for (int64_t i = 0; i < mask.q_len(); ++i) {
      const auto [lo, hi] = mask.KeyBounds(i);
      sc.rlo[static_cast<size_t>(i)] = lo;
      sc.rhi[static_cast<size_t>(i)] = hi < lo ? lo : hi;
    }
  }
  // ||k_j|| of the tile's keys, contiguous (for TransformRow's statistics).
  void GatherKeyNorms(const Tile& t, const Sequence& seq, Scratch& sc) const {
    sc.knorm.resize(static_cast<size_t>(t.tk));
    for (int64_t c = 0; c < t.tk; ++c) {
      sc.knorm[static_cast<size_t>(c)] =
          norms_.k[static_cast<size_t>((seq.k_begin + t.j0 + c) * p_.heads_kv + t.g)];
    }
  }

  // Whether some row of [i0, i0 + tq) may see some key of [j0, j0 + tk).
  static bool Overlaps(const Scratch& sc, int64_t i0, int64_t tq, int64_t j0, int64_t tk) {
    for (int64_t i = i0; i < i0 + tq; ++i) {
      const int64_t lo = sc.rlo[static_cast<size_t>(i)], hi = sc.rhi[static_cast<size_t>(i)];
      if (lo < hi && lo < j0 + tk && hi > j0) return true;
    }
    return false;
  }

  // S = scale Q_tile K_tile^T into sc.s (tq x tk, leading dimension tk).
  void Scores(const Tile& t, const Sequence& seq, Scratch& sc) const {
    Gemm(false, true, t.tq, t.tk, p_.head_dim, stats_.scale, QRow(seq.q_begin + t.i0, t.h), q_.ld,
         KRow(seq.k_begin + t.j0, t.g), k_.ld, 0.0,
         sc.s.data(), t.tk);
  }

  // Row r of the score tile: score transform (mask.h TransformScore: softcap, then ALiBi) on
  // visible entries, -inf on masked ones. With softcap, tanh(s / cap) goes to th (for the
  // backward's derivative). Returns the row max (-inf if nothing is visible) and counts the
  // visible entries into *count; the row's score magnitude goes into st.score_abs_max.
  // Needs GatherKeyNorms for the tile.
  double TransformRow(const Tile& t, const MaskView& mask, const Scratch& sc, int64_t r, double* s,
                      double* th, int64_t* count, OracleStats& st) const {
    const int64_t i = t.i0 + r;
    const Sequence& seq = mask.sequence();
    const int64_t lo = std::clamp<int64_t>(sc.rlo[static_cast<size_t>(i)] - t.j0, 0, t.tk);
    const int64_t hi = std::clamp<int64_t>(sc.rhi[static_cast<size_t>(i)] - t.j0, lo, t.tk);
    for (int64_t c = 0; c < lo; ++c) s[c] = kNegInf;
    for (int64_t c = hi; c < t.tk; ++c) s[c] = kNegInf;
    *count = 0;
    if (lo >= hi) return kNegInf;
    const double cap = p_.softcap;
    const double slope = AlibiSlope(p_, t.h);
    const int64_t diag = i + mask.offset();
    if (cap > 0) {
      for (int64_t c = lo; c < hi; ++c) {
        th[c] = std::tanh(s[c] / cap);
        s[c] = cap * th[c];
      }
    }
    if (slope != 0) {
      for (int64_t c = lo; c < hi; ++c) {
        const int64_t dist = std::abs(diag - (t.j0 + c));
        s[c] -= slope * static_cast<double>(dist);
      }
    }
    if (!mask.interval_only()) {
      for (int64_t c = lo; c < hi; ++c) {
        if (!mask.Visible(i, t.j0 + c)) s[c] = kNegInf;
      }
    }
    double mx = kNegInf, nk = 0;
    const int64_t n = RowStats(s + lo, sc.knorm.data() + lo, hi - lo, &mx, &nk);
    *count = n;
    if (n > 0) {
      // a = |scale| ||q_i|| max ||k_j|| + |slope| max |dist| over the visible range.
      const double nq = norms_.q[RowIndex(seq.q_begin + i, t.h)];
      const double dist = static_cast<double>(
          std::max(std::abs(diag - (t.j0 + lo)), std::abs(diag - (t.j0 + hi - 1))));
      st.score_abs_max =
          std::max(st.score_abs_max, std::abs(stats_.scale) * nq * nk + std::abs(slope) * dist);
    }
    return mx;
  }

  void ForwardItem(const Tile& item, Scratch& sc, OracleStats& st, double* o);
  void BackwardItem(int64_t b, int64_t h, Scratch& sc, OracleStats& st, double* dq, double* dk,
                    double* dv, double* mass, int64_t* seen);

  const Problem& p_;
  Inputs in_;
  Operand q_, k_, v_, do_;
  Norms norms_;
  std::vector<MaskView> masks_;
  int64_t tile_q_, tile_k_;
  OracleOptions options_;
  OracleStats stats_;
  std::vector<double> lse_rows_, delta_rows_;  // [rows, Hq]
};

void DoubleOracle::ForwardItem(const Tile& item, Scratch& sc, OracleStats& st, double* o) {
  const MaskView& mask = masks_[static_cast<size_t>(item.b)];
  const Sequence& seq = mask.sequence();
  const int64_t tq = item.tq, dv = p_.head_dim_v;
  AllRowBounds(mask, sc);
  int64_t klo = std::numeric_limits<int64_t>::max(), khi = 0;
  for (int64_t i = item.i0; i < item.i0 + tq; ++i) {
    const int64_t lo = sc.rlo[static_cast<size_t>(i)], hi = sc.rhi[static_cast<size_t>(i)];
    if (lo < hi) klo = std::min(klo, lo), khi = std::max(khi, hi);
  }
  sc.acc_v.assign(static_cast<size_t>(tq * dv), 0.0);
  sc.m.assign(static_cast<size_t>(tq), kNegInf);
  sc.l.assign(static_cast<size_t>(tq), 0.0);
  sc.comp.assign(static_cast<size_t>(tq), 0.0);
  sc.tiles.assign(static_cast<size_t>(tq), 0);
  sc.keys.assign(static_cast<size_t>(tq), 0);
  sc.s.resize(static_cast<size_t>(tq * tile_k_));
  if (p_.softcap > 0) sc.th.resize(static_cast<size_t>(tq * tile_k_));
  int64_t max_tk = 0;
  for (int64_t kt = klo / tile_k_; klo < khi && kt * tile_k_ < khi; ++kt) {
    Tile t = item;
    t.j0 = kt * tile_k_;
    t.tk = std::min(tile_k_, seq.k_len - t.j0);
    if (!Overlaps(sc, t.i0, tq, t.j0, t.tk)) continue;
    Scores(t, seq, sc);
    GatherKeyNorms(t, seq, sc);
    bool any = false;
    for (int64_t r = 0; r < tq; ++r) {
      const size_t ur = static_cast<size_t>(r);
      double* srow = &sc.s[static_cast<size_t>(r * t.tk)];
      int64_t count = 0;
      const double mx = TransformRow(
          t, mask, sc, r, srow, p_.softcap > 0 ? &sc.th[static_cast<size_t>(r * t.tk)] : nullptr,
          &count, st);
      if (count == 0) {
        std::fill(srow, srow + t.tk, 0.0);
        continue;
      }
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
      const CompensatedSum tile_sum = ExpShiftSum(srow, t.tk, sc.m[ur]);
      double sum = sc.l[ur], comp = sc.comp[ur] + tile_sum.comp;
      TwoSumAdd(sum, comp, tile_sum.sum);
      sc.l[ur] = sum;
      sc.comp[ur] = comp;
    }
    if (!any) continue;
    max_tk = std::max(max_tk, t.tk);
    Gemm(false, false, tq, dv, t.tk, 1.0, sc.s.data(), t.tk, VRow(seq.k_begin + t.j0, t.g), v_.ld,
         1.0, sc.acc_v.data(), dv);
  }
  for (int64_t r = 0; r < tq; ++r) {
    const size_t ur = static_cast<size_t>(r);
    const int64_t row = seq.q_begin + item.i0 + r;
    double* orow = o + RowOffset(row, p_.heads_q, item.h, dv);
    double& lse = lse_rows_[RowIndex(row, item.h)];
    st.max_keys = std::max(st.max_keys, sc.keys[ur]);
    st.sum_len_k = std::max(st.sum_len_k, max_tk + sc.tiles[ur]);
    if (sc.m[ur] == kNegInf) {  // empty row: o = 0, lse = -inf
      std::fill(orow, orow + dv, 0.0);
      lse = kNegInf;
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
  BlasSingleThreadScope blas_scope;
  std::vector<Tile> items;
  for (int64_t b = 0; b < p_.batch; ++b) {
    const Sequence seq = SequenceOf(p_, b);
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      for (int64_t i0 = 0; i0 < seq.q_len; i0 += tile_q_) {
        items.push_back({b, h, p_.KvHead(h), i0, std::min(tile_q_, seq.q_len - i0), 0, 0});
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
    ForwardItem(items[static_cast<size_t>(n)], scratch[static_cast<size_t>(w)],
                partial[static_cast<size_t>(w)], o);
  });
  for (const auto& st : partial) MergeStats(stats_, st);
  out.lse = Tensor::Zeros(DType::kF64, p_.LseShape());
  double* lse = out.lse.data<double>();
  for (int64_t b = 0; b < p_.batch; ++b) {
    const Sequence seq = SequenceOf(p_, b);
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      for (int64_t i = 0; i < seq.q_len; ++i) {
        lse[LseOffset(p_, b, h, seq, i)] = lse_rows_[RowIndex(seq.q_begin + i, h)];
      }
    }
  }
  out.stats = stats_;
  return out;
}

void DoubleOracle::BackwardItem(int64_t b, int64_t h, Scratch& sc, OracleStats& st, double* dq,
                                double* dk, double* dv, double* mass, int64_t* seen) {
  const MaskView& mask = masks_[static_cast<size_t>(b)];
  const Sequence& seq = mask.sequence();
  const int64_t g = p_.KvHead(h), dd = p_.head_dim, ddv = p_.head_dim_v;
  // dk/dv rows of this item: the output itself when the kv head has one query head, else
  // this query head's partial ([Hq, total_k, D] laid out by the caller).
  const bool direct = p_.gqa_ratio() == 1;
  const int64_t k_heads = direct ? p_.heads_kv : 1;
  const int64_t k_head = direct ? g : 0;
  AllRowBounds(mask, sc);
  sc.s.resize(static_cast<size_t>(tile_q_ * tile_k_));
  sc.dp.resize(static_cast<size_t>(tile_q_ * tile_k_));
  if (p_.softcap > 0) sc.th.resize(static_cast<size_t>(tile_q_ * tile_k_));
  const double cap = p_.softcap;
  for (int64_t j0 = 0; j0 < seq.k_len; j0 += tile_k_) {
    const int64_t tk = std::min(tile_k_, seq.k_len - j0);
    int64_t qlo = std::numeric_limits<int64_t>::max(), qhi = 0;
    for (int64_t j = j0; j < j0 + tk; ++j) {
      const auto [lo, hi] = mask.QueryBounds(j);
      if (lo < hi) qlo = std::min(qlo, lo), qhi = std::max(qhi, hi);
    }
    sc.acc_k.assign(static_cast<size_t>(tk * dd), 0.0);
    sc.acc_v.assign(static_cast<size_t>(tk * ddv), 0.0);
    int64_t chain = 0, max_tq = 0;
    GatherKeyNorms(Tile{b, h, g, 0, 0, j0, tk}, seq, sc);
    for (int64_t i0 = qlo < qhi ? qlo / tile_q_ * tile_q_ : qhi; i0 < qhi; i0 += tile_q_) {
      Tile t{b, h, g, i0, std::min(tile_q_, seq.q_len - i0), j0, tk};
      if (!Overlaps(sc, t.i0, t.tq, t.j0, t.tk)) continue;
      Scores(t, seq, sc);
      const int64_t row0 = seq.q_begin + t.i0;
      // dP = dO_tile V_tile^T.
      Gemm(false, true, t.tq, tk, ddv, 1.0, DoRow(row0, h), do_.ld, VRow(seq.k_begin + j0, g),
           v_.ld, 0.0, sc.dp.data(), tk);
      bool any = false;
      for (int64_t r = 0; r < t.tq; ++r) {
        double* srow = &sc.s[static_cast<size_t>(r * tk)];
        double* dprow = &sc.dp[static_cast<size_t>(r * tk)];
        double* throw_ = cap > 0 ? &sc.th[static_cast<size_t>(r * tk)] : nullptr;
        int64_t count = 0;
        TransformRow(t, mask, sc, r, srow, throw_, &count, st);
        if (count == 0) {
          std::fill(srow, srow + tk, 0.0);
          std::fill(dprow, dprow + tk, 0.0);
          continue;
        }
        any = true;
        // P = exp(s - lse) (masked: -inf, exp gives 0), dS = P (dP - delta), the column
        // mass, and the visible count (visible entries are exactly the finite ones before
        // the exp, which can underflow).
        BackwardRow(srow, dprow, tk, lse_rows_[RowIndex(row0 + r, h)],
                    delta_rows_[RowIndex(row0 + r, h)], mass + (seq.k_begin + j0),
                    seen + (seq.k_begin + j0));
        if (cap > 0) {
          // d/dx [cap tanh(x / cap)] = 1 - tanh^2(x / cap); ALiBi is a constant bias.
          for (int64_t c = 0; c < tk; ++c) {
            if (srow[c] != 0.0) dprow[c] *= 1.0 - throw_[c] * throw_[c];
          }
        }
      }
      if (!any) continue;
      ++chain;
      max_tq = std::max(max_tq, t.tq);
      // dV += P^T dO, dK += dS^T Q, dQ += dS K.
      Gemm(true, false, tk, ddv, t.tq, 1.0, sc.s.data(), tk, DoRow(row0, h), do_.ld, 1.0,
           sc.acc_v.data(), ddv);
      Gemm(true, false, tk, dd, t.tq, 1.0, sc.dp.data(), tk, QRow(row0, h), q_.ld, 1.0,
           sc.acc_k.data(), dd);
      Gemm(false, false, t.tq, dd, tk, 1.0, sc.dp.data(), tk, KRow(seq.k_begin + j0, g), k_.ld,
           1.0, dq + RowOffset(row0, p_.heads_q, h, dd), p_.heads_q * dd);
    }
    st.sum_len_q = std::max(st.sum_len_q, max_tq + chain + p_.gqa_ratio());
    for (int64_t c = 0; c < tk; ++c) {
      const int64_t row = seq.k_begin + j0 + c;
      double* dkrow = dk + RowOffset(row, k_heads, k_head, dd);
      double* dvrow = dv + RowOffset(row, k_heads, k_head, ddv);
      const double* acc_k = &sc.acc_k[static_cast<size_t>(c * dd)];
      const double* acc_v = &sc.acc_v[static_cast<size_t>(c * ddv)];
      // MHA: final values (dk = scale dS^T Q); GQA: unscaled partials, summed later.
      const double f = direct ? stats_.scale : 1.0;
      for (int64_t d = 0; d < dd; ++d) dkrow[d] = f * acc_k[d];
      for (int64_t d = 0; d < ddv; ++d) dvrow[d] = acc_v[d];
    }
  }
  for (int64_t i = 0; i < seq.q_len; ++i) {
    double* dqrow = dq + RowOffset(seq.q_begin + i, p_.heads_q, h, dd);
    for (int64_t d = 0; d < dd; ++d) dqrow[d] *= stats_.scale;
  }
}

BackwardOut DoubleOracle::RunBackward() {
  ForwardOut fwd = RunForward();
  BlasSingleThreadScope blas_scope;
  const int64_t dv = p_.head_dim_v, dd = p_.head_dim;
  // 0. delta_i = dO_i . o_i by Dot2 (Ogita-Rump-Oishi: exact products via FMA, compensated
  //    sum), 0 on empty rows (o = 0 there).
  const double* o = fwd.o.data<double>();
  delta_rows_.assign(static_cast<size_t>(p_.TotalQ() * p_.heads_q), 0.0);
  for (int64_t row = 0; row < p_.TotalQ(); ++row) {
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      const double* orow = o + RowOffset(row, p_.heads_q, h, dv);
      const double* dorow = DoRow(row, h);
      double sum = 0, comp = 0;
      for (int64_t d = 0; d < dv; ++d) {
        const double prod = dorow[d] * orow[d];
        TwoSumAdd(sum, comp, prod);
        comp += std::fma(dorow[d], orow[d], -prod);
      }
      delta_rows_[RowIndex(row, h)] = sum + comp;
    }
  }

  BackwardOut out;
  out.dq = Tensor::Zeros(DType::kF64, p_.QShape());
  out.dk = Tensor::Zeros(DType::kF64, p_.KShape());
  out.dv = Tensor::Zeros(DType::kF64, p_.VShape());
  const int64_t ratio = p_.gqa_ratio(), total_k = p_.TotalK();
  // GQA: per-query-head partials of dk/dv; MHA writes the outputs directly.
  std::vector<double> part_k, part_v;
  if (ratio > 1) {
    part_k.assign(static_cast<size_t>(p_.heads_q * total_k * dd), 0.0);
    part_v.assign(static_cast<size_t>(p_.heads_q * total_k * dv), 0.0);
  }
  std::vector<double> mass(static_cast<size_t>(p_.heads_q * total_k), 0.0);
  std::vector<int64_t> seen(static_cast<size_t>(p_.heads_q * total_k), 0);
  const int64_t items = p_.batch * p_.heads_q;
  const int threads = ThreadCount(options_, items);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  std::vector<OracleStats> partial(static_cast<size_t>(threads));
  ParallelFor(items, threads, [&](int64_t n, int w) {
    const int64_t b = n / p_.heads_q, h = n % p_.heads_q;
    double* dk = ratio > 1 ? part_k.data() + h * total_k * dd : out.dk.data<double>();
    double* dvp = ratio > 1 ? part_v.data() + h * total_k * dv : out.dv.data<double>();
    BackwardItem(b, h, scratch[static_cast<size_t>(w)], partial[static_cast<size_t>(w)],
                 out.dq.data<double>(), dk, dvp, mass.data() + h * total_k,
                 seen.data() + h * total_k);
  });
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
  OracleStats merged;
  for (const auto& st : partial) MergeStats(merged, st);
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
  stats_.sum_len_q = merged.sum_len_q;
  stats_.q_abs_max = norms_.q_abs;
  stats_.do_abs_max = norms_.do_abs;
  stats_.do_norm_max = norms_.do_norm;

  out.delta = Tensor::Zeros(DType::kF64, p_.LseShape());
  double* delta = out.delta.data<double>();
  for (int64_t b = 0; b < p_.batch; ++b) {
    const Sequence seq = SequenceOf(p_, b);
    for (int64_t h = 0; h < p_.heads_q; ++h) {
      for (int64_t i = 0; i < seq.q_len; ++i) {
        delta[LseOffset(p_, b, h, seq, i)] = delta_rows_[RowIndex(seq.q_begin + i, h)];
      }
    }
  }
  out.o = std::move(fwd.o);
  out.lse = std::move(fwd.lse);
  out.stats = stats_;
  return out;
}

}  // namespace

OracleTiles AutoTiles(const Problem& p) {
  const bool restricted = p.causal || p.window_left >= 0 || p.window_right >= 0;
  return restricted ? OracleTiles{256, 256} : OracleTiles{128, 512};
}

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
