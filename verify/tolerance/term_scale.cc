// Gradient term magnitudes and rounding floors (see term_scale.h; docs/design.md
// "Semantics" for P and the mask). Both walk the tiles of reference/problem/tile_walk.h (its
// key tiles, its row transform and mask), per (batch, kv head, query head in the group,
// query tile, key tile). Term magnitudes:
// S = scale Q_t K_t^T, P = exp(transform(S) - lse) on visible entries, dP = dO_t V_t^T,
// A = P (|dO||V|^T + Dabs) with Dabs_i = sum_j P_ij (|dO||V|^T)_ij, then dq_acc += A |K_t|
// and dk_acc += A^T |Q_t| (dgemm each); the result is multiplied by Dv (see below).
#include "verify/tolerance/term_scale.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_gemm.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"

namespace attest {
namespace {

// The oracle's tiles (oracle.h AutoTiles; the tile sizes do not depend on the problem).
const int64_t kTileQ = AutoTiles(Problem{}).q;
const int64_t kTileK = AutoTiles(Problem{}).k;
// A key tile's sums are one k block of the oracle's product (ComputeRoundingFloors adds each
// tile's product to its running sum as the product itself would).
static_assert(oracle_internal::kGemmKc >= 128);

// C = alpha op(A) op(B) (beta 0) or C += op(A) op(B) (beta 1, alpha 1), row-major, by the
// oracle's own product (reference/oracle/oracle_gemm.h): its rounding sequence is fixed and
// the same on every ISA, so the term scales, and the tolerances built from them, are the
// same bits on every machine (a BLAS dgemm sums in the order of whichever kernel the CPU
// selects). B is packed into panels per call, as dgemm does.
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

// Tiles per wave of InWaves: 4 per worker, at most 64 unless there are more workers.
int64_t WaveSize(int workers) {
  return std::max<int64_t>(workers, std::min<int64_t>(4 * int64_t{workers}, 64));
}

// tile(x, i, worker) for the tiles i in [0, n), in waves of `wave` tiles run on up to `workers`
// threads (x < wave: the tile's slot in its wave); after each wave, merge(x, i) for its tiles
// in order. Sums merged there keep one order whatever the thread count.
template <class Tile, class Merge>
void InWaves(int64_t n, int64_t wave, int workers, Tile&& tile, Merge&& merge) {
  for (int64_t w0 = 0; w0 < n; w0 += wave) {
    const int64_t nw = std::min(wave, n - w0);
    oracle_internal::ParallelFor(nw, oracle_internal::ThreadCount(workers, nw),
                                 [&](int64_t x, int worker) { tile(x, w0 + x, worker); });
    for (int64_t x = 0; x < nw; ++x) merge(x, w0 + x);
  }
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

// Offset of (b, h, i) in lse / delta: [B, Hq, Sq] or, packed, [Hq, total_q] (oracle.h).
int64_t LseIndex(const Problem& p, int64_t b, int64_t h, const Sequence& seq, int64_t i) {
  if (p.varlen()) return h * p.TotalQ() + seq.q_begin + i;
  return (b * p.heads_q + h) * p.seqlen_q + i;
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
  auto qt = F64Input(q, "q", p.QShape());
  if (!qt.ok()) return qt.error();
  auto kt = F64Input(k, "k", p.KShape());
  if (!kt.ok()) return kt.error();
  auto vt = F64Input(v, "v", p.VShape());
  if (!vt.ok()) return vt.error();
  Tensor do_f64 = Tensor::Zeros(DType::kF64, p.OShape());  // forward only: unused zeros
  if (backward) {
    auto dot = F64Input(dout, "do", p.OShape());
    if (!dot.ok()) return dot.error();
    do_f64 = *dot;
  }
  auto lt = F64Input(lse, "lse", p.LseShape());
  if (!lt.ok()) return lt.error();

  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const double* Q = qt->data<double>();
  const double* K = kt->data<double>();
  const double* LSE = lt->data<double>();
  const std::vector<double> abs_q = Abs(*qt);
  const std::vector<double> abs_k = Abs(*kt);
  const std::vector<double> abs_v = Abs(*vt);
  const std::vector<double> abs_do = Abs(do_f64);
  const double scale = p.EffectiveScale();
  const double abs_scale = std::fabs(scale);
  // dS = P (dP - D) cancels two fp32 dot products of length Dv; Higham's gamma_n bound for
  // a length-n dot product is ~ n u sum |terms|, so the magnitude carries the factor Dv and
  // the policy asks for a few fp32 ULPs of it (verify/tolerance/tolerance.cc, FloorScale::kTerms).
  const double n_dot = static_cast<double>(std::max<int64_t>(dv, 1));
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  GradientTermScales out;
  out.dq = Tensor::Zeros(DType::kF64, {p.TotalQ(), hq});
  out.dk = Tensor::Zeros(DType::kF64, {p.TotalK(), hkv});
  double* dq_terms = out.dq.data<double>();
  double* dk_terms = out.dk.data<double>();
  // The family quantities (QuantisedScoreModel): row maxima and L1 norms of q and k for the
  // absolute (underflow) part of the score error, |Q||K|^T per tile for the relative part.
  double* score_err = nullptr;
  double* o_terms = nullptr;
  double* dv_terms = nullptr;
  std::vector<double> q_max, q_l1, k_max, k_l1;
  if (model != nullptr) {
    out.score_error = Tensor::Zeros(DType::kF64, {p.TotalQ(), hq});
    out.o = Tensor::Zeros(DType::kF64, {p.TotalQ(), hq});
    score_err = out.score_error.data<double>();
    o_terms = out.o.data<double>();
    if (backward) {
      out.dv = Tensor::Zeros(DType::kF64, {p.TotalK(), hkv});
      dv_terms = out.dv.data<double>();
    }
    const auto row_stats = [&](const std::vector<double>& a, int64_t rows, std::vector<double>& mx,
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
    };
    row_stats(abs_q, p.TotalQ() * hq, q_max, q_l1);
    row_stats(abs_k, p.TotalK() * hkv, k_max, k_l1);
  }
  // Each worker's tile buffers.
  struct Scratch {
    std::vector<double> s, dp, aqk, prob;
    std::vector<uint8_t> vis;
  };
  const int workers = oracle_internal::ThreadCount(threads);
  std::vector<Scratch> scratch(static_cast<size_t>(workers));  // allocated on first use
  const auto area = static_cast<size_t>(kTileQ * kTileK);
  const auto ready = [&](Scratch& w) -> Scratch& {
    if (w.s.empty()) {
      w.s.resize(area);
      w.dp.resize(area);
      if (model != nullptr) {
        w.aqk.resize(area);
        w.prob.resize(area);
      }
      w.vis.resize(static_cast<size_t>(kTileK));
    }
    return w;
  };
  // The key tiles of a query tile run in waves, the tiles of a wave in parallel
  // (ComputeRoundingFloors does the same): sums over keys take each tile's product from zero
  // and add it to the running sum in tile order after the wave (C = C + t, what the product
  // does when it accumulates one k block: oracle_gemm.h); Dabs_i, a scalar sum over keys, takes
  // each tile's terms in order after the wave; the row maxima of the score error, of
  // non-negative terms, take each tile's maximum (from 0) in order. Sums over queries
  // accumulate in place: each tile owns its key rows. So the bits do not depend on the count.
  const int64_t wave = WaveSize(workers);
  const auto o_size = static_cast<size_t>(kTileQ * dv), q_size = static_cast<size_t>(kTileQ * d);
  // Per wave slot: the tile's Dabs terms [tq x tk] and score-error maxima [tq] (pass 0), or
  // its dq and o products (pass 1).
  const size_t slot_size = std::max(area + static_cast<size_t>(kTileQ), q_size + o_size);
  std::vector<double> part(static_cast<size_t>(wave) * slot_size);
  std::vector<double> o_acc, dv_acc, delta_row(static_cast<size_t>(kTileQ));
  const double rel2 = model != nullptr ? 2 * model->rel + model->rel * model->rel : 0.0;

  // Row r of a [rows, H, X] input, head h: (r * H + h) * X; consecutive rows are H * X apart.
  const int64_t ldq = hq * d, ldk = hkv * d, ldv = hkv * dv, ldo = hq * dv;
  std::vector<double> dq_acc(q_size);
  std::vector<double> dabs(static_cast<size_t>(kTileQ));
  std::vector<double> dk_acc;
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (j0, tk) of a query tile's key tiles
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const TileWalk walk(mask, kTileK);
    const Sequence& seq = mask.sequence();
    if (seq.q_len == 0 || seq.k_len == 0) continue;
    for (int64_t g = 0; g < hkv; ++g) {
      dk_acc.assign(static_cast<size_t>(seq.k_len * d), 0.0);
      if (dv_terms != nullptr) dv_acc.assign(static_cast<size_t>(seq.k_len * dv), 0.0);
      for (int64_t h = g * p.gqa_ratio(); h < (g + 1) * p.gqa_ratio(); ++h) {
        const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
        for (int64_t i0 = 0; i0 < seq.q_len; i0 += kTileQ) {
          const int64_t tq = std::min(kTileQ, seq.q_len - i0);
          const int64_t qrow0 = seq.q_begin + i0;
          std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
          // Pass 0 bounds |D_i| = |sum_d dO_id o_id| by Dabs_i = sum_j P_ij sum_d |dO_id| |v_jd|
          // (>= sum_d |dO_id| |o_id|, the size of D's own fp32 terms); pass 1 forms A.
          std::fill(dabs.begin(), dabs.end(), 0.0);
          std::fill(delta_row.begin(), delta_row.end(), 0.0);
          if (model != nullptr) o_acc.assign(o_size, 0.0);
          tiles.clear();
          walk.ForEachKeyTile(i0, tq, [&](int64_t, int64_t j0, int64_t tk) {
            tiles.emplace_back(j0, tk);
          });
          const auto key_tile = [&](int pass, int64_t slot, int64_t j0, int64_t tk, Scratch& w) {
            double* slot_data = part.data() + static_cast<size_t>(slot) * slot_size;
            double* terms_d = slot_data;          // pass 0: Dabs terms, [tq x tk]
            double* err_max = slot_data + area;   // pass 0: score-error maxima, [tq]
            double* dq_part = slot_data;          // pass 1: dq product, [tq x d]
            double* o_part = slot_data + q_size;  // pass 1: o product, [tq x dv]
            std::vector<double>& s = w.s;
            std::vector<double>& dp = w.dp;
            const int64_t krow0 = seq.k_begin + j0;
            Gemm(false, true, tq, tk, d, scale, Q + (qrow0 * hq + h) * d, ldq,
                 K + (krow0 * hkv + g) * d, ldk, 0.0, s.data(), tk);
            // |dO| |V|^T: the size of dP's fp32 terms, not the possibly cancelled |dP|.
            if (backward) {
              Gemm(false, true, tq, tk, dv, 1.0, abs_do.data() + (qrow0 * hq + h) * dv, ldo,
                   abs_v.data() + (krow0 * hkv + g) * dv, ldv, 0.0, dp.data(), tk);
            }
            if (model != nullptr && pass == 0) {
              Gemm(false, true, tq, tk, d, 1.0, abs_q.data() + (qrow0 * hq + h) * d, ldq,
                   abs_k.data() + (krow0 * hkv + g) * d, ldk, 0.0, w.aqk.data(), tk);
            }
            // s becomes P (pass 0) or A = P (|dO||v| + Dabs) (pass 1), 0 where masked.
            for (int64_t r = 0; r < tq; ++r) {
              const int64_t i = i0 + r;
              const double row_lse = LSE[LseIndex(p, b, h, seq, i)];
              double* srow = s.data() + r * tk;
              const double* dprow = dp.data() + r * tk;
              double* trow = terms_d + r * tk;
              if (pass == 0) err_max[r] = 0;
              walk.TransformRow(i, j0, tk, p.softcap, slope, srow, static_cast<double*>(nullptr),
                                w.vis.data());
              for (int64_t c = 0; c < tk; ++c) {
                if (row_lse == kNegInf || !w.vis[static_cast<size_t>(c)]) {
                  srow[c] = 0;
                  if (pass == 0) trow[c] = 0;  // adds nothing to Dabs (a sum of terms >= 0)
                  if (model != nullptr) w.prob[static_cast<size_t>(r * tk + c)] = 0;
                  continue;
                }
                const double sc = srow[c];
                const double prob = std::exp(sc - row_lse);
                if (pass == 0) {
                  trow[c] = backward ? prob * dprow[c] : 0.0;
                  if (model != nullptr) {
                    const size_t qi = static_cast<size_t>((qrow0 + r) * hq + h);
                    const size_t kj = static_cast<size_t>((krow0 + c) * hkv + g);
                    const double err =
                        abs_scale *
                        (rel2 * w.aqk[static_cast<size_t>(r * tk + c)] +
                         model->abs * (1 + model->rel) *
                             (q_max[qi] * k_l1[kj] + k_max[kj] * q_l1[qi]) +
                         model->abs * model->abs * static_cast<double>(d) * q_max[qi] *
                             k_max[kj]);
                    err_max[r] = std::max(err_max[r], err);
                  }
                } else {
                  if (model != nullptr) w.prob[static_cast<size_t>(r * tk + c)] = prob;
                  if (backward) srow[c] = prob * (dprow[c] + dabs[static_cast<size_t>(r)]);
                }
              }
            }
            if (pass == 0) return;
            if (model != nullptr) {
              Gemm(false, false, tq, dv, tk, 1.0, w.prob.data(), tk,
                   abs_v.data() + (krow0 * hkv + g) * dv, ldv, 0.0, o_part, dv);
              if (dv_terms != nullptr) {
                Gemm(true, false, tk, dv, tq, 1.0, w.prob.data(), tk,
                     abs_do.data() + (qrow0 * hq + h) * dv, ldo, 1.0,
                     dv_acc.data() + j0 * dv, dv);
              }
            }
            if (!backward) return;
            Gemm(false, false, tq, d, tk, 1.0, s.data(), tk,
                 abs_k.data() + (krow0 * hkv + g) * d, ldk, 0.0, dq_part, d);
            Gemm(true, false, tk, d, tq, 1.0, s.data(), tk,
                 abs_q.data() + (qrow0 * hq + h) * d, ldq, 1.0, dk_acc.data() + j0 * d, d);
          };
          const auto n_tiles = static_cast<int64_t>(tiles.size());
          for (int pass = 0; pass < 2; ++pass) {
            // Forward only: pass 0 is the score error alone.
            if (pass == 0 && !backward && model == nullptr) continue;
            const auto tile = [&](int64_t x, int64_t i, int worker) {
              const auto [j0, tk] = tiles[static_cast<size_t>(i)];
              key_tile(pass, x, j0, tk, ready(scratch[static_cast<size_t>(worker)]));
            };
            const auto merge = [&](int64_t x, int64_t i) {
              const double* slot_data = part.data() + static_cast<size_t>(x) * slot_size;
              const int64_t tk = tiles[static_cast<size_t>(i)].second;
              if (pass == 0) {
                for (int64_t r = 0; r < tq; ++r) {
                  const double* trow = slot_data + r * tk;
                  double& acc = dabs[static_cast<size_t>(r)];
                  if (backward) {
                    for (int64_t c = 0; c < tk; ++c) acc += trow[c];
                  }
                  if (model != nullptr) {
                    delta_row[static_cast<size_t>(r)] =
                        std::max(delta_row[static_cast<size_t>(r)], slot_data[area + r]);
                  }
                }
                return;
              }
              if (backward) {
                for (size_t e = 0; e < static_cast<size_t>(tq * d); ++e) {
                  dq_acc[e] = dq_acc[e] + slot_data[e];
                }
              }
              if (model != nullptr) {
                for (size_t e = 0; e < static_cast<size_t>(tq * dv); ++e) {
                  o_acc[e] = o_acc[e] + slot_data[q_size + e];
                }
              }
            };
            InWaves(n_tiles, wave, workers, tile, merge);
          }
          for (int64_t r = 0; r < tq; ++r) {
            const double* row = dq_acc.data() + r * d;
            const double mx = d > 0 ? *std::max_element(row, row + d) : 0.0;
            dq_terms[(qrow0 + r) * hq + h] = n_dot * abs_scale * mx;
            if (model == nullptr) continue;
            const double* orow = o_acc.data() + r * dv;
            score_err[(qrow0 + r) * hq + h] = delta_row[static_cast<size_t>(r)];
            o_terms[(qrow0 + r) * hq + h] = dv > 0 ? *std::max_element(orow, orow + dv) : 0.0;
          }
        }
      }
      for (int64_t j = 0; j < seq.k_len; ++j) {
        const double* row = dk_acc.data() + j * d;
        const double mx = d > 0 ? *std::max_element(row, row + d) : 0.0;
        dk_terms[(seq.k_begin + j) * hkv + g] = n_dot * abs_scale * mx;
        if (dv_terms == nullptr) continue;
        const double* vrow = dv_acc.data() + j * dv;
        dv_terms[(seq.k_begin + j) * hkv + g] =
            dv > 0 ? *std::max_element(vrow, vrow + dv) : 0.0;
      }
    }
  }
  if (!backward) out.dq = out.dk = Tensor();
  return out;
}

// ---- Rounding floors ----

namespace {

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
  // recipe reference (baseline.cc), which forms D from the same dO.
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
  auto qt = F64Input(q, "q", p.QShape());
  if (!qt.ok()) return qt.error();
  auto kt = F64Input(k, "k", p.KShape());
  if (!kt.ok()) return kt.error();
  auto vt = F64Input(v, "v", p.VShape());
  if (!vt.ok()) return vt.error();
  auto lt = F64Input(lse, "lse", p.LseShape());
  if (!lt.ok()) return lt.error();
  Tensor dot_t, ot, dt;
  if (backward) {
    auto x = F64Input(dout, "do", p.OShape());
    if (!x.ok()) return x.error();
    auto y = F64Input(o, "o", p.OShape());
    if (!y.ok()) return y.error();
    auto z = F64Input(delta, "delta", p.LseShape());
    if (!z.ok()) return z.error();
    dot_t = *x;
    ot = *y;
    dt = *z;
  }

  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const double* Q = qt->data<double>();
  const double* K = kt->data<double>();
  const double* V = vt->data<double>();
  const double* LSE = lt->data<double>();
  const double* DO = backward ? dot_t.data<double>() : nullptr;
  const double* O = backward ? ot.data<double>() : nullptr;
  const double* DELTA = backward ? dt.data<double>() : nullptr;
  const std::vector<double> abs_q = Abs(*qt), sq_q = Squares(*qt);
  const std::vector<double> abs_k = Abs(*kt), sq_k = Squares(*kt);
  const std::vector<double> abs_v = Abs(*vt), sq_v = Squares(*vt);
  const std::vector<double> abs_do = backward ? Abs(dot_t) : std::vector<double>();
  const std::vector<double> sq_do = backward ? Squares(dot_t) : std::vector<double>();
  const double scale = p.EffectiveScale();
  const double abs_scale = std::fabs(scale);
  const PointBound e_pv = BoundOf(points.p_pv), e_pdo = BoundOf(points.p_pdo);
  const PointBound e_ds_dq = BoundOf(points.ds_dq), e_ds_dk = BoundOf(points.ds_dk);
  const PointBound e_dp = BoundOf(points.dp);
  const PointBound e_o = BoundOf(PointOf(points.delta_o));
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  RoundingFloors out;
  out.o = Tensor::Zeros(DType::kF64, p.OShape());
  if (backward) {
    out.dq = Tensor::Zeros(DType::kF64, p.QShape());
    out.dk = Tensor::Zeros(DType::kF64, p.KShape());
    out.dv = Tensor::Zeros(DType::kF64, p.VShape());
  }
  if (!points.any()) return out;

  const int64_t ldq = hq * d, ldk = hkv * d, ldv = hkv * dv, ldo = hq * dv;
  const size_t area = static_cast<size_t>(kTileQ * kTileK);
  // Each worker's tile buffers.
  struct Scratch {
    std::vector<double> s, dp, e1, e2, e3, e4, e5, sq, th;
    std::vector<uint8_t> vis;
  };
  const int workers = oracle_internal::ThreadCount(threads);
  std::vector<Scratch> scratch(static_cast<size_t>(workers));  // allocated on first use
  const auto ready = [&](Scratch& w) -> Scratch& {
    if (w.s.empty()) {
      for (auto* x : {&w.s, &w.dp, &w.e1, &w.e2, &w.e3, &w.e4, &w.e5, &w.sq}) x->resize(area);
      w.th.resize(static_cast<size_t>(kTileK));
      w.vis.resize(static_cast<size_t>(kTileK));
    }
    return w;
  };
  // The key tiles of a query tile run in waves (4 tiles per worker, at most 64 unless there
  // are more workers), the tiles of a wave in parallel. The sums over keys (o1, o2, q1, q2,
  // qc) take, per tile, the product of the tile from zero (one k block of the oracle's
  // product: tk <= kGemmKc) and add it to the running sum in tile order, after the wave:
  // C = C + t, what the product does when it accumulates (oracle_gemm.h), so the bits do not
  // depend on the thread count. The sums over queries (k1, k2, v1, v2) accumulate in place:
  // each tile owns its key rows, and query tiles and heads run in order.
  const int64_t wave = WaveSize(workers);
  const auto o_size = static_cast<size_t>(kTileQ * dv), q_size = static_cast<size_t>(kTileQ * d);
  std::vector<double> o1(o_size), o2(o_size), q1(q_size), q2(q_size), qc(q_size);
  // Per wave slot: the tile's o1, o2, q1, q2, qc products.
  std::vector<double> part(static_cast<size_t>(wave) * (2 * o_size + 3 * q_size));
  std::vector<double> dd(static_cast<size_t>(kTileQ));
  std::vector<double> k1, k2, v1, v2;
  // Squares of the weights, for the sqrt(sum b^2) part.
  const auto square = [](const std::vector<double>& a, std::vector<double>& b, size_t n) {
    for (size_t e = 0; e < n; ++e) b[e] = a[e] * a[e];
  };
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (j0, tk) of a query tile's key tiles
  // The query rows of each sequence whose floors are computed, in tiles of up to kTileQ: all of
  // them, or the flagged ones of query_rows, gathered (their Q rows copied to qg when not
  // consecutive), so that the cost follows the sample. The other rows' floors stay 0.
  std::vector<int64_t> rows;
  std::vector<double> qg(static_cast<size_t>(kTileQ * d));
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const TileWalk walk(mask, kTileK);
    const Sequence& seq = mask.sequence();
    if (seq.q_len == 0 || seq.k_len == 0) continue;
    for (int64_t g = 0; g < hkv; ++g) {
      if (backward) {
        k1.assign(static_cast<size_t>(seq.k_len * d), 0.0);
        k2.assign(k1.size(), 0.0);
        v1.assign(static_cast<size_t>(seq.k_len * dv), 0.0);
        v2.assign(v1.size(), 0.0);
      }
      for (int64_t h = g * p.gqa_ratio(); h < (g + 1) * p.gqa_ratio(); ++h) {
        const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
        rows.clear();
        for (int64_t i = 0; i < seq.q_len; ++i) {
          if (query_rows == nullptr || (*query_rows)[static_cast<size_t>(seq.q_begin + i)] != 0) {
            rows.push_back(i);
          }
        }
        for (size_t n0 = 0; n0 < rows.size(); n0 += static_cast<size_t>(kTileQ)) {
          const int64_t* rw = rows.data() + n0;
          const int64_t tq = std::min<int64_t>(kTileQ, static_cast<int64_t>(rows.size() - n0));
          // Consecutive rows (always, with the backward): read in place from row i0 on.
          const bool consecutive = rw[tq - 1] - rw[0] == tq - 1;
          const int64_t i0 = rw[0];
          const int64_t qrow0 = seq.q_begin + i0;
          if (!consecutive) {
            for (int64_t r = 0; r < tq; ++r) {
              const double* src = Q + ((seq.q_begin + rw[r]) * hq + h) * d;
              std::copy(src, src + d, qg.data() + r * d);
            }
          }
          std::fill(o1.begin(), o1.end(), 0.0);
          std::fill(o2.begin(), o2.end(), 0.0);
          std::fill(q1.begin(), q1.end(), 0.0);
          std::fill(q2.begin(), q2.end(), 0.0);
          std::fill(qc.begin(), qc.end(), 0.0);
          // dD_i: the error of D_i = sum_d dO_id o_id when o is rounded to its output format.
          for (int64_t r = 0; r < tq; ++r) {
            double a1 = 0, a2 = 0;
            if (backward && points.delta_o) {
              for (int64_t c = 0; c < dv; ++c) {
                const int64_t at = ((qrow0 + r) * hq + h) * dv + c;
                const double a = e_o(O[at]) * std::fabs(DO[at]);
                a1 += a;
                a2 += a * a;
              }
            }
            dd[static_cast<size_t>(r)] = std::min(a1, kRoundingSigmas * std::sqrt(a2));
          }
          // The tile's products of the sums over keys (tq rows; the slot's parts).
          const auto parts = [&](int64_t slot) {
            double* o1p = part.data() + static_cast<size_t>(slot) * (2 * o_size + 3 * q_size);
            return std::array<double*, 5>{o1p, o1p + o_size, o1p + 2 * o_size,
                                          o1p + 2 * o_size + q_size, o1p + 2 * o_size + 2 * q_size};
          };
          const auto key_tile = [&](int64_t slot, int64_t j0, int64_t tk, Scratch& w) {
            const auto [o1p, o2p, q1p, q2p, qcp] = parts(slot);
            std::vector<double>& s = w.s;
            std::vector<double>& dp = w.dp;
            std::vector<double>& e1 = w.e1;
            std::vector<double>& e2 = w.e2;
            std::vector<double>& e3 = w.e3;
            std::vector<double>& e4 = w.e4;
            std::vector<double>& e5 = w.e5;
            std::vector<double>& sq = w.sq;
            const int64_t krow0 = seq.k_begin + j0;
            const size_t n = static_cast<size_t>(tq * tk);
            Gemm(false, true, tq, tk, d, scale,
                 consecutive ? Q + (qrow0 * hq + h) * d : qg.data(), consecutive ? ldq : d,
                 K + (krow0 * hkv + g) * d, ldk, 0.0, s.data(), tk);
            if (backward) {
              Gemm(false, true, tq, tk, dv, 1.0, DO + (qrow0 * hq + h) * dv, ldo,
                   V + (krow0 * hkv + g) * dv, ldv, 0.0, dp.data(), tk);
            }
            // e5: o's weights; e4: dv's; e1: dq's independent, e2: dq's shared (x dD_i), e3:
            // dk's. All 0 where masked.
            for (int64_t r = 0; r < tq; ++r) {
              const int64_t i = rw[r];
              const int64_t li = LseIndex(p, b, h, seq, i);
              const double row_lse = LSE[li];
              const double row_d = backward ? DELTA[li] : 0.0;
              const double row_dd = dd[static_cast<size_t>(r)];
              walk.TransformRow(i, j0, tk, p.softcap, slope, s.data() + r * tk, w.th.data(),
                                w.vis.data());
              for (int64_t c = 0; c < tk; ++c) {
                const size_t at = static_cast<size_t>(r * tk + c);
                if (row_lse == kNegInf || !w.vis[static_cast<size_t>(c)]) {
                  e1[at] = e2[at] = e3[at] = e4[at] = e5[at] = 0;
                  continue;
                }
                const double sc = s[at];
                double tprime = 1;
                if (p.softcap > 0) {
                  const double t = w.th[static_cast<size_t>(c)];
                  tprime = 1 - t * t;
                }
                const double prob = std::exp(sc - row_lse);
                e5[at] = e_pv(prob);
                if (!backward) continue;
                const double dpv = dp[at];
                const double ds = prob * (dpv - row_d) * tprime;
                const double pt = prob * tprime;
                e4[at] = e_pdo(prob);
                e1[at] = abs_scale * (e_ds_dq(ds) + pt * e_dp(dpv));
                e2[at] = abs_scale * pt;
                e3[at] = abs_scale * (e_ds_dk(ds) + pt * (e_dp(dpv) + row_dd));
              }
            }
            const double* av = abs_v.data() + (krow0 * hkv + g) * dv;
            const double* sv = sq_v.data() + (krow0 * hkv + g) * dv;
            Gemm(false, false, tq, dv, tk, 1.0, e5.data(), tk, av, ldv, 0.0, o1p, dv);
            square(e5, sq, n);
            Gemm(false, false, tq, dv, tk, 1.0, sq.data(), tk, sv, ldv, 0.0, o2p, dv);
            if (!backward) return;
            const double* ak = abs_k.data() + (krow0 * hkv + g) * d;
            const double* sk = sq_k.data() + (krow0 * hkv + g) * d;
            Gemm(false, false, tq, d, tk, 1.0, e1.data(), tk, ak, ldk, 0.0, q1p, d);
            square(e1, sq, n);
            Gemm(false, false, tq, d, tk, 1.0, sq.data(), tk, sk, ldk, 0.0, q2p, d);
            Gemm(false, false, tq, d, tk, 1.0, e2.data(), tk, ak, ldk, 0.0, qcp, d);
            const double* aq = abs_q.data() + (qrow0 * hq + h) * d;
            const double* sqq = sq_q.data() + (qrow0 * hq + h) * d;
            Gemm(true, false, tk, d, tq, 1.0, e3.data(), tk, aq, ldq, 1.0, k1.data() + j0 * d, d);
            square(e3, sq, n);
            Gemm(true, false, tk, d, tq, 1.0, sq.data(), tk, sqq, ldq, 1.0, k2.data() + j0 * d, d);
            const double* ado = abs_do.data() + (qrow0 * hq + h) * dv;
            const double* sdo = sq_do.data() + (qrow0 * hq + h) * dv;
            Gemm(true, false, tk, dv, tq, 1.0, e4.data(), tk, ado, ldo, 1.0, v1.data() + j0 * dv,
                 dv);
            square(e4, sq, n);
            Gemm(true, false, tk, dv, tq, 1.0, sq.data(), tk, sdo, ldo, 1.0, v2.data() + j0 * dv,
                 dv);
          };
          tiles.clear();
          const auto collect = [&](int64_t, int64_t j0, int64_t tk) { tiles.emplace_back(j0, tk); };
          if (consecutive) {
            walk.ForEachKeyTile(i0, tq, collect);
          } else {
            walk.ForEachKeyTileOfRows(rw, tq, collect);
          }
          const auto add = [](std::vector<double>& acc, const double* t, size_t n) {
            for (size_t e = 0; e < n; ++e) acc[e] = acc[e] + t[e];
          };
          const auto n_tiles = static_cast<int64_t>(tiles.size());
          InWaves(
              n_tiles, wave, workers,
              [&](int64_t x, int64_t i, int worker) {
                const auto [j0, tk] = tiles[static_cast<size_t>(i)];
                key_tile(x, j0, tk, ready(scratch[static_cast<size_t>(worker)]));
              },
              [&](int64_t x, int64_t) {
                const auto [o1p, o2p, q1p, q2p, qcp] = parts(x);
                add(o1, o1p, static_cast<size_t>(tq * dv));
                add(o2, o2p, static_cast<size_t>(tq * dv));
                if (!backward) return;
                add(q1, q1p, static_cast<size_t>(tq * d));
                add(q2, q2p, static_cast<size_t>(tq * d));
                add(qc, qcp, static_cast<size_t>(tq * d));
              });
          double* of = out.o.data<double>();
          for (int64_t r = 0; r < tq; ++r) {
            for (int64_t c = 0; c < dv; ++c) {
              const size_t at = static_cast<size_t>(r * dv + c);
              of[((seq.q_begin + rw[r]) * hq + h) * dv + c] =
                  std::min(o1[at], kRoundingSigmas * std::sqrt(o2[at]));
            }
          }
          if (!backward) continue;
          double* qf = out.dq.data<double>();
          for (int64_t r = 0; r < tq; ++r) {
            for (int64_t c = 0; c < d; ++c) {
              const size_t at = static_cast<size_t>(r * d + c);
              qf[((qrow0 + r) * hq + h) * d + c] =
                  std::min(q1[at], kRoundingSigmas * std::sqrt(q2[at])) +
                  dd[static_cast<size_t>(r)] * qc[at];
            }
          }
        }
      }
      if (!backward) continue;
      std::vector<double> kf(k1.size()), vf(v1.size());
      Combine(k1, k2, kf.data());
      Combine(v1, v2, vf.data());
      double* dkf = out.dk.data<double>();
      double* dvf = out.dv.data<double>();
      for (int64_t j = 0; j < seq.k_len; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          dkf[((seq.k_begin + j) * hkv + g) * d + c] = kf[static_cast<size_t>(j * d + c)];
        }
        for (int64_t c = 0; c < dv; ++c) {
          dvf[((seq.k_begin + j) * hkv + g) * dv + c] = vf[static_cast<size_t>(j * dv + c)];
        }
      }
    }
  }
  return out;
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
