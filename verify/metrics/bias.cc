// The bias statistic (see bias.h).
#include "verify/metrics/bias.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "verify/metrics/metrics.h"

namespace attest {
namespace {

// The continued fraction of the regularised incomplete beta function I_x(a, b) (DLMF 8.17.22),
// evaluated by the modified Lentz method (Lentz, Applied Optics 15 (1976) 668; Thompson and
// Barnett, J. Comput. Phys. 64 (1986) 490). Converges fast for x < (a + 1) / (a + b + 2).
double BetaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  constexpr double kEps = 1e-15;
  double c = 1.0;
  double d = 1.0 - (a + b) * x / (a + 1.0);
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1.0 / d;
  double f = d;
  for (int m = 1; m <= 10000; ++m) {
    // d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m)), d_{2m+1} = -(a + m)(a + b + m) x /
    // ((a + 2m)(a + 2m + 1)).
    const double m2 = 2.0 * m;
    for (const double coef : {m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                              -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))}) {
      d = 1.0 + coef * d;
      if (std::fabs(d) < kTiny) d = kTiny;
      c = 1.0 + coef / c;
      if (std::fabs(c) < kTiny) c = kTiny;
      d = 1.0 / d;
      f *= c * d;
    }
    if (std::fabs(c * d - 1.0) < kEps) break;
  }
  return f;
}

// I_x(a, b), the regularised incomplete beta function.
double RegularisedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double log_front = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                           a * std::log(x) + b * std::log1p(-x);
  const double front = std::exp(log_front);
  // I_x(a, b) = 1 - I_{1-x}(b, a): use the side where the fraction converges.
  if (x < (a + 1.0) / (a + b + 2.0)) return front * BetaContinuedFraction(a, b, x) / a;
  return 1.0 - front * BetaContinuedFraction(b, a, 1.0 - x) / b;
}

// The floor of the unit relative to the block's largest |oracle| (see bias.h).
constexpr double kUnitFloor = 0x1p-8;

struct Accum {
  double sum = 0;
  int64_t n = 0;
};

// Mean and standard error of block means (blocks with no element are left out).
void BlockMoments(const std::vector<Accum>& blocks, double& mean, double& se, int64_t& used) {
  double s = 0;
  used = 0;
  for (const Accum& b : blocks) {
    if (b.n == 0) continue;
    s += b.sum / static_cast<double>(b.n);
    ++used;
  }
  mean = used > 0 ? s / static_cast<double>(used) : 0.0;
  double ss = 0;
  for (const Accum& b : blocks) {
    if (b.n == 0) continue;
    const double dm = b.sum / static_cast<double>(b.n) - mean;
    ss += dm * dm;
  }
  se = used > 1 ? std::sqrt(ss / static_cast<double>(used - 1) / static_cast<double>(used)) : 0.0;
}

}  // namespace

double StudentTUpperTail(double t, double dof) {
  if (t <= 0) return 0.5;
  // P(T > t) = I_{dof / (dof + t^2)}(dof / 2, 1 / 2) / 2 (DLMF 8.17.2 with the t CDF).
  return 0.5 * RegularisedBeta(dof / 2.0, 0.5, dof / (dof + t * t));
}

double StudentTUpperQuantile(double p, double dof) {
  double lo = 0, hi = 1;
  while (StudentTUpperTail(hi, dof) > p && hi < 1e12) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (StudentTUpperTail(mid, dof) > p ? lo : hi) = mid;
  }
  return hi;
}

BiasJudgement ComputeBias(std::span<const double> observed, std::span<const double> oracle,
                     std::span<const double> expected, Format format, int64_t block,
                     const BiasOptions& options) {
  BiasJudgement s;
  const size_t n = observed.size();
  block = std::max<int64_t>(block, 1);
  const size_t nblocks = (n + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  std::vector<Accum> sb(nblocks), rb(nblocks);
  // The unit of each block: the ulp at the oracle value, floored at the ulp of kUnitFloor
  // times the block's largest |oracle| (see bias.h).
  std::vector<double> floor_unit(nblocks, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(oracle[i])) {
      double& m = floor_unit[i / static_cast<size_t>(block)];
      m = std::max(m, std::fabs(oracle[i]));
    }
  }
  for (double& m : floor_unit) m = Quantum(m * kUnitFloor, format);
  double sum_z = 0, sum_y = 0, sum_zr = 0, sum_yr = 0, worst = -1;
  for (size_t i = 0; i < n; ++i) {
    const double x = observed[i], r = oracle[i], e = expected[i];
    if (!std::isfinite(x) || !std::isfinite(r) || !std::isfinite(e)) {
      ++s.skipped;
      continue;
    }
    if (x == r) {  // bit-equal to the oracle: nothing was rounded, no direction to judge
      ++s.exact;
      continue;
    }
    ++s.elements;
    const double u = std::max(Quantum(r, format), floor_unit[i / static_cast<size_t>(block)]);
    const double z = (x - r) / u, y = (e - r) / u;
    // Bit-equal observed and expected values: d is exactly 0 (a tie), whatever z is.
    const double d = x == e ? 0.0 : z - y;
    const double sign = r > 0 ? 1.0 : r < 0 ? -1.0 : 0.0;
    const double dr = d * sign;
    sum_z += z;
    sum_y += y;
    sum_zr += z * sign;
    sum_yr += y * sign;
    const size_t b = i / static_cast<size_t>(block);
    sb[b].sum += d;
    ++sb[b].n;
    rb[b].sum += dr;
    ++rb[b].n;
    for (auto [v, dir] : {std::pair{d, &s.signed_dir}, std::pair{dr, &s.radial}}) {
      if (v > 0) ++dir->positive;
      else if (v < 0) ++dir->negative;
      else ++dir->ties;
    }
    if (std::fabs(d) > worst) {
      worst = std::fabs(d);
      s.worst = static_cast<int64_t>(i);
    }
  }
  const double ne = std::max<double>(1.0, static_cast<double>(s.elements));
  s.signed_dir.mean_error = sum_z / ne;
  s.signed_dir.mean_expected = sum_y / ne;
  s.radial.mean_error = sum_zr / ne;
  s.radial.mean_expected = sum_yr / ne;
  int64_t used = 0;
  BlockMoments(sb, s.signed_dir.mean_excess, s.signed_dir.stderr_excess, used);
  BlockMoments(rb, s.radial.mean_excess, s.radial.stderr_excess, used);
  s.blocks = used;
  if (s.blocks < options.min_blocks || s.elements < options.min_elements) {
    s.abstained = true;
    s.abstain_reason = fmt::format(
        "{} elements in {} blocks ({} exact, {} not finite): below the minimum sample ({} "
        "elements, {} blocks)",
        s.elements, s.blocks, s.exact, s.skipped, options.min_elements, options.min_blocks);
    return s;
  }
  s.t_critical = StudentTUpperQuantile(options.alpha / 4.0, static_cast<double>(s.blocks - 1));
  s.margin = 0;
  for (BiasDirection* dir : {&s.signed_dir, &s.radial}) {
    dir->lower_bound =
        std::max(0.0, std::fabs(dir->mean_excess) - s.t_critical * dir->stderr_excess);
    s.margin = std::max(s.margin, dir->lower_bound / options.tolerance_ulps);
  }
  s.pass = s.margin <= 1.0;
  return s;
}

std::string DescribeBias(const BiasJudgement& s, std::string_view format_name) {
  const BiasDirection& a = s.signed_dir;
  const BiasDirection& r = s.radial;
  return fmt::format(
      "mean signed error {:+.4f} {} ulp (expected {:+.4f}), radial {:+.4f} (expected {:+.4f}; "
      "negative: toward zero); excess {:+.4f} +- {:.4f} signed, {:+.4f} +- {:.4f} radial over "
      "{} blocks (t {:.2f}); signs of the excess +{} -{} ={} ties, of {} elements ({} exact, "
      "{} not finite)",
      a.mean_error, format_name, a.mean_expected, r.mean_error, r.mean_expected, a.mean_excess,
      a.stderr_excess, r.mean_excess, r.stderr_excess, s.blocks, s.t_critical, a.positive,
      a.negative, a.ties, s.elements, s.exact, s.skipped);
}

}  // namespace attest
