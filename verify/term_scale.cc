// Gradient term magnitudes (see term_scale.h; issue 8; DESIGN.md "Semantics" for P and the
// mask). Loop order per (batch, kv head, query head in the group, query tile, key tile):
// S = scale Q_t K_t^T, P = exp(transform(S) - lse) on visible entries, dP = dO_t V_t^T,
// A = P (|dO||V|^T + Dabs) with Dabs_i = sum_j P_ij (|dO||V|^T)_ij, then dq_acc += A |K_t|
// and dk_acc += A^T |Q_t| (dgemm each); the result is multiplied by Dv (see below).
#include "verify/term_scale.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/formats/format.h"
#include "reference/problem/mask.h"

namespace attest {
namespace {

constexpr int64_t kTileQ = 64;
constexpr int64_t kTileK = 256;

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
                                                       const Tensor& delta) {
  if (Status st = Validate(p); !st.ok()) return st.error();
  auto qt = F64Input(q, "q", p.QShape());
  if (!qt.ok()) return qt.error();
  auto kt = F64Input(k, "k", p.KShape());
  if (!kt.ok()) return kt.error();
  auto vt = F64Input(v, "v", p.VShape());
  if (!vt.ok()) return vt.error();
  auto dot = F64Input(dout, "do", p.OShape());
  if (!dot.ok()) return dot.error();
  auto lt = F64Input(lse, "lse", p.LseShape());
  if (!lt.ok()) return lt.error();
  auto dt = F64Input(delta, "delta", p.LseShape());
  if (!dt.ok()) return dt.error();

  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const double* Q = qt->data<double>();
  const double* K = kt->data<double>();
  const double* V = vt->data<double>();
  const double* DO = dot->data<double>();
  const double* LSE = lt->data<double>();
  const double* DELTA = dt->data<double>();
  const std::vector<double> abs_q = Abs(*qt);
  const std::vector<double> abs_k = Abs(*kt);
  const std::vector<double> abs_v = Abs(*vt);
  const std::vector<double> abs_do = Abs(*dot);
  (void)V;
  (void)DO;
  (void)DELTA;
  const double scale = p.EffectiveScale();
  const double abs_scale = std::fabs(scale);
  // dS = P (dP - D) cancels two fp32 dot products of length Dv; Higham's gamma_n bound for
  // a length-n dot product is ~ n u sum |terms|, so the magnitude carries the factor Dv and
  // the policy asks for a few fp32 ULPs of it (verify/tolerance.cc, FloorScale::kTerms).
  const double n_dot = static_cast<double>(std::max<int64_t>(dv, 1));
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  GradientTermScales out;
  out.dq = Tensor::Zeros(DType::kF64, {p.TotalQ(), hq});
  out.dk = Tensor::Zeros(DType::kF64, {p.TotalK(), hkv});
  double* dq_terms = out.dq.data<double>();
  double* dk_terms = out.dk.data<double>();

  // Row r of a [rows, H, X] input, head h: (r * H + h) * X; consecutive rows are H * X apart.
  const int64_t ldq = hq * d, ldk = hkv * d, ldv = hkv * dv, ldo = hq * dv;
  std::vector<double> s(static_cast<size_t>(kTileQ * kTileK));
  std::vector<double> dp(s.size());
  std::vector<double> dq_acc(static_cast<size_t>(kTileQ * d));
  std::vector<double> dabs(static_cast<size_t>(kTileQ));
  std::vector<double> dk_acc;
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence& seq = mask.sequence();
    if (seq.q_len == 0 || seq.k_len == 0) continue;
    for (int64_t g = 0; g < hkv; ++g) {
      dk_acc.assign(static_cast<size_t>(seq.k_len * d), 0.0);
      for (int64_t h = g * p.gqa_ratio(); h < (g + 1) * p.gqa_ratio(); ++h) {
        const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
        for (int64_t i0 = 0; i0 < seq.q_len; i0 += kTileQ) {
          const int64_t tq = std::min(kTileQ, seq.q_len - i0);
          const int64_t qrow0 = seq.q_begin + i0;
          std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
          // Pass 0 bounds |D_i| = |sum_d dO_id o_id| by Dabs_i = sum_j P_ij sum_d |dO_id| |v_jd|
          // (>= sum_d |dO_id| |o_id|, the size of D's own fp32 terms); pass 1 forms A.
          std::fill(dabs.begin(), dabs.end(), 0.0);
          for (int pass = 0; pass < 2; ++pass) {
            for (int64_t j0 = 0; j0 < seq.k_len; j0 += kTileK) {
              const int64_t tk = std::min(kTileK, seq.k_len - j0);
              const int64_t krow0 = seq.k_begin + j0;
              // Skip a tile no query of the block sees (causal / window bands).
              bool any = false;
              for (int64_t r = 0; r < tq && !any; ++r) {
                const auto [lo, hi] = mask.KeyBounds(i0 + r);
                any = std::max(lo, j0) < std::min(hi, j0 + tk);
              }
              if (!any) continue;
              Gemm(false, true, tq, tk, d, scale, Q + (qrow0 * hq + h) * d, ldq,
                   K + (krow0 * hkv + g) * d, ldk, 0.0, s.data(), tk);
              // |dO| |V|^T: the size of dP's fp32 terms, not the possibly cancelled |dP|.
              Gemm(false, true, tq, tk, dv, 1.0, abs_do.data() + (qrow0 * hq + h) * dv, ldo,
                   abs_v.data() + (krow0 * hkv + g) * dv, ldv, 0.0, dp.data(), tk);
              // s becomes P (pass 0) or A = P (|dO||v| + Dabs) (pass 1), 0 where masked.
              for (int64_t r = 0; r < tq; ++r) {
                const int64_t i = i0 + r;
                const double row_lse = LSE[LseIndex(p, b, h, seq, i)];
                const auto [lo, hi] = mask.KeyBounds(i);
                double* srow = s.data() + r * tk;
                const double* dprow = dp.data() + r * tk;
                for (int64_t c = 0; c < tk; ++c) {
                  const int64_t j = j0 + c;
                  const bool visible = row_lse != kNegInf && j >= lo && j < hi &&
                                       (mask.interval_only() || mask.Visible(i, j));
                  if (!visible) {
                    srow[c] = 0;
                    continue;
                  }
                  const double sc =
                      TransformScore(srow[c], p.softcap, slope, mask.AlibiDistance(i, j));
                  const double prob = std::exp(sc - row_lse);
                  if (pass == 0) {
                    dabs[static_cast<size_t>(r)] += prob * dprow[c];
                  } else {
                    srow[c] = prob * (dprow[c] + dabs[static_cast<size_t>(r)]);
                  }
                }
              }
              if (pass == 0) continue;
              Gemm(false, false, tq, d, tk, 1.0, s.data(), tk,
                   abs_k.data() + (krow0 * hkv + g) * d, ldk, 1.0, dq_acc.data(), d);
              Gemm(true, false, tk, d, tq, 1.0, s.data(), tk,
                   abs_q.data() + (qrow0 * hq + h) * d, ldq, 1.0, dk_acc.data() + j0 * d, d);
            }
          }
          for (int64_t r = 0; r < tq; ++r) {
            const double* row = dq_acc.data() + r * d;
            const double mx = d > 0 ? *std::max_element(row, row + d) : 0.0;
            dq_terms[(qrow0 + r) * hq + h] = n_dot * abs_scale * mx;
          }
        }
      }
      for (int64_t j = 0; j < seq.k_len; ++j) {
        const double* row = dk_acc.data() + j * d;
        const double mx = d > 0 ? *std::max_element(row, row + d) : 0.0;
        dk_terms[(seq.k_begin + j) * hkv + g] = n_dot * abs_scale * mx;
      }
    }
  }
  return out;
}

}  // namespace attest
