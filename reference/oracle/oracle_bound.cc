// Certification bound of the oracle (oracle.h ErrorBound): a first-order worst-case bound on
// |computed - exact| per output, from the magnitudes in OracleStats. Standard model of
// floating-point arithmetic, fl(x op y) = (x op y)(1 + d), |d| <= u, and any-order sums
// and dot products of length n erring by at most gamma_n ~ n u times the sum of absolute
// values (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §2.2, §3.1);
// exp within one ulp, i.e. 2u relative (oracle_exp.h in the float64 tiles: at most 0.962 ulp
// from the exact value over 2.2 million arguments and every reduction boundary in
// oracle_kernels_test.cc; MPFR correctly rounded), log and tanh of glibc within one ulp.
// The softmax denominator's lane-compensated sum (oracle_exp.h) keeps Sum2's bound.
//
// Notation: u unit roundoff, D / Dv head dims, a = score_abs_max, V = v_norm_max,
// G = do_norm_max, Vinf/Ginf/Qinf/Kinf max-abs, c = col_mass_max, Lk / Lq the longest
// accumulation chains over keys / over (query, head) pairs, L = lse_abs_max.
//
// 1. Scores: s = cap tanh(scale q.k / cap) - slope |dist|. The dot product errs by
//    D u scale |q||k| <= D u a (Cauchy-Schwarz), the scale product, tanh and the ALiBi
//    product and subtraction add a few u a:   eps_s = (D + 4) u (a + 1).
// 2. Normalised weights w_ij = exp(s_ij - m_i) / l_i: the score errors enter twice (numerator
//    and the sum l), the subtraction s - m errs by u|s - m| <= 2 a u (twice), exp by 2u
//    (twice), the online-softmax rescaling factors exp(m_old - m_new) by u|dm| + 2u with
//    sum |dm| <= 2a over at most Lk rescales (twice), the compensated sum l by 2u, the
//    division by u:
//      eta = 2 eps_s + (8 a + 4 Lk + 10) u,  |w^ - w| <= eta w.
// 3. o_i = sum_j w_ij v_j: |do_i| <= (eta + (Lk + 2) u) Vinf  (weights sum to 1).
// 4. lse = m + log l: eps_s + (4 a + 2 Lk + 6) u (relative error of l) + u |log l| (<= 50 u for
//    rows of < 2^72 keys) + 2 u (|lse| + a) for the final additions.
// 5. Backward weights p = exp(s - lse): theta = eps_s + bound(lse) + (a + L + 2) u.
//    dp = dO.v: (Dv + 1) u G V. Delta = dO.o: G V (eta + (Lk + 4) u) (error of o in 2-norm,
//    plus the compensated dot product). |dp - Delta| <= 2 G V. With softcap, the derivative
//    1 - tanh^2 errs absolutely by 2 (eps_s / cap + 2 u). Altogether
//      |ds^ - ds| <= p G V kappa,
//      kappa = 2 theta + (Dv + 1) u + (eta + (Lk + 4) u) + 4 u [+ 4 (eps_s / cap + 2 u)].
// 6. dq_i = scale sum_j ds_ij k_j, sum_j |ds_ij| <= 2 G V:
//      scale Kinf G V (kappa + 2 (Lk + 2) u).
//    dk_j = scale sum_(h,i) ds_ij q_i, sum_(h,i) p_ij <= c:
//      scale Qinf G V c (kappa + 2 (Lq + 2) u).
//    dv_j = sum_(h,i) p_ij dO_i:   c Ginf (theta + (Lq + 1) u).
//    delta:                        G V (eta + (Lk + 4) u).
// 7. Learnable sink (OracleStats::sink_*): the sink is a logit without a value, exact (an
//    input), so it is a score of magnitude <= s_abs without a dot product: a becomes
//    max(a, s_abs), and a finite sink is one more term of l (sum_len_k counts it). Its
//    fold into the finished row (oracle_double.cc FinishRow: m' = max(m, sink), one
//    rescale exp(m - m') and one exp(sink - m')) is one more rescale and exp of step 2.
//    dsink_h = -sum_i w_i delta_i with w_i = exp(sink_h - lse_i) <= 1: w_i errs by theta
//    w_i, delta_i by G V (eta + (Lk + 4) u), and the sum of Ls terms by (Ls + 1) u of
//    sum |w_i delta_i| <= S G V (S = sink_mass_max):
//      dsink:                      S G V (theta + eta + (Lk + 4) u + (Ls + 2) u).
// 8. Learnable relative bias (OracleStats::rel_bias_*): s_ij gains b_ij, an exact input with
//    |b| <= b_abs, added last: a becomes a + b_abs and the addition is one more rounding of
//    a score, eps_s = (D + 5) u (a + 1) (the softcap derivative's argument is unchanged).
//    drel_bias_(h,d) = sum of dS_ij over the pairs of diagonal d of head h, over batch and
//    rows: each errs by p G V kappa (step 5), and sum |dS| <= 2 G V sum p <= 2 R G V
//    (R = rel_bias_mass_max); the sum of at most Lr terms (rel_bias_terms, the per-sequence
//    sums and their sum over the batch counted) adds (Lr + 1) u of it:
//      drel_bias:                  R G V (kappa + 2 (Lr + 1) u).
// Every bound is doubled to cover second-order terms (products of the first-order ones,
// gamma_n's 1/(1 - n u)), which are below 1% of the first-order terms for n u < 1e-3.
#include <algorithm>
#include <cmath>

#include "reference/oracle/oracle.h"

namespace attest {

double ErrorBound(const OracleStats& s, OracleTensor t) {
  constexpr double kSafety = 2.0;
  const double u = s.unit_roundoff;
  const double a = std::max(s.score_abs_max + s.rel_bias_abs_max, s.sink_abs_max);
  const double lk = static_cast<double>(s.sum_len_k);
  const double lq = static_cast<double>(s.sum_len_q);
  const double d = static_cast<double>(s.head_dim);
  const double dv = static_cast<double>(s.head_dim_v);
  const double eps_s = (d + 4 + (s.rel_bias_abs_max > 0 ? 1 : 0)) * u * (a + 1);
  const double eta = 2 * eps_s + (8 * a + 4 * lk + 10) * u;
  const double lse = eps_s + (4 * a + 2 * lk + 6) * u + 50 * u + 2 * u * (s.lse_abs_max + a);
  const double theta = eps_s + lse + (a + s.lse_abs_max + 2) * u;
  const double gv = s.do_norm_max * s.v_norm_max;
  const double delta = eta + (lk + 4) * u;
  double kappa = 2 * theta + (dv + 1) * u + delta + 4 * u;
  if (s.softcap > 0) kappa += 4 * (eps_s / s.softcap + 2 * u);
  const double scale = std::abs(s.scale);
  double bound = 0;
  switch (t) {
    case OracleTensor::kO:
      bound = (eta + (lk + 2) * u) * s.v_abs_max;
      break;
    case OracleTensor::kLse:
      bound = lse;
      break;
    case OracleTensor::kDq:
      bound = scale * s.k_abs_max * gv * (kappa + 2 * (lk + 2) * u);
      break;
    case OracleTensor::kDk:
      bound = scale * s.q_abs_max * gv * s.col_mass_max * (kappa + 2 * (lq + 2) * u);
      break;
    case OracleTensor::kDv:
      bound = s.col_mass_max * s.do_abs_max * (theta + (lq + 1) * u);
      break;
    case OracleTensor::kDelta:
      bound = gv * delta;
      break;
    case OracleTensor::kDsink:
      bound = s.sink_mass_max * gv *
              (theta + delta + (static_cast<double>(s.sink_rows) + 2) * u);
      break;
    case OracleTensor::kDrelBias:
      bound = s.rel_bias_mass_max * gv *
              (kappa + 2 * (static_cast<double>(s.rel_bias_terms) + 1) * u);
      break;
  }
  return kSafety * bound;
}

}  // namespace attest
