// Gradient term magnitudes, their family quantities and the format bounds built from them (see
// term_scale.h; docs/design.md "Semantics" for P and the mask), and the helpers they share with
// the rounding floors (term_scale_internal.h; the floors are rounding_floor.cc). The terms walk
// the tiles of reference/problem/tile_walk.h (its key tiles, its row transform and mask), per
// (batch, kv head, query head in the group, query tile, key tile). Term magnitudes:
// S = scale Q_t K_t^T, P = exp(transform(S) - lse) on visible entries, dP = dO_t V_t^T,
// A = P (|dO||V|^T + Dabs) with Dabs_i = sum_j P_ij (|dO||V|^T)_ij, then dq_acc += A |K_t|
// and dk_acc += A^T |Q_t| (dgemm each); the result is multiplied by Dv (see below).
#include "verify/tolerance/term_scale.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"
#include "verify/tolerance/term_scale_internal.h"

namespace attest {
namespace term_scale_internal {

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  using namespace oracle_internal;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0);
    }
    return;
  }
  thread_local std::vector<double> panels;
  panels.resize(static_cast<size_t>(PanelCount(n) * k * kPanelWidth));
  PackPanels(b, k, n, trans_b ? 1 : ldb, trans_b ? ldb : 1, panels.data());
  GemmPanels(m, n, k, a, trans_a ? 1 : lda, trans_a ? lda : 1,
             Panels{panels.data(), k * kPanelWidth}, alpha, /*accumulate=*/beta != 0, c, ldc);
}

int64_t WaveSize(int workers) {
  return std::max<int64_t>(workers, std::min<int64_t>(4 * int64_t{workers}, 64));
}

Expected<Tensor> F64Input(const Tensor& t, const char* name, const Shape& shape) {
  if (!t.defined()) return Error{fmt::format("{}: tensor missing", name)};
  if (t.shape() != shape) {
    Tensor want = Tensor::Zeros(DType::kF64, shape);
    return Error{fmt::format("{}: shape {} but the problem needs {}", name, t.Describe(),
                             want.Describe())};
  }
  if (!Info(t.dtype()).is_float) {
    return Error{fmt::format("{}: dtype {} is not a float dtype", name, Name(t.dtype()))};
  }
  Tensor c = ToF64(t);
  if (!c.contiguous()) c = c.Clone();
  return c;
}

std::vector<double> Abs(const Tensor& t) {
  std::vector<double> out(t.span<const double>().begin(), t.span<const double>().end());
  for (double& x : out) x = std::fabs(x);
  return out;
}

int64_t LseIndex(const Problem& p, int64_t b, int64_t h, const Sequence& seq, int64_t i) {
  if (p.varlen()) return h * p.TotalQ() + seq.q_begin + i;
  return (b * p.heads_q + h) * p.seqlen_q + i;
}

}  // namespace term_scale_internal

namespace {

using namespace term_scale_internal;

// The f64 inputs of the term scales; dout is unused zeros for a forward-only computation.
struct TermInputs {
  Tensor q, k, v, dout, lse;
};

Expected<TermInputs> LoadTermInputs(const Problem& p, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& dout, const Tensor& lse,
                                    bool backward) {
  TermInputs in;
  auto qt = F64Input(q, "q", p.QShape());
  if (!qt.ok()) return qt.error();
  auto kt = F64Input(k, "k", p.KShape());
  if (!kt.ok()) return kt.error();
  auto vt = F64Input(v, "v", p.VShape());
  if (!vt.ok()) return vt.error();
  in.dout = Tensor::Zeros(DType::kF64, p.OShape());  // forward only: unused zeros
  if (backward) {
    auto dot = F64Input(dout, "do", p.OShape());
    if (!dot.ok()) return dot.error();
    in.dout = *dot;
  }
  auto lt = F64Input(lse, "lse", p.LseShape());
  if (!lt.ok()) return lt.error();
  in.q = *qt;
  in.k = *kt;
  in.v = *vt;
  in.lse = *lt;
  return in;
}

// Row maxima and L1 norms of `rows` rows of `d` non-negative values.
void RowStats(const std::vector<double>& a, int64_t rows, int64_t d, std::vector<double>& mx,
              std::vector<double>& l1) {
  mx.assign(static_cast<size_t>(rows), 0.0);
  l1.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      const double x = a[static_cast<size_t>(r * d + c)];
      mx[static_cast<size_t>(r)] = std::max(mx[static_cast<size_t>(r)], x);
      l1[static_cast<size_t>(r)] += x;
    }
  }
}

// One computation of the term magnitudes (and, with a model, the family quantities): the
// inputs and their magnitudes, the outputs, the running sums and each worker's tile buffers.
// Run walks (batch, kv head, query head in the group, query tile, key tile).
class TermScaleWalk {
 public:
  TermScaleWalk(const Problem& p, TermInputs in, const QuantisedScoreModel* model, bool backward,
                int threads);
  GradientTermScales Run();

 private:
  // Each worker's tile buffers.
  struct Scratch {
    std::vector<double> s, dp, aqk, prob;
    std::vector<uint8_t> vis;
  };
  // A query tile of one (batch, query head): rows [i0, i0 + tq) of the sequence.
  struct QueryTile {
    int64_t b, g, h;
    double slope;
    const Sequence& seq;
    const TileWalk& walk;
    int64_t i0, tq, qrow0;
  };

  void AllocateOutputs();
  Scratch& Ready(Scratch& w);
  void RunKvHead(int64_t b, const TileWalk& walk, const Sequence& seq, int64_t g);
  void RunQueryTile(const QueryTile& t);
  void KeyTile(const QueryTile& t, int pass, int64_t slot, int64_t j0, int64_t tk, Scratch& w);
  void TransformRows(const QueryTile& t, int pass, double* slot_data, int64_t j0, int64_t tk,
                     Scratch& w);
  double ScoreError(size_t qi, size_t kj, double aqk) const;
  void TileSums(const QueryTile& t, double* slot_data, int64_t j0, int64_t tk, Scratch& w);
  void Merge(const QueryTile& t, int pass, int64_t x, int64_t i);

  const Problem& p_;
  TermInputs in_;
  const QuantisedScoreModel* model_;
  const bool backward_;
  const int64_t hq_, hkv_, d_, dv_;
  const double* Q_;
  const double* K_;
  const double* LSE_;
  const std::vector<double> abs_q_, abs_k_, abs_v_, abs_do_;
  const double scale_, abs_scale_;
  double n_dot_ = 0;

  GradientTermScales out_;
  double* dq_terms_ = nullptr;
  double* dk_terms_ = nullptr;
  // The family quantities (QuantisedScoreModel): row maxima and L1 norms of q and k for the
  // absolute (underflow) part of the score error, |Q||K|^T per tile for the relative part.
  double* score_err_ = nullptr;
  double* o_terms_ = nullptr;
  double* dv_terms_ = nullptr;
  std::vector<double> q_max_, q_l1_, k_max_, k_l1_;

  int workers_ = 1;
  std::vector<Scratch> scratch_;  // allocated on first use
  size_t area_ = 0;
  int64_t wave_ = 1;
  size_t o_size_ = 0, q_size_ = 0, slot_size_ = 0;
  std::vector<double> part_;
  std::vector<double> o_acc_, dv_acc_, delta_row_;
  double rel2_ = 0;
  int64_t ldq_ = 0, ldk_ = 0, ldv_ = 0, ldo_ = 0;
  std::vector<double> dq_acc_, dabs_, dk_acc_;
  std::vector<std::pair<int64_t, int64_t>> tiles_;  // (j0, tk) of a query tile's key tiles
};

TermScaleWalk::TermScaleWalk(const Problem& p, TermInputs in, const QuantisedScoreModel* model,
                             bool backward, int threads)
    : p_(p),
      in_(std::move(in)),
      model_(model),
      backward_(backward),
      hq_(p.heads_q),
      hkv_(p.heads_kv),
      d_(p.head_dim),
      dv_(p.head_dim_v),
      Q_(in_.q.data<double>()),
      K_(in_.k.data<double>()),
      LSE_(in_.lse.data<double>()),
      abs_q_(Abs(in_.q)),
      abs_k_(Abs(in_.k)),
      abs_v_(Abs(in_.v)),
      abs_do_(Abs(in_.dout)),
      scale_(p.EffectiveScale()),
      abs_scale_(std::fabs(scale_)) {
  // dS = P (dP - D) cancels two fp32 dot products of length Dv; Higham's gamma_n bound for
  // a length-n dot product is ~ n u sum |terms|, so the magnitude carries the factor Dv and
  // the policy asks for a few fp32 ULPs of it (verify/tolerance/tolerance.cc, FloorScale::kTerms).
  n_dot_ = static_cast<double>(std::max<int64_t>(dv_, 1));
  AllocateOutputs();
  workers_ = oracle_internal::ThreadCount(threads);
  scratch_.resize(static_cast<size_t>(workers_));
  area_ = static_cast<size_t>(kTileQ * kTileK);
  // The key tiles of a query tile run in waves, the tiles of a wave in parallel
  // (ComputeRoundingFloors does the same): sums over keys take each tile's product from zero
  // and add it to the running sum in tile order after the wave (C = C + t, what the product
  // does when it accumulates one k block: oracle_gemm.h); Dabs_i, a scalar sum over keys, takes
  // each tile's terms in order after the wave; the row maxima of the score error, of
  // non-negative terms, take each tile's maximum (from 0) in order. Sums over queries
  // accumulate in place: each tile owns its key rows. So the bits do not depend on the count.
  wave_ = WaveSize(workers_);
  o_size_ = static_cast<size_t>(kTileQ * dv_);
  q_size_ = static_cast<size_t>(kTileQ * d_);
  // Per wave slot: the tile's Dabs terms [tq x tk] and score-error maxima [tq] (pass 0), or
  // its dq and o products (pass 1).
  slot_size_ = std::max(area_ + static_cast<size_t>(kTileQ), q_size_ + o_size_);
  part_.resize(static_cast<size_t>(wave_) * slot_size_);
  delta_row_.resize(static_cast<size_t>(kTileQ));
  rel2_ = model_ != nullptr ? 2 * model_->rel + model_->rel * model_->rel : 0.0;
  // Row r of a [rows, H, X] input, head h: (r * H + h) * X; consecutive rows are H * X apart.
  ldq_ = hq_ * d_;
  ldk_ = hkv_ * d_;
  ldv_ = hkv_ * dv_;
  ldo_ = hq_ * dv_;
  dq_acc_.resize(q_size_);
  dabs_.resize(static_cast<size_t>(kTileQ));
}

void TermScaleWalk::AllocateOutputs() {
  out_.dq = Tensor::Zeros(DType::kF64, {p_.TotalQ(), hq_});
  out_.dk = Tensor::Zeros(DType::kF64, {p_.TotalK(), hkv_});
  dq_terms_ = out_.dq.data<double>();
  dk_terms_ = out_.dk.data<double>();
  if (model_ == nullptr) return;
  out_.score_error = Tensor::Zeros(DType::kF64, {p_.TotalQ(), hq_});
  out_.o = Tensor::Zeros(DType::kF64, {p_.TotalQ(), hq_});
  score_err_ = out_.score_error.data<double>();
  o_terms_ = out_.o.data<double>();
  if (backward_) {
    out_.dv = Tensor::Zeros(DType::kF64, {p_.TotalK(), hkv_});
    dv_terms_ = out_.dv.data<double>();
  }
  RowStats(abs_q_, p_.TotalQ() * hq_, d_, q_max_, q_l1_);
  RowStats(abs_k_, p_.TotalK() * hkv_, d_, k_max_, k_l1_);
}

TermScaleWalk::Scratch& TermScaleWalk::Ready(Scratch& w) {
  if (w.s.empty()) {
    w.s.resize(area_);
    w.dp.resize(area_);
    if (model_ != nullptr) {
      w.aqk.resize(area_);
      w.prob.resize(area_);
    }
    w.vis.resize(static_cast<size_t>(kTileK));
  }
  return w;
}

GradientTermScales TermScaleWalk::Run() {
  for (int64_t b = 0; b < p_.batch; ++b) {
    const MaskView mask(p_, b);
    const TileWalk walk(mask, kTileK);
    const Sequence& seq = mask.sequence();
    if (seq.q_len == 0 || seq.k_len == 0) continue;
    for (int64_t g = 0; g < hkv_; ++g) RunKvHead(b, walk, seq, g);
  }
  if (!backward_) out_.dq = out_.dk = Tensor();
  return out_;
}

// The query heads of kv head g, query tile by query tile, then g's dk (and dv) terms.
void TermScaleWalk::RunKvHead(int64_t b, const TileWalk& walk, const Sequence& seq, int64_t g) {
  dk_acc_.assign(static_cast<size_t>(seq.k_len * d_), 0.0);
  if (dv_terms_ != nullptr) dv_acc_.assign(static_cast<size_t>(seq.k_len * dv_), 0.0);
  for (int64_t h = g * p_.gqa_ratio(); h < (g + 1) * p_.gqa_ratio(); ++h) {
    const double slope = p_.alibi_slopes ? (*p_.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
    for (int64_t i0 = 0; i0 < seq.q_len; i0 += kTileQ) {
      const int64_t tq = std::min(kTileQ, seq.q_len - i0);
      RunQueryTile(QueryTile{b, g, h, slope, seq, walk, i0, tq, seq.q_begin + i0});
    }
  }
  for (int64_t j = 0; j < seq.k_len; ++j) {
    const double* row = dk_acc_.data() + j * d_;
    const double mx = d_ > 0 ? *std::max_element(row, row + d_) : 0.0;
    dk_terms_[(seq.k_begin + j) * hkv_ + g] = n_dot_ * abs_scale_ * mx;
    if (dv_terms_ == nullptr) continue;
    const double* vrow = dv_acc_.data() + j * dv_;
    dv_terms_[(seq.k_begin + j) * hkv_ + g] =
        dv_ > 0 ? *std::max_element(vrow, vrow + dv_) : 0.0;
  }
}

void TermScaleWalk::RunQueryTile(const QueryTile& t) {
  std::fill(dq_acc_.begin(), dq_acc_.end(), 0.0);
  // Pass 0 bounds |D_i| = |sum_d dO_id o_id| by Dabs_i = sum_j P_ij sum_d |dO_id| |v_jd|
  // (>= sum_d |dO_id| |o_id|, the size of D's own fp32 terms); pass 1 forms A.
  std::fill(dabs_.begin(), dabs_.end(), 0.0);
  std::fill(delta_row_.begin(), delta_row_.end(), 0.0);
  if (model_ != nullptr) o_acc_.assign(o_size_, 0.0);
  tiles_.clear();
  t.walk.ForEachKeyTile(t.i0, t.tq, [&](int64_t, int64_t j0, int64_t tk) {
    tiles_.emplace_back(j0, tk);
  });
  const auto n_tiles = static_cast<int64_t>(tiles_.size());
  for (int pass = 0; pass < 2; ++pass) {
    // Forward only: pass 0 is the score error alone.
    if (pass == 0 && !backward_ && model_ == nullptr) continue;
    const auto tile = [&](int64_t x, int64_t i, int worker) {
      const auto [j0, tk] = tiles_[static_cast<size_t>(i)];
      KeyTile(t, pass, x, j0, tk, Ready(scratch_[static_cast<size_t>(worker)]));
    };
    const auto merge = [&](int64_t x, int64_t i) { Merge(t, pass, x, i); };
    InWaves(n_tiles, wave_, workers_, tile, merge);
  }
  for (int64_t r = 0; r < t.tq; ++r) {
    const double* row = dq_acc_.data() + r * d_;
    const double mx = d_ > 0 ? *std::max_element(row, row + d_) : 0.0;
    dq_terms_[(t.qrow0 + r) * hq_ + t.h] = n_dot_ * abs_scale_ * mx;
    if (model_ == nullptr) continue;
    const double* orow = o_acc_.data() + r * dv_;
    score_err_[(t.qrow0 + r) * hq_ + t.h] = delta_row_[static_cast<size_t>(r)];
    o_terms_[(t.qrow0 + r) * hq_ + t.h] = dv_ > 0 ? *std::max_element(orow, orow + dv_) : 0.0;
  }
}

// Key tile [j0, j0 + tk) of query tile t into wave slot `slot`: its Dabs terms and score-error
// maxima (pass 0), or its dq and o products and its dk and dv sums (pass 1).
void TermScaleWalk::KeyTile(const QueryTile& t, int pass, int64_t slot, int64_t j0, int64_t tk,
                            Scratch& w) {
  double* slot_data = part_.data() + static_cast<size_t>(slot) * slot_size_;
  const int64_t krow0 = t.seq.k_begin + j0;
  Gemm(false, true, t.tq, tk, d_, scale_, Q_ + (t.qrow0 * hq_ + t.h) * d_, ldq_,
       K_ + (krow0 * hkv_ + t.g) * d_, ldk_, 0.0, w.s.data(), tk);
  // |dO| |V|^T: the size of dP's fp32 terms, not the possibly cancelled |dP|.
  if (backward_) {
    Gemm(false, true, t.tq, tk, dv_, 1.0, abs_do_.data() + (t.qrow0 * hq_ + t.h) * dv_, ldo_,
         abs_v_.data() + (krow0 * hkv_ + t.g) * dv_, ldv_, 0.0, w.dp.data(), tk);
  }
  if (model_ != nullptr && pass == 0) {
    Gemm(false, true, t.tq, tk, d_, 1.0, abs_q_.data() + (t.qrow0 * hq_ + t.h) * d_, ldq_,
         abs_k_.data() + (krow0 * hkv_ + t.g) * d_, ldk_, 0.0, w.aqk.data(), tk);
  }
  TransformRows(t, pass, slot_data, j0, tk, w);
  if (pass == 0) return;
  TileSums(t, slot_data, j0, tk, w);
}

// s becomes P (pass 0) or A = P (|dO||v| + Dabs) (pass 1), 0 where masked; pass 0 also
// stores the tile's Dabs terms and score-error maxima in its slot.
void TermScaleWalk::TransformRows(const QueryTile& t, int pass, double* slot_data, int64_t j0,
                                  int64_t tk, Scratch& w) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  double* terms_d = slot_data;          // pass 0: Dabs terms, [tq x tk]
  double* err_max = slot_data + area_;  // pass 0: score-error maxima, [tq]
  std::vector<double>& s = w.s;
  std::vector<double>& dp = w.dp;
  const int64_t krow0 = t.seq.k_begin + j0;
  for (int64_t r = 0; r < t.tq; ++r) {
    const int64_t i = t.i0 + r;
    const double row_lse = LSE_[LseIndex(p_, t.b, t.h, t.seq, i)];
    double* srow = s.data() + r * tk;
    const double* dprow = dp.data() + r * tk;
    double* trow = terms_d + r * tk;
    if (pass == 0) err_max[r] = 0;
    t.walk.TransformRow(i, j0, tk, p_.softcap, t.slope, srow, static_cast<double*>(nullptr),
                        w.vis.data());
    for (int64_t c = 0; c < tk; ++c) {
      if (row_lse == kNegInf || !w.vis[static_cast<size_t>(c)]) {
        srow[c] = 0;
        if (pass == 0) trow[c] = 0;  // adds nothing to Dabs (a sum of terms >= 0)
        if (model_ != nullptr) w.prob[static_cast<size_t>(r * tk + c)] = 0;
        continue;
      }
      const double sc = srow[c];
      const double prob = std::exp(sc - row_lse);
      if (pass == 0) {
        trow[c] = backward_ ? prob * dprow[c] : 0.0;
        if (model_ != nullptr) {
          const size_t qi = static_cast<size_t>((t.qrow0 + r) * hq_ + t.h);
          const size_t kj = static_cast<size_t>((krow0 + c) * hkv_ + t.g);
          const double err = ScoreError(qi, kj, w.aqk[static_cast<size_t>(r * tk + c)]);
          err_max[r] = std::max(err_max[r], err);
        }
      } else {
        if (model_ != nullptr) w.prob[static_cast<size_t>(r * tk + c)] = prob;
        if (backward_) srow[c] = prob * (dprow[c] + dabs_[static_cast<size_t>(r)]);
      }
    }
  }
}

// The score error of query row qi against key row kj (QuantisedScoreModel), aqk = (|Q||K|^T).
double TermScaleWalk::ScoreError(size_t qi, size_t kj, double aqk) const {
  return abs_scale_ *
         (rel2_ * aqk +
          model_->abs * (1 + model_->rel) * (q_max_[qi] * k_l1_[kj] + k_max_[kj] * q_l1_[qi]) +
          model_->abs * model_->abs * static_cast<double>(d_) * q_max_[qi] * k_max_[kj]);
}

// Pass 1's products of the tile: o and dq into its slot, dv and dk added to their sums.
void TermScaleWalk::TileSums(const QueryTile& t, double* slot_data, int64_t j0, int64_t tk,
                             Scratch& w) {
  double* dq_part = slot_data;            // pass 1: dq product, [tq x d]
  double* o_part = slot_data + q_size_;  // pass 1: o product, [tq x dv]
  const int64_t krow0 = t.seq.k_begin + j0;
  if (model_ != nullptr) {
    Gemm(false, false, t.tq, dv_, tk, 1.0, w.prob.data(), tk,
         abs_v_.data() + (krow0 * hkv_ + t.g) * dv_, ldv_, 0.0, o_part, dv_);
    if (dv_terms_ != nullptr) {
      Gemm(true, false, tk, dv_, t.tq, 1.0, w.prob.data(), tk,
           abs_do_.data() + (t.qrow0 * hq_ + t.h) * dv_, ldo_, 1.0, dv_acc_.data() + j0 * dv_,
           dv_);
    }
  }
  if (!backward_) return;
  Gemm(false, false, t.tq, d_, tk, 1.0, w.s.data(), tk,
       abs_k_.data() + (krow0 * hkv_ + t.g) * d_, ldk_, 0.0, dq_part, d_);
  Gemm(true, false, tk, d_, t.tq, 1.0, w.s.data(), tk,
       abs_q_.data() + (t.qrow0 * hq_ + t.h) * d_, ldq_, 1.0, dk_acc_.data() + j0 * d_, d_);
}

// Tile i of the wave (slot x) into the query tile's running sums, in tile order.
void TermScaleWalk::Merge(const QueryTile& t, int pass, int64_t x, int64_t i) {
  const double* slot_data = part_.data() + static_cast<size_t>(x) * slot_size_;
  const int64_t tk = tiles_[static_cast<size_t>(i)].second;
  if (pass == 0) {
    for (int64_t r = 0; r < t.tq; ++r) {
      const double* trow = slot_data + r * tk;
      double& acc = dabs_[static_cast<size_t>(r)];
      if (backward_) {
        for (int64_t c = 0; c < tk; ++c) acc += trow[c];
      }
      if (model_ != nullptr) {
        delta_row_[static_cast<size_t>(r)] =
            std::max(delta_row_[static_cast<size_t>(r)], slot_data[area_ + r]);
      }
    }
    return;
  }
  if (backward_) {
    for (size_t e = 0; e < static_cast<size_t>(t.tq * d_); ++e) {
      dq_acc_[e] = dq_acc_[e] + slot_data[e];
    }
  }
  if (model_ != nullptr) {
    for (size_t e = 0; e < static_cast<size_t>(t.tq * dv_); ++e) {
      o_acc_[e] = o_acc_[e] + slot_data[q_size_ + e];
    }
  }
}

}  // namespace

Expected<GradientTermScales> ComputeGradientTermScales(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& dout, const Tensor& lse,
                                                       int threads) {
  return ComputeGradientTermScales(p, q, k, v, dout, lse, nullptr, threads);
}

Expected<GradientTermScales> ComputeGradientTermScales(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& dout, const Tensor& lse,
                                                       const QuantisedScoreModel* model,
                                                       int threads) {
  if (Status st = Validate(p); !st.ok()) return st.error();
  const bool backward = dout.defined() || model == nullptr;
  auto in = LoadTermInputs(p, q, k, v, dout, lse, backward);
  if (!in.ok()) return in.error();
  return TermScaleWalk(p, std::move(*in), model, backward, threads).Run();
}

// ---- Format bounds ----

namespace {

// factor x terms, 0 where the terms are 0 (nothing the row sums is non-zero, so no
// quantisation moves it) even when the factor overflowed: e^(2 Delta) is +inf once scores reach
// ~350 (per-token scales over decades), and inf x 0 must not become a NaN bound.
double Times(double factor, double terms) { return terms == 0 ? 0.0 : factor * terms; }

// Every element of row r (rows of `per_row` values, `len` elements each) set to per_row[r].
Tensor Broadcast(const Shape& shape, const std::vector<double>& per_row, int64_t len) {
  Tensor t = Tensor::Zeros(DType::kF64, shape);
  double* out = t.data<double>();
  for (size_t r = 0; r < per_row.size(); ++r) {
    for (int64_t c = 0; c < len; ++c) out[static_cast<int64_t>(r) * len + c] = per_row[r];
  }
  return t;
}

}  // namespace

Expected<FormatBounds> ComputeFormatBounds(const Problem& p, const FormatErrors& e,
                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& dout, const Tensor& lse, int threads) {
  const bool backward = dout.defined();
  const QuantisedScoreModel model{.rel = e.qk_rel, .abs = e.qk_abs};
  auto t = ComputeGradientTermScales(p, q, k, v, dout, lse, &model, threads);
  if (!t.ok()) return t.error();
  const int64_t hq = p.heads_q, hkv = p.heads_kv;
  const auto n_q = static_cast<size_t>(p.TotalQ() * hq);
  const auto n_k = static_cast<size_t>(p.TotalK() * hkv);
  const double* delta = t->score_error.data<double>();
  const double* o_terms = t->o.data<double>();
  std::vector<double> lse_row(n_q), o_row(n_q), dq_row(n_q), theta(n_q), rho_ds(n_q);
  double theta_max = 0, rho_ds_max = 0;
  for (size_t r = 0; r < n_q; ++r) {
    theta[r] = std::exp(2 * delta[r]) * (1 + e.p_rel) / (1 - e.p_rel) - 1;
    const double rho_o = theta[r] * (1 + e.v_rel) + e.v_rel;
    o_row[r] = Times(rho_o, o_terms[r]);
    // D reads o' as delivered: its error, then the bf16 output rounding (2^-8 relative).
    const double rho_g = std::max((1 + e.do_rel) * (1 + e.v_rel) - 1,
                                  (1 + e.do_rel) * (1 + rho_o) * (1 + 0x1p-8) - 1);
    const double t_prime = p.softcap > 0 ? std::exp(2 * delta[r] / p.softcap) : 1.0;
    rho_ds[r] = (1 + theta[r]) * (1 + rho_g) * t_prime * (1 + e.ds_rel) - 1;
    theta_max = std::max(theta_max, theta[r]);
    rho_ds_max = std::max(rho_ds_max, rho_ds[r]);
  }
  FormatBounds out;
  out.o = Broadcast(p.OShape(), o_row, p.head_dim_v);
  // lse [B, Hq, Sq] (or [Hq, total_q] packed) against rows [TotalQ, Hq]: transpose.
  {
    out.lse = Tensor::Zeros(DType::kF64, p.LseShape());
    double* l = out.lse.data<double>();
    for (int64_t b = 0; b < (p.varlen() ? 1 : p.batch); ++b) {
      const int64_t sq = p.varlen() ? p.TotalQ() : p.seqlen_q;
      for (int64_t h = 0; h < hq; ++h) {
        for (int64_t i = 0; i < sq; ++i) {
          const int64_t token = b * sq + i;
          l[(b * hq + h) * sq + i] = delta[token * hq + h];
        }
      }
    }
  }
  if (!backward) return out;
  // The term scales carry Higham's factor Dv (term_scale.h); the format bound wants the sums.
  const double n_dot = static_cast<double>(std::max<int64_t>(p.head_dim_v, 1));
  const double* dq_terms = t->dq.data<double>();
  const double* dk_terms = t->dk.data<double>();
  const double* dv_terms = t->dv.data<double>();
  for (size_t r = 0; r < n_q; ++r) {
    dq_row[r] = Times((1 + rho_ds[r]) * (1 + e.qk_rel) - 1, dq_terms[r] / n_dot);
  }
  std::vector<double> dk_row(n_k), dv_row(n_k);
  for (size_t r = 0; r < n_k; ++r) {
    dk_row[r] = Times((1 + rho_ds_max) * (1 + e.qk_rel) - 1, dk_terms[r] / n_dot);
    dv_row[r] = Times(theta_max * (1 + e.do_rel) + e.do_rel, dv_terms[r]);
  }
  out.dq = Broadcast(p.QShape(), dq_row, p.head_dim);
  out.dk = Broadcast(p.KShape(), dk_row, p.head_dim);
  out.dv = Broadcast(p.VShape(), dv_row, p.head_dim_v);
  return out;
}


Status ApplyTermsAndFloors(TensorMetrics& m, size_t k, const GradientTermScales* terms,
                           const FormatBounds* bounds, const RoundingFloors* floors,
                           const char** what) {
  if (terms != nullptr && (k == 2 || k == 3)) {
    *what = "gradient term magnitudes";
    if (Status st = SetRowTermScales(m, k == 2 ? terms->dq : terms->dk); !st.ok()) return st;
  }
  if (bounds != nullptr) {
    const Tensor* slot[5] = {&bounds->o, &bounds->lse, &bounds->dq, &bounds->dk, &bounds->dv};
    *what = "format bounds";
    if (slot[k]->defined()) {
      if (Status st = SetRoundingFloor(m, *slot[k]); !st.ok()) return st;
    }
  }
  if (floors != nullptr) {
    const Tensor* slot[5] = {&floors->o, nullptr, &floors->dq, &floors->dk, &floors->dv};
    *what = "rounding floors";
    if (slot[k] != nullptr && slot[k]->defined()) {
      if (Status st = SetRoundingFloor(m, *slot[k]); !st.ok()) return st;
    }
  }
  return Status::Ok();
}

}  // namespace attest
