// Rounding floors (see term_scale.h for their definition): the rounding points of a recipe and
// the per-element bounds of what they cost. The floors walk the tiles of
// reference/problem/tile_walk.h as the gradient term scales do (term_scale.cc; the pieces they
// share are term_scale_internal.h), per (batch, kv head, query head in the group, query tile,
// key tile).
#include "verify/tolerance/term_scale.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "reference/formats/format.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"
#include "verify/tolerance/term_scale_internal.h"

namespace attest {
namespace {

using namespace term_scale_internal;

// Rounding error bound of one rounding point: |rnd(x) - x| <= u |x| + eta / 2, in the scaled
// domain of a pre-scaled operand (x -> rnd(x s) / s: the absolute part shrinks by s).
struct PointBound {
  double u = 0, half_eta = 0;
  double operator()(double x) const { return u * std::fabs(x) + half_eta; }
};

PointBound BoundOf(const std::optional<RoundingPoint>& r) {
  if (!r) return {};
  const FormatSpec& spec = Spec(r->format);
  return {std::ldexp(1.0, -(spec.mantissa_bits + 1)),
          0.5 * std::ldexp(1.0, spec.min_normal_exponent() - spec.mantissa_bits) / r->pre_scale};
}

// An elementwise rounding to a format narrower than fp32; nullopt otherwise (kNone, fp32 or
// wider, block schemes: see term_scale.h).
std::optional<RoundingPoint> PointOf(const OperandScheme& s) {
  if (s.kind != OperandKind::kElement) return std::nullopt;
  if (s.element == Format::kF32 || s.element == Format::kF64) return std::nullopt;
  return RoundingPoint{s.element, s.pre_scale};
}

std::optional<RoundingPoint> PointOf(std::optional<Format> f) {
  if (!f || *f == Format::kF32 || *f == Format::kF64) return std::nullopt;
  return RoundingPoint{*f, 1.0};
}

// min(sum, sigmas sqrt(sum2)) elementwise into out.
void Combine(const std::vector<double>& sum, const std::vector<double>& sum2, double* out) {
  for (size_t e = 0; e < sum.size(); ++e) {
    out[e] = std::min(sum[e], kRoundingSigmas * std::sqrt(sum2[e]));
  }
}

std::vector<double> Squares(const Tensor& t) {
  std::vector<double> out(t.span<const double>().begin(), t.span<const double>().end());
  for (double& x : out) x *= x;
  return out;
}

// Squares of the weights, for the sqrt(sum b^2) part.
void Square(const std::vector<double>& a, std::vector<double>& b, size_t n) {
  for (size_t e = 0; e < n; ++e) b[e] = a[e] * a[e];
}

// acc += t elementwise, in order.
void Add(std::vector<double>& acc, const double* t, size_t n) {
  for (size_t e = 0; e < n; ++e) acc[e] = acc[e] + t[e];
}

// The f64 inputs of the floors; dout, o and delta only with the backward.
struct FloorInputs {
  Tensor q, k, v, lse, dout, o, delta;
};

Expected<FloorInputs> LoadFloorInputs(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& dout, const Tensor& lse,
                                      const Tensor& o, const Tensor& delta, bool backward) {
  FloorInputs in;
  auto qt = F64Input(q, "q", p.QShape());
  if (!qt.ok()) return qt.error();
  auto kt = F64Input(k, "k", p.KShape());
  if (!kt.ok()) return kt.error();
  auto vt = F64Input(v, "v", p.VShape());
  if (!vt.ok()) return vt.error();
  auto lt = F64Input(lse, "lse", p.LseShape());
  if (!lt.ok()) return lt.error();
  if (backward) {
    auto x = F64Input(dout, "do", p.OShape());
    if (!x.ok()) return x.error();
    auto y = F64Input(o, "o", p.OShape());
    if (!y.ok()) return y.error();
    auto z = F64Input(delta, "delta", p.LseShape());
    if (!z.ok()) return z.error();
    in.dout = *x;
    in.o = *y;
    in.delta = *z;
  }
  in.q = *qt;
  in.k = *kt;
  in.v = *vt;
  in.lse = *lt;
  return in;
}

// One computation of the rounding floors: the inputs with their magnitudes and squares, the
// points' bounds, the outputs, the running sums and each worker's tile buffers. Run walks
// (batch, kv head, query head in the group, query tile, key tile).
class FloorWalk {
 public:
  FloorWalk(const Problem& p, const RoundingPoints& points, FloorInputs in,
            const std::vector<uint8_t>* query_rows, int threads);
  // The outputs, all 0 (no rounding point acts).
  RoundingFloors& Zeros() { return out_; }
  RoundingFloors Run();

 private:
  // Each worker's tile buffers.
  struct Scratch {
    std::vector<double> s, dp, e1, e2, e3, e4, e5, sq, th;
    std::vector<uint8_t> vis;
  };
  // A tile of up to kTileQ computed query rows (rw[0..tq), sequence offsets) of one
  // (batch, query head); consecutive: rows rw[0]..rw[0] + tq - 1, read in place.
  struct RowTile {
    int64_t b, g, h;
    double slope;
    const Sequence& seq;
    const TileWalk& walk;
    const int64_t* rw;
    int64_t tq;
    bool consecutive;
    int64_t i0, qrow0;
  };

  Scratch& Ready(Scratch& w);
  void RunKvHead(int64_t b, const TileWalk& walk, const Sequence& seq, int64_t g);
  void RunRowTile(const RowTile& t);
  void RowDeltaErrors(const RowTile& t);
  std::array<double*, 5> Parts(int64_t slot);
  void KeyTile(const RowTile& t, int64_t slot, int64_t j0, int64_t tk, Scratch& w);
  void TileWeights(const RowTile& t, int64_t j0, int64_t tk, Scratch& w);
  void TileProducts(const RowTile& t, int64_t slot, int64_t j0, int64_t tk, Scratch& w);
  void MergeParts(const RowTile& t, int64_t x);
  void WriteQueryFloors(const RowTile& t);
  void WriteKeyFloors(const Sequence& seq, int64_t g);

  const Problem& p_;
  FloorInputs in_;
  const std::vector<uint8_t>* query_rows_;
  const bool backward_;
  const int64_t hq_, hkv_, d_, dv_;
  const double* Q_;
  const double* K_;
  const double* V_;
  const double* LSE_;
  const double* DO_;
  const double* O_;
  const double* DELTA_;
  const std::vector<double> abs_q_, sq_q_;
  const std::vector<double> abs_k_, sq_k_;
  const std::vector<double> abs_v_, sq_v_;
  const std::vector<double> abs_do_;
  const std::vector<double> sq_do_;
  const double scale_, abs_scale_;
  const PointBound e_pv_, e_pdo_;
  const PointBound e_ds_dq_, e_ds_dk_;
  const PointBound e_dp_;
  const PointBound e_o_;
  const bool delta_o_;  // D reads O rounded (RoundingPoints::delta_o)

  RoundingFloors out_;
  int64_t ldq_ = 0, ldk_ = 0, ldv_ = 0, ldo_ = 0;
  size_t area_ = 0;
  int workers_ = 1;
  std::vector<Scratch> scratch_;  // allocated on first use
  int64_t wave_ = 1;
  size_t o_size_ = 0, q_size_ = 0;
  std::vector<double> o1_, o2_, q1_, q2_, qc_;
  std::vector<double> part_;
  std::vector<double> dd_;
  std::vector<double> k1_, k2_, v1_, v2_;
  std::vector<std::pair<int64_t, int64_t>> tiles_;  // (j0, tk) of a query tile's key tiles
  std::vector<int64_t> rows_;
  std::vector<double> qg_;
};

FloorWalk::FloorWalk(const Problem& p, const RoundingPoints& points, FloorInputs in,
                     const std::vector<uint8_t>* query_rows, int threads)
    : p_(p),
      in_(std::move(in)),
      query_rows_(query_rows),
      backward_(in_.dout.defined()),
      hq_(p.heads_q),
      hkv_(p.heads_kv),
      d_(p.head_dim),
      dv_(p.head_dim_v),
      Q_(in_.q.data<double>()),
      K_(in_.k.data<double>()),
      V_(in_.v.data<double>()),
      LSE_(in_.lse.data<double>()),
      DO_(backward_ ? in_.dout.data<double>() : nullptr),
      O_(backward_ ? in_.o.data<double>() : nullptr),
      DELTA_(backward_ ? in_.delta.data<double>() : nullptr),
      abs_q_(Abs(in_.q)),
      sq_q_(Squares(in_.q)),
      abs_k_(Abs(in_.k)),
      sq_k_(Squares(in_.k)),
      abs_v_(Abs(in_.v)),
      sq_v_(Squares(in_.v)),
      abs_do_(backward_ ? Abs(in_.dout) : std::vector<double>()),
      sq_do_(backward_ ? Squares(in_.dout) : std::vector<double>()),
      scale_(p.EffectiveScale()),
      abs_scale_(std::fabs(scale_)),
      e_pv_(BoundOf(points.p_pv)),
      e_pdo_(BoundOf(points.p_pdo)),
      e_ds_dq_(BoundOf(points.ds_dq)),
      e_ds_dk_(BoundOf(points.ds_dk)),
      e_dp_(BoundOf(points.dp)),
      e_o_(BoundOf(PointOf(points.delta_o))),
      delta_o_(points.delta_o.has_value()) {
  out_.o = Tensor::Zeros(DType::kF64, p.OShape());
  if (backward_) {
    out_.dq = Tensor::Zeros(DType::kF64, p.QShape());
    out_.dk = Tensor::Zeros(DType::kF64, p.KShape());
    out_.dv = Tensor::Zeros(DType::kF64, p.VShape());
  }
  ldq_ = hq_ * d_;
  ldk_ = hkv_ * d_;
  ldv_ = hkv_ * dv_;
  ldo_ = hq_ * dv_;
  area_ = static_cast<size_t>(kTileQ * kTileK);
  workers_ = oracle_internal::ThreadCount(threads);
  scratch_.resize(static_cast<size_t>(workers_));
  // The key tiles of a query tile run in waves (4 tiles per worker, at most 64 unless there
  // are more workers), the tiles of a wave in parallel. The sums over keys (o1, o2, q1, q2,
  // qc) take, per tile, the product of the tile from zero (one k block of the oracle's
  // product: tk <= kGemmKc) and add it to the running sum in tile order, after the wave:
  // C = C + t, what the product does when it accumulates (oracle_gemm.h), so the bits do not
  // depend on the thread count. The sums over queries (k1, k2, v1, v2) accumulate in place:
  // each tile owns its key rows, and query tiles and heads run in order.
  wave_ = WaveSize(workers_);
  o_size_ = static_cast<size_t>(kTileQ * dv_);
  q_size_ = static_cast<size_t>(kTileQ * d_);
  for (auto* x : {&o1_, &o2_}) x->resize(o_size_);
  for (auto* x : {&q1_, &q2_, &qc_}) x->resize(q_size_);
  // Per wave slot: the tile's o1, o2, q1, q2, qc products.
  part_.resize(static_cast<size_t>(wave_) * (2 * o_size_ + 3 * q_size_));
  dd_.resize(static_cast<size_t>(kTileQ));
  // The query rows of each sequence whose floors are computed, in tiles of up to kTileQ: all of
  // them, or the flagged ones of query_rows, gathered (their Q rows copied to qg when not
  // consecutive), so that the cost follows the sample. The other rows' floors stay 0.
  qg_.resize(static_cast<size_t>(kTileQ * d_));
}

FloorWalk::Scratch& FloorWalk::Ready(Scratch& w) {
  if (w.s.empty()) {
    for (auto* x : {&w.s, &w.dp, &w.e1, &w.e2, &w.e3, &w.e4, &w.e5, &w.sq}) x->resize(area_);
    w.th.resize(static_cast<size_t>(kTileK));
    w.vis.resize(static_cast<size_t>(kTileK));
  }
  return w;
}

RoundingFloors FloorWalk::Run() {
  for (int64_t b = 0; b < p_.batch; ++b) {
    const MaskView mask(p_, b);
    const TileWalk walk(mask, kTileK);
    const Sequence& seq = mask.sequence();
    if (seq.q_len == 0 || seq.k_len == 0) continue;
    for (int64_t g = 0; g < hkv_; ++g) RunKvHead(b, walk, seq, g);
  }
  return out_;
}

// The query heads of kv head g, tile of computed rows by tile, then g's dk and dv floors.
void FloorWalk::RunKvHead(int64_t b, const TileWalk& walk, const Sequence& seq, int64_t g) {
  if (backward_) {
    k1_.assign(static_cast<size_t>(seq.k_len * d_), 0.0);
    k2_.assign(k1_.size(), 0.0);
    v1_.assign(static_cast<size_t>(seq.k_len * dv_), 0.0);
    v2_.assign(v1_.size(), 0.0);
  }
  for (int64_t h = g * p_.gqa_ratio(); h < (g + 1) * p_.gqa_ratio(); ++h) {
    const double slope = p_.alibi_slopes ? (*p_.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
    rows_.clear();
    for (int64_t i = 0; i < seq.q_len; ++i) {
      if (query_rows_ == nullptr ||
          (*query_rows_)[static_cast<size_t>(seq.q_begin + i)] != 0) {
        rows_.push_back(i);
      }
    }
    for (size_t n0 = 0; n0 < rows_.size(); n0 += static_cast<size_t>(kTileQ)) {
      const int64_t* rw = rows_.data() + n0;
      const int64_t tq = std::min<int64_t>(kTileQ, static_cast<int64_t>(rows_.size() - n0));
      // Consecutive rows (always, with the backward): read in place from row i0 on.
      const bool consecutive = rw[tq - 1] - rw[0] == tq - 1;
      const int64_t i0 = rw[0];
      RunRowTile(RowTile{b, g, h, slope, seq, walk, rw, tq, consecutive, i0, seq.q_begin + i0});
    }
  }
  if (!backward_) return;
  WriteKeyFloors(seq, g);
}

void FloorWalk::RunRowTile(const RowTile& t) {
  if (!t.consecutive) {
    for (int64_t r = 0; r < t.tq; ++r) {
      const double* src = Q_ + ((t.seq.q_begin + t.rw[r]) * hq_ + t.h) * d_;
      std::copy(src, src + d_, qg_.data() + r * d_);
    }
  }
  std::fill(o1_.begin(), o1_.end(), 0.0);
  std::fill(o2_.begin(), o2_.end(), 0.0);
  std::fill(q1_.begin(), q1_.end(), 0.0);
  std::fill(q2_.begin(), q2_.end(), 0.0);
  std::fill(qc_.begin(), qc_.end(), 0.0);
  RowDeltaErrors(t);
  tiles_.clear();
  const auto collect = [&](int64_t, int64_t j0, int64_t tk) { tiles_.emplace_back(j0, tk); };
  if (t.consecutive) {
    t.walk.ForEachKeyTile(t.i0, t.tq, collect);
  } else {
    t.walk.ForEachKeyTileOfRows(t.rw, t.tq, collect);
  }
  const auto n_tiles = static_cast<int64_t>(tiles_.size());
  InWaves(
      n_tiles, wave_, workers_,
      [&](int64_t x, int64_t i, int worker) {
        const auto [j0, tk] = tiles_[static_cast<size_t>(i)];
        KeyTile(t, x, j0, tk, Ready(scratch_[static_cast<size_t>(worker)]));
      },
      [&](int64_t x, int64_t) { MergeParts(t, x); });
  WriteQueryFloors(t);
}

// dD_i: the error of D_i = sum_d dO_id o_id when o is rounded to its output format.
void FloorWalk::RowDeltaErrors(const RowTile& t) {
  for (int64_t r = 0; r < t.tq; ++r) {
    double a1 = 0, a2 = 0;
    if (backward_ && delta_o_) {
      for (int64_t c = 0; c < dv_; ++c) {
        const int64_t at = ((t.qrow0 + r) * hq_ + t.h) * dv_ + c;
        const double a = e_o_(O_[at]) * std::fabs(DO_[at]);
        a1 += a;
        a2 += a * a;
      }
    }
    dd_[static_cast<size_t>(r)] = std::min(a1, kRoundingSigmas * std::sqrt(a2));
  }
}

// The tile's products of the sums over keys (tq rows; the slot's parts).
std::array<double*, 5> FloorWalk::Parts(int64_t slot) {
  double* o1p = part_.data() + static_cast<size_t>(slot) * (2 * o_size_ + 3 * q_size_);
  return std::array<double*, 5>{o1p, o1p + o_size_, o1p + 2 * o_size_,
                                o1p + 2 * o_size_ + q_size_, o1p + 2 * o_size_ + 2 * q_size_};
}

void FloorWalk::KeyTile(const RowTile& t, int64_t slot, int64_t j0, int64_t tk, Scratch& w) {
  const int64_t krow0 = t.seq.k_begin + j0;
  Gemm(false, true, t.tq, tk, d_, scale_,
       t.consecutive ? Q_ + (t.qrow0 * hq_ + t.h) * d_ : qg_.data(), t.consecutive ? ldq_ : d_,
       K_ + (krow0 * hkv_ + t.g) * d_, ldk_, 0.0, w.s.data(), tk);
  if (backward_) {
    Gemm(false, true, t.tq, tk, dv_, 1.0, DO_ + (t.qrow0 * hq_ + t.h) * dv_, ldo_,
         V_ + (krow0 * hkv_ + t.g) * dv_, ldv_, 0.0, w.dp.data(), tk);
  }
  TileWeights(t, j0, tk, w);
  TileProducts(t, slot, j0, tk, w);
}

// e5: o's weights; e4: dv's; e1: dq's independent, e2: dq's shared (x dD_i), e3:
// dk's. All 0 where masked.
void FloorWalk::TileWeights(const RowTile& t, int64_t j0, int64_t tk, Scratch& w) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double>& s = w.s;
  std::vector<double>& dp = w.dp;
  std::vector<double>& e1 = w.e1;
  std::vector<double>& e2 = w.e2;
  std::vector<double>& e3 = w.e3;
  std::vector<double>& e4 = w.e4;
  std::vector<double>& e5 = w.e5;
  for (int64_t r = 0; r < t.tq; ++r) {
    const int64_t i = t.rw[r];
    const int64_t li = LseIndex(p_, t.b, t.h, t.seq, i);
    const double row_lse = LSE_[li];
    const double row_d = backward_ ? DELTA_[li] : 0.0;
    const double row_dd = dd_[static_cast<size_t>(r)];
    t.walk.TransformRow(i, j0, tk, p_.softcap, t.slope, s.data() + r * tk, w.th.data(),
                        w.vis.data());
    for (int64_t c = 0; c < tk; ++c) {
      const size_t at = static_cast<size_t>(r * tk + c);
      if (row_lse == kNegInf || !w.vis[static_cast<size_t>(c)]) {
        e1[at] = e2[at] = e3[at] = e4[at] = e5[at] = 0;
        continue;
      }
      const double sc = s[at];
      double tprime = 1;
      if (p_.softcap > 0) {
        const double th = w.th[static_cast<size_t>(c)];
        tprime = 1 - th * th;
      }
      const double prob = std::exp(sc - row_lse);
      e5[at] = e_pv_(prob);
      if (!backward_) continue;
      const double dpv = dp[at];
      const double ds = prob * (dpv - row_d) * tprime;
      const double pt = prob * tprime;
      e4[at] = e_pdo_(prob);
      e1[at] = abs_scale_ * (e_ds_dq_(ds) + pt * e_dp_(dpv));
      e2[at] = abs_scale_ * pt;
      e3[at] = abs_scale_ * (e_ds_dk_(ds) + pt * (e_dp_(dpv) + row_dd));
    }
  }
}

// The weights times the magnitudes (and their squares times the squares): o and dq parts into
// the slot, dk and dv added to their sums.
void FloorWalk::TileProducts(const RowTile& t, int64_t slot, int64_t j0, int64_t tk,
                             Scratch& w) {
  const auto [o1p, o2p, q1p, q2p, qcp] = Parts(slot);
  std::vector<double>& sq = w.sq;
  const int64_t krow0 = t.seq.k_begin + j0;
  const size_t n = static_cast<size_t>(t.tq * tk);
  const int64_t tq = t.tq;
  const double* av = abs_v_.data() + (krow0 * hkv_ + t.g) * dv_;
  const double* sv = sq_v_.data() + (krow0 * hkv_ + t.g) * dv_;
  Gemm(false, false, tq, dv_, tk, 1.0, w.e5.data(), tk, av, ldv_, 0.0, o1p, dv_);
  Square(w.e5, sq, n);
  Gemm(false, false, tq, dv_, tk, 1.0, sq.data(), tk, sv, ldv_, 0.0, o2p, dv_);
  if (!backward_) return;
  const double* ak = abs_k_.data() + (krow0 * hkv_ + t.g) * d_;
  const double* sk = sq_k_.data() + (krow0 * hkv_ + t.g) * d_;
  Gemm(false, false, tq, d_, tk, 1.0, w.e1.data(), tk, ak, ldk_, 0.0, q1p, d_);
  Square(w.e1, sq, n);
  Gemm(false, false, tq, d_, tk, 1.0, sq.data(), tk, sk, ldk_, 0.0, q2p, d_);
  Gemm(false, false, tq, d_, tk, 1.0, w.e2.data(), tk, ak, ldk_, 0.0, qcp, d_);
  const double* aq = abs_q_.data() + (t.qrow0 * hq_ + t.h) * d_;
  const double* sqq = sq_q_.data() + (t.qrow0 * hq_ + t.h) * d_;
  Gemm(true, false, tk, d_, tq, 1.0, w.e3.data(), tk, aq, ldq_, 1.0, k1_.data() + j0 * d_, d_);
  Square(w.e3, sq, n);
  Gemm(true, false, tk, d_, tq, 1.0, sq.data(), tk, sqq, ldq_, 1.0, k2_.data() + j0 * d_, d_);
  const double* ado = abs_do_.data() + (t.qrow0 * hq_ + t.h) * dv_;
  const double* sdo = sq_do_.data() + (t.qrow0 * hq_ + t.h) * dv_;
  Gemm(true, false, tk, dv_, tq, 1.0, w.e4.data(), tk, ado, ldo_, 1.0, v1_.data() + j0 * dv_,
       dv_);
  Square(w.e4, sq, n);
  Gemm(true, false, tk, dv_, tq, 1.0, sq.data(), tk, sdo, ldo_, 1.0, v2_.data() + j0 * dv_,
       dv_);
}

// Slot x's products into the sums over keys, in tile order.
void FloorWalk::MergeParts(const RowTile& t, int64_t x) {
  const auto [o1p, o2p, q1p, q2p, qcp] = Parts(x);
  Add(o1_, o1p, static_cast<size_t>(t.tq * dv_));
  Add(o2_, o2p, static_cast<size_t>(t.tq * dv_));
  if (!backward_) return;
  Add(q1_, q1p, static_cast<size_t>(t.tq * d_));
  Add(q2_, q2p, static_cast<size_t>(t.tq * d_));
  Add(qc_, qcp, static_cast<size_t>(t.tq * d_));
}

// The tile's o floors (and, with the backward, dq floors) from the sums over keys.
void FloorWalk::WriteQueryFloors(const RowTile& t) {
  double* of = out_.o.data<double>();
  for (int64_t r = 0; r < t.tq; ++r) {
    for (int64_t c = 0; c < dv_; ++c) {
      const size_t at = static_cast<size_t>(r * dv_ + c);
      of[((t.seq.q_begin + t.rw[r]) * hq_ + t.h) * dv_ + c] =
          std::min(o1_[at], kRoundingSigmas * std::sqrt(o2_[at]));
    }
  }
  if (!backward_) return;
  double* qf = out_.dq.data<double>();
  for (int64_t r = 0; r < t.tq; ++r) {
    for (int64_t c = 0; c < d_; ++c) {
      const size_t at = static_cast<size_t>(r * d_ + c);
      qf[((t.qrow0 + r) * hq_ + t.h) * d_ + c] =
          std::min(q1_[at], kRoundingSigmas * std::sqrt(q2_[at])) +
          dd_[static_cast<size_t>(r)] * qc_[at];
    }
  }
}

// Kv head g's dk and dv floors from the sums over queries.
void FloorWalk::WriteKeyFloors(const Sequence& seq, int64_t g) {
  std::vector<double> kf(k1_.size()), vf(v1_.size());
  Combine(k1_, k2_, kf.data());
  Combine(v1_, v2_, vf.data());
  double* dkf = out_.dk.data<double>();
  double* dvf = out_.dv.data<double>();
  for (int64_t j = 0; j < seq.k_len; ++j) {
    for (int64_t c = 0; c < d_; ++c) {
      dkf[((seq.k_begin + j) * hkv_ + g) * d_ + c] = kf[static_cast<size_t>(j * d_ + c)];
    }
    for (int64_t c = 0; c < dv_; ++c) {
      dvf[((seq.k_begin + j) * hkv_ + g) * dv_ + c] = vf[static_cast<size_t>(j * dv_ + c)];
    }
  }
}

}  // namespace

RoundingPoints RoundingPointsOf(const Recipe& recipe, DType dtype, std::optional<Format> dp) {
  RoundingPoints r;
  r.p_pv = PointOf(recipe.pv.a.scheme);
  r.p_pdo = PointOf(recipe.pdo.a.scheme);
  r.ds_dq = PointOf(recipe.dsk.a.scheme);
  r.ds_dk = PointOf(recipe.dsq.a.scheme);
  r.dp = PointOf(dp ? dp : recipe.dp);
  // Which dO D reads (Recipe::delta_do) adds no point: operand quantisation (dov.a) is not a
  // rounding point here, for dP's dO either; the profiles of such recipes judge against the
  // recipe reference (recipe_reference.cc), which forms D from the same dO.
  if (recipe.delta == DeltaSource::kRoundedO) {
    const std::optional<Format> out = recipe.output ? recipe.output : FormatOf(dtype);
    if (PointOf(out)) r.delta_o = out;
  }
  return r;
}

Expected<RoundingFloors> ComputeRoundingFloors(const Problem& p, const RoundingPoints& points,
                                               const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& dout, const Tensor& lse,
                                               const Tensor& o, const Tensor& delta,
                                               const std::vector<uint8_t>* query_rows,
                                               int threads) {
  if (Status st = Validate(p); !st.ok()) return st.error();
  const bool backward = dout.defined();
  if (query_rows != nullptr &&
      (backward || static_cast<int64_t>(query_rows->size()) != p.TotalQ())) {
    return Error{backward ? std::string("rounding floors: query_rows with the backward")
                          : "rounding floors: query_rows has " +
                                std::to_string(query_rows->size()) + " flags for " +
                                std::to_string(p.TotalQ()) + " query rows"};
  }
  auto in = LoadFloorInputs(p, q, k, v, dout, lse, o, delta, backward);
  if (!in.ok()) return in.error();
  FloorWalk walk(p, points, std::move(*in), query_rows, threads);
  if (!points.any()) return walk.Zeros();
  return walk.Run();
}

}  // namespace attest
