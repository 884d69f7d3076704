// Vectorisable row kernels for the float64 oracle's softmax tiles (oracle_double.cc;
// docs/design.md "Oracle"): an exp, and the fused per-row passes of the forward and backward that
// use it. glibc's scalar exp costs ~8-10 ns per score on this class of machine, as much as
// the matrix-product work of a D = 64 score, and separate passes over a tile row cost as much again,
// so the tiles use these kernels. Every kernel is compiled once per ISA level and picked at
// load time; each version performs the same IEEE operations in the same order (no FMA
// contraction, fixed lane structure), so results do not depend on the machine's ISA.
//
// exp accuracy: at most 1 ulp for results in the normal range (measured against MPFR in
// oracle_test.cc), which is what ErrorBound assumes of exp.
//
// Method (fdlibm e_exp.c, Tang 1989): k = round(x / ln 2), r = x - k ln2_hi - k ln2_lo with
// the Cody-Waite split of ln 2 (ln2_hi has 32 trailing zero bits, so k ln2_hi is exact for
// |k| < 2^20), |r| <= ln(2)/2; exp(r) by its Taylor polynomial to degree 13 (truncation
// < 0.35^14 / 14! = 5e-18 relative); then the exact scaling by 2^k built from its bits.
// Results below 2^-1022 are scaled in two steps (so subnormals come out, once rounded);
// x < -745.2 gives 0, NaN stays NaN, x > 709.78 gives +inf. The row kernels take blocks of
// eight arguments that all lie in [-708, 709] through a shorter path without the clamps and
// the two-step scalings, which are exact there: the same bits, ~25 % fewer operations.
//
// Sums use kSumLanes independent compensated accumulators (Knuth TwoSum feeding a running
// compensation per lane, Ogita-Rump-Oishi Sum2), combined in lane order by TwoSum at the
// end: the result is the compensated sum of a fixed re-association of the terms, so Sum2's
// bound |error| <= u |sum| + gamma_{n-1}^2 sum |x_i| holds unchanged (Higham §4.3), and the
// lanes break the serial dependence of one TwoSum chain (4 dependent additions per term).
#pragma once

#include <cstdint>

namespace attest::oracle_internal {

constexpr int kSumLanes = 8;

// x[e] = exp(x[e]) for e in [0, n).
void ExpInPlace(double* x, int64_t n);

// A compensated sum: the value is sum + comp (comp carries the rounding errors of sum).
struct CompensatedSum {
  double sum = 0;
  double comp = 0;
};

// Forward row: p[e] = exp(x[e] - shift) for e in [0, n) (-inf entries give 0), and the
// compensated sum of the p[e], in kSumLanes lanes (lane of e: e % kSumLanes). x is left
// as it is (the backward may reuse it); p must not overlap x.
CompensatedSum ExpShiftSum(const double* x, double* p, int64_t n, double shift);

// Backward row: p[e] = exp(s[e] - lse), dp[e] = p[e] (dp[e] - delta), mass[e] += p[e],
// seen[e] += (s[e] is not -inf), for e in [0, n). s is left as it is; no two of the arrays
// may overlap.
void BackwardRow(const double* s, double* p, double* dp, int64_t n, double lse, double delta,
                 double* mass, int64_t* seen);

// Statistics of a transformed score row x[0, n) whose -inf entries are masked: returns the
// number of visible (not -inf) entries; *max gets their maximum (-inf if none; NaN entries
// are ignored, as std::max(max, NaN) does), *norm_max the maximum of norm[e] over the
// visible entries (0 if none).
int64_t RowStats(const double* x, const double* norm, int64_t n, double* max, double* norm_max);

}  // namespace attest::oracle_internal
