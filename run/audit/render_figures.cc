// The SVG charts of the audit page (see render.h; docs/audit.md): error against sequence
// length, head dimension and input distribution, the leak maps and the bias bars, each drawn
// with run/audit/svg.h. One function builds every chart (Figures), so the page and
// AuditPlotIds agree on what a screenshot must show.
#include "run/audit/render.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "run/audit/render_internal.h"
#include "run/audit/svg.h"

namespace attest::audit_render {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The plotted error: relative L2 over finite pairs, or +inf when the kernel returned a
// non-finite value where the oracle is finite (drawn at the top edge, never hidden).
double RelL2(const KernelErrors& e, const std::string& t) {
  auto it = e.tensors.find(t);
  if (it == e.tensors.end() || !it->second.present) return kNaN;
  return it->second.nonfinite > 0 ? std::numeric_limits<double>::infinity() : it->second.rel_l2;
}

// One series per kernel plus the baseline (once when every result measured the same one).
std::vector<svg::Series> SweepSeries(std::span<const AuditResult> results,
                                     const Sweep AuditResult::*member, const std::string& tensor,
                                     const std::vector<double>& xs) {
  std::vector<svg::Series> series;
  std::vector<std::vector<double>> baselines;
  for (size_t i = 0; i < results.size(); ++i) {
    const Sweep& sw = results[i].*member;
    svg::Series k, b;
    k.name = results[i].kernel;
    k.color = svg::kKernelColors[i % 5];
    b.name = results[i].baseline + " (baseline)";
    b.color = svg::kBaselineColor;
    b.dashed = true;
    for (double x : xs) {
      double ky = kNaN, by = kNaN;
      for (size_t c = 0; c < sw.x.size(); ++c) {
        if (sw.x[c] != x) continue;
        ky = RelL2(sw.cases[c].kernel, tensor);
        by = RelL2(sw.cases[c].baseline, tensor);
      }
      k.y.push_back(ky);
      b.y.push_back(by);
    }
    series.push_back(std::move(k));
    bool seen = false;
    for (const auto& other : baselines) {
      bool same = other.size() == b.y.size();
      for (size_t j = 0; same && j < b.y.size(); ++j) {
        same = other[j] == b.y[j] || (std::isnan(other[j]) && std::isnan(b.y[j]));
      }
      seen = seen || same;
    }
    if (!seen) {
      if (!baselines.empty()) {
        b.name = results[i].baseline + " (baseline of " + results[i].kernel + ")";
      }
      baselines.push_back(b.y);
      series.push_back(std::move(b));
    }
  }
  // Baselines after the kernels, so kernels' colours come first in the legend.
  std::stable_partition(series.begin(), series.end(),
                        [](const svg::Series& s) { return !s.dashed; });
  return series;
}

}  // namespace

std::string IdPart(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return out;
}

std::vector<std::string> PlotTensors(std::span<const AuditResult> results) {
  std::vector<std::string> t = {"o"};
  for (const AuditResult& r : results) {
    if (r.has_backward) return {"o", "dq", "dk", "dv"};
  }
  return t;
}

std::vector<Figure> Figures(std::span<const AuditResult> results) {
  std::vector<Figure> figs;
  if (results.empty()) return figs;
  const std::vector<std::string> tensors = PlotTensors(results);
  // Error against sequence length / head dim: union of the x values of every result.
  auto sweep_figs = [&](const Sweep AuditResult::*member, const std::string& section,
                        const std::string& what, const std::string& tick_prefix) {
    std::set<double> xset;
    for (const AuditResult& r : results) xset.insert((r.*member).x.begin(), (r.*member).x.end());
    const std::vector<double> xs(xset.begin(), xset.end());
    std::vector<std::string> ticks;
    for (double x : xs) ticks.push_back(tick_prefix + fmt::format("{:g}", x));
    for (const std::string& t : tensors) {
      svg::LineChart c;
      c.id = "plot-" + section + "-" + t;
      c.title = t + ": relative L2 error vs " + what;
      c.x_label = (results[0].*member).x_label;
      c.y_label = "||" + t + " - oracle|| / ||oracle||";
      c.x = xs;
      c.x_ticks = ticks;
      c.series = SweepSeries(results, member, t, xs);
      figs.push_back({section, c.id, svg::Render(c)});
    }
  };
  sweep_figs(&AuditResult::seqlen, "seqlen", "sequence length", "");
  sweep_figs(&AuditResult::head_dim, "headdim", "head dim", "");

  // Error by distribution: groups are the first result's distributions.
  const std::vector<std::string>& dists = results[0].plan.distributions;
  for (const std::string& t : tensors) {
    svg::BarChart c;
    c.id = "plot-dist-" + t;
    c.title = t + ": relative L2 error by input distribution";
    c.y_label = "||" + t + " - oracle|| / ||oracle||";
    c.groups = dists;
    std::vector<double> base;
    for (size_t i = 0; i < results.size(); ++i) {
      svg::Series s;
      s.name = results[i].kernel;
      s.color = svg::kKernelColors[i % 5];
      for (const std::string& g : dists) {
        double y = kNaN;
        for (const AuditCase& a : results[i].distributions.cases) {
          if (a.label == g) y = RelL2(a.kernel, t);
          if (a.label == g && i == 0) base.push_back(RelL2(a.baseline, t));
        }
        s.y.push_back(y);
      }
      c.series.push_back(std::move(s));
    }
    svg::Series b;
    b.name = results[0].baseline + " (baseline)";
    b.color = svg::kBaselineColor;
    b.y = base;
    c.series.push_back(std::move(b));
    figs.push_back({"distribution", c.id, svg::Render(c)});
  }

  // Leak maps: one row of maps per kernel.
  for (const AuditResult& r : results) {
    for (const LeakMap& m : r.leak.maps) {
      svg::Heatmap h;
      h.id = "plot-leak-" + IdPart(r.kernel) + "-" + IdPart(m.tensor);
      h.title = r.kernel + ": " + m.tensor;
      h.row_label = m.row_label + " (positions)";
      h.col_label = m.col_label + " (positions)";
      h.rows = m.rows;
      h.cols = m.cols;
      h.cells = m.cells;
      h.block = m.block;
      figs.push_back({"leak", h.id, svg::Render(h)});
    }
  }

  // Gradient bias: signed and magnitude, with +-2 standard errors.
  for (const bool magnitude : {false, true}) {
    svg::ErrorBarChart c;
    c.id = magnitude ? "plot-bias-magnitude" : "plot-bias-signed";
    c.title = magnitude ? "magnitude bias: mean(err * sign(ref)) / rms(err)"
                        : "signed bias: mean(err) / rms(err)";
    c.y_label = "bias (+-2 standard errors)";
    c.groups = tensors;
    for (size_t i = 0; i <= results.size(); ++i) {
      const bool base = i == results.size();
      const AuditResult& r = results[base ? 0 : i];
      svg::Series s;
      s.name = base ? r.baseline + " (baseline)" : r.kernel;
      s.color = base ? svg::kBaselineColor : svg::kKernelColors[i % 5];
      for (const std::string& t : tensors) {
        double y = kNaN, e = kNaN;
        for (const BiasStat& b : r.bias) {
          if (b.tensor != t) continue;
          y = base ? (magnitude ? b.baseline_magnitude_mean : b.baseline_mean)
                   : (magnitude ? b.kernel_magnitude_mean : b.kernel_mean);
          e = base ? (magnitude ? b.baseline_magnitude_se : b.baseline_se)
                   : (magnitude ? b.kernel_magnitude_se : b.kernel_se);
        }
        s.y.push_back(y);
        s.err.push_back(e);
      }
      c.series.push_back(std::move(s));
    }
    figs.push_back({"bias", c.id, svg::Render(c)});
  }
  return figs;
}

}  // namespace attest::audit_render

namespace attest {

using audit_render::Figure;
using audit_render::Figures;

std::vector<std::string> AuditPlotIds(std::span<const AuditResult> results) {
  std::vector<std::string> ids;
  for (const Figure& f : Figures(results)) ids.push_back(f.id);
  return ids;
}

}  // namespace attest
