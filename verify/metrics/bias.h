// The statistic of the bias check (verify/checks/bias.h; docs/checks.md "Bias"): whether the
// signed errors of one output tensor, in units of the local ulp of the kernel's output format,
// have a mean that differs from the mean a reference of the same recipe implies by more than a
// tolerance. Elementwise bounds cannot see this: a kernel that truncates every output stays
// within one ulp of the float64 oracle everywhere and still shrinks every value.
//
// Per element i (finite observed x, oracle r, expected e) the unit is u_i = max(Quantum(r_i,
// F), Quantum(2^-8 · max_block |r|, F)): the ulp of the output format F at the oracle value
// (verify/metrics/metrics.h Quantum), floored at the ulp of 2^-8 of the largest |oracle| of the
// element's block. Below that, a value is a cancellation whose error the fp32 arithmetic sets,
// not the output's rounding: in its own ulps it would be thousands, and a few such elements
// would decide the mean. Then:
//   error     z_i = (x_i - r_i) / u_i          the kernel's signed error in ulps
//   expected  y_i = (e_i - r_i) / u_i          the recipe reference's signed error in ulps
//   excess    d_i = z_i - y_i                  (signed direction), d_i · sign(r_i) (radial:
//                                              positive away from zero, negative toward it)
// Exact elements: an observed value bit-equal to the oracle (a masked row's 0, a value the
// format holds exactly) was not rounded; it says nothing about a rounding's direction and is
// left out of the sample (counted as exact). Ties: an observed value bit-equal to the expected
// one (but not to the oracle) has d_i = 0 exactly; it is kept (evidence of no excess bias) and
// counted, as a sign test counts its ties. An element whose oracle is 0 has no radial direction
// and is a tie there.
//
// Correlation: errors of one row share its softmax statistics (its max, its sum, its lse), so
// elements are not independent. The test runs on block means: a block is `block` consecutive
// elements of the flattened tensor (one row of one head: D or Dv values; for lse one
// (batch, head)'s run of 8 queries). The block means are treated as independent and,
// by the central limit theorem over the block, normal; the Student t statistic of their mean
// has n_blocks - 1 degrees of freedom.
//
// The test, per direction: H0 |mean excess| <= tolerance. It rejects when
//   |m| - t_{1 - alpha/4, n_blocks - 1} · s / sqrt(n_blocks) > tolerance,
// m the mean of the block means and s their standard deviation: a one-sided test on each side
// of each of the two directions at alpha/4, so that the probability that a tensor whose excess
// bias is within the tolerance in both directions fails is at most alpha (Bonferroni). The
// verdict's margin is that lower confidence bound of |m| over the tolerance (<= 1 passes).
// Below a minimum sample size (too few blocks or too few elements with an error) it abstains.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "reference/formats/format.h"

namespace attest {

struct BiasOptions {
  // Allowed excess bias, in ulps of the output format: below the 0.5 ulp that one directed
  // rounding of the output adds and the ~0.4 ulp that P truncated before P·V leaves in o, above
  // the largest systematic excess of a correct CPU model (docs/checks.md "Bias").
  double tolerance_ulps = 0.2;
  // The same for an output not rounded to a narrower format than its arithmetic (lse: fp32 as
  // computed): its error is that arithmetic's, in which one rounded constant (the scale times
  // log2 e) shifts every value of a case alike, and hardware log and exp2 approximations add
  // their own (docs/checks.md "Bias").
  double tolerance_ulps_unrounded = 1.0;
  // False-alarm probability per verdict (per tensor, both directions, both sides).
  double alpha = 1e-6;
  // Abstain below these: blocks (the t statistic's sample) and elements with an error.
  int64_t min_blocks = 32;
  int64_t min_elements = 512;
};

// One direction's summary.
struct BiasDirection {
  double mean_error = 0;     // mean z (signed) or z · sign(r) (radial), in ulps: the kernel's bias
  double mean_expected = 0;  // the same of the expected reference
  double mean_excess = 0;    // mean of the block means of d
  double stderr_excess = 0;  // their standard deviation / sqrt(blocks)
  double lower_bound = 0;    // max(0, |mean_excess| - t · stderr_excess)
  int64_t positive = 0, negative = 0, ties = 0;  // signs of d_i (the sign counts of a sign test)
};

struct BiasJudgement {
  int64_t elements = 0;  // elements judged (finite observed, oracle and expected; not exact)
  int64_t exact = 0;     // elements left out: observed bit-equal to the oracle
  int64_t skipped = 0;   // elements left out: a non-finite value on either side
  int64_t blocks = 0;    // blocks with at least one judged element
  double t_critical = 0;  // t_{1 - alpha/4, blocks - 1}
  BiasDirection signed_dir, radial;
  bool abstained = false;
  std::string abstain_reason;  // set when abstained
  double margin = 0;           // max over the directions of lower_bound / tolerance
  bool pass = true;            // margin <= 1 (true when abstained: no verdict is issued)
  int64_t worst = -1;          // flat index of the element with the largest |d| (-1: none)
};

// The statistic over flat, equally shaped f64 spans. `block` >= 1.
BiasJudgement ComputeBias(std::span<const double> observed, std::span<const double> oracle,
                     std::span<const double> expected, Format format, int64_t block,
                     const BiasOptions& options = {});

// The Student t distribution's upper quantile: t with P(T > t) = p for `dof` degrees of
// freedom (0 < p < 1/2, dof >= 1). Exposed for its test.
double StudentTUpperQuantile(double p, double dof);
// P(T > t) for t >= 0.
double StudentTUpperTail(double t, double dof);

// "mean error -0.498 ulp (expected +0.002), radial -0.501 (expected -0.001); excess ..." for
// verdict messages.
std::string DescribeBias(const BiasJudgement& s, std::string_view format_name);

}  // namespace attest
