// A vectorisable exp for the float64 oracle's softmax tiles (oracle_double.cc): glibc's
// scalar exp costs ~8-10 ns per score on this class of machine, as much as the dgemm work
// of a D = 64 score, so the tiles use this kernel instead. Accuracy: at most 1 ulp for
// results in the normal range (measured against MPFR in oracle_test.cc), which is what
// ErrorBound assumes of exp.
//
// Method (fdlibm e_exp.c, Tang 1989): k = round(x / ln 2), r = x - k ln2_hi - k ln2_lo with
// the Cody-Waite split of ln 2 (ln2_hi has 32 trailing zero bits, so k ln2_hi is exact for
// |k| < 2^20), |r| <= ln(2)/2; exp(r) by its Taylor polynomial to degree 13 (truncation
// < 0.35^14 / 14! = 5e-18 relative); then the exact scaling by 2^k built from its bits.
// Results below 2^-1022 are scaled in two steps (so subnormals come out, once rounded);
// x < -745.2 gives 0, NaN stays NaN, x > 709.78 gives +inf.
#pragma once

#include <cstdint>

namespace attest::oracle_internal {

// x[e] = exp(x[e]) for e in [0, n).
void ExpInPlace(double* x, int64_t n);

}  // namespace attest::oracle_internal
