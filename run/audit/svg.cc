// Inline SVG charts for the audit report (see svg.h). Plain geometry: an axis maps values to
// pixels, marks are lines, circles and rects; no fonts beyond the generic sans-serif family
// and no external references, so the page renders the same offline.
#include "run/audit/svg.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace attest::svg {

// Tableau-10 hues without the baseline's blue: red, purple, orange, green, brown.
const char* const kKernelColors[5] = {"#d62728", "#9467bd", "#ff7f0e", "#2ca02c", "#8c564b"};

std::string Escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        // C0 controls other than tab / newline cannot appear in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Plot frame inside the svg: left / right / top / bottom margins leave room for tick labels,
// the title and the legend.
struct Frame {
  double x0, x1, y0, y1;  // pixel extent of the plotting area (y0 top, y1 bottom)
};

std::string Num(double v) { return fmt::format("{:.1f}", v); }

std::string Open(const std::string& id, const std::string& title, int w, int h,
                 const std::set<std::string>& colors) {
  std::string cs;
  for (const std::string& c : colors) cs += (cs.empty() ? "" : ",") + c;
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"{}\" class=\"plot\" width=\"{}\" "
      "height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" data-colors=\"{}\" "
      "font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n<title>{}</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n"
      "<text x=\"{}\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">"
      "{}</text>\n",
      Escape(id), w, h, w, h, cs, Escape(title), w, h, w / 2, Escape(title));
}

// The legend in rows under the title; returns the y below it.
double Legend(std::string& out, const std::vector<Series>& series, int width, double y,
              bool bars) {
  double x = 60;
  for (const Series& s : series) {
    // A series without a single value has nothing to point at.
    if (std::none_of(s.y.begin(), s.y.end(), [](double v) { return !std::isnan(v); })) continue;
    const double w = 30 + 6.6 * static_cast<double>(s.name.size());
    if (x + w > width - 8 && x > 60) {
      x = 60;
      y += 15;
    }
    if (bars) {
      out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"9\" fill=\"{}\"/>", Num(x),
                         Num(y - 8), s.color);
    } else {
      out += fmt::format(
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2.5\"{}/>",
          Num(x), Num(y - 4), Num(x + 16), Num(y - 4), s.color,
          s.dashed ? " stroke-dasharray=\"5,3\"" : "");
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", Num(x + 20), Num(y),
                       Escape(s.name));
    x += w;
  }
  return y + 8;
}

// A log10 axis over [lo, hi] (both > 0), widened to whole decades.
struct LogAxis {
  double dlo = -1, dhi = 0;  // decades
  double Pos(double v, double p0, double p1) const {
    const double t = (std::log10(v) - dlo) / (dhi - dlo);
    return p1 - t * (p1 - p0);
  }
};

LogAxis MakeLogAxis(const std::vector<double>& values) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (double v : values) {
    if (std::isfinite(v) && v > 0) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  LogAxis a;
  if (!(hi > 0)) return a;  // nothing positive: a default decade
  a.dlo = std::floor(std::log10(lo));
  a.dhi = std::ceil(std::log10(hi));
  if (a.dhi <= a.dlo) a.dhi = a.dlo + 1;
  return a;
}

std::string Decade(int e) {
  if (e == 0) return "1";
  if (e == 1) return "10";
  return fmt::format("1e{}", e);
}

void LogTicks(std::string& out, const LogAxis& a, const Frame& f) {
  const int lo = static_cast<int>(a.dlo), hi = static_cast<int>(a.dhi);
  const int step = (hi - lo) > 8 ? 2 : 1;
  for (int e = lo; e <= hi; e += step) {
    const double y = a.Pos(std::pow(10.0, e), f.y0, f.y1);
    out += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
        Num(f.x0), Num(y), Num(f.x1), Num(y), Num(f.x0 - 4), Num(y + 4), Decade(e));
  }
}

void AxesBox(std::string& out, const Frame& f, const std::string& x_label,
             const std::string& y_label, int height) {
  out += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#555555\"/>\n",
      Num(f.x0), Num(f.y0), Num(f.x1 - f.x0), Num(f.y1 - f.y0));
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     Num((f.x0 + f.x1) / 2), height - 6, Escape(x_label));
  out += fmt::format(
      "<text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}"
      "</text>\n",
      Num((f.y0 + f.y1) / 2), Num((f.y0 + f.y1) / 2), Escape(y_label));
}

std::set<std::string> ColorsOf(const std::vector<Series>& series) {
  std::set<std::string> c;
  for (const Series& s : series) {
    for (double y : s.y) {
      if (!std::isnan(y)) {
        c.insert(s.color);
        break;
      }
    }
  }
  return c;
}

}  // namespace

std::string Render(const LineChart& chart) {
  std::string body;
  Frame f{62, static_cast<double>(chart.width) - 14, 0, static_cast<double>(chart.height) - 44};
  f.y0 = Legend(body, chart.series, chart.width, 34, false) + 4;
  std::vector<double> all;
  for (const Series& s : chart.series) all.insert(all.end(), s.y.begin(), s.y.end());
  const LogAxis ay = MakeLogAxis(all);
  LogTicks(body, ay, f);
  // x: log2 positions (or linear), padded by half a step at both ends.
  std::vector<double> xs;
  for (double x : chart.x) xs.push_back(chart.log_x ? std::log2(x) : x);
  double xlo = xs.empty() ? 0 : *std::min_element(xs.begin(), xs.end());
  double xhi = xs.empty() ? 1 : *std::max_element(xs.begin(), xs.end());
  if (xhi <= xlo) xhi = xlo + 1;
  const double pad = (xhi - xlo) * 0.06;
  auto px = [&](double x) { return f.x0 + (x - xlo + pad) / (xhi - xlo + 2 * pad) * (f.x1 - f.x0); };
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string label = i < chart.x_ticks.size() ? chart.x_ticks[i] : fmt::format("{:g}", chart.x[i]);
    body += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#555555\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        Num(px(xs[i])), Num(f.y1), Num(px(xs[i])), Num(f.y1 + 4), Num(px(xs[i])),
        Num(f.y1 + 16), Escape(label));
  }
  AxesBox(body, f, chart.x_label, chart.y_label, chart.height);
  for (const Series& s : chart.series) {
    std::string points;
    std::string marks;
    for (size_t i = 0; i < xs.size() && i < s.y.size(); ++i) {
      const double y = s.y[i];
      if (std::isnan(y)) {
        // A gap: draw what we have so far and restart.
        if (!points.empty()) {
          body += fmt::format(
              "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{}/>\n",
              points, s.color, s.dashed ? " stroke-dasharray=\"6,3\"" : "");
        }
        points.clear();
        continue;
      }
      if (y <= 0 || !std::isfinite(y)) {
        // Exact (0) at the bottom edge, non-finite at the top edge: open markers.
        const double yy = y <= 0 ? f.y1 : f.y0;
        marks += fmt::format(
            "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"#ffffff\" stroke=\"{}\" "
            "stroke-width=\"2\"/>\n",
            Num(px(xs[i])), Num(yy), s.color);
        continue;
      }
      const double yy = ay.Pos(y, f.y0, f.y1);
      points += fmt::format("{},{} ", Num(px(xs[i])), Num(yy));
      marks += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"/>\n",
                           Num(px(xs[i])), Num(yy), s.color);
    }
    if (!points.empty()) {
      body += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{}/>\n", points,
          s.color, s.dashed ? " stroke-dasharray=\"6,3\"" : "");
    }
    body += marks;
  }
  return Open(chart.id, chart.title, chart.width, chart.height, ColorsOf(chart.series)) + body +
         "</svg>\n";
}

std::string Render(const BarChart& chart) {
  std::string body;
  Frame f{62, static_cast<double>(chart.width) - 14, 0, static_cast<double>(chart.height) - 52};
  f.y0 = Legend(body, chart.series, chart.width, 34, true) + 4;
  std::vector<double> all;
  for (const Series& s : chart.series) all.insert(all.end(), s.y.begin(), s.y.end());
  const LogAxis ay = MakeLogAxis(all);
  LogTicks(body, ay, f);
  const size_t ng = std::max<size_t>(chart.groups.size(), 1);
  const size_t ns = std::max<size_t>(chart.series.size(), 1);
  const double gw = (f.x1 - f.x0) / static_cast<double>(ng);
  const double bw = gw * 0.8 / static_cast<double>(ns);
  for (size_t g = 0; g < chart.groups.size(); ++g) {
    const double gx = f.x0 + gw * static_cast<double>(g);
    body += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                        Num(gx + gw / 2), Num(f.y1 + 15), Escape(chart.groups[g]));
    for (size_t s = 0; s < chart.series.size(); ++s) {
      const Series& se = chart.series[s];
      if (g >= se.y.size() || std::isnan(se.y[g])) continue;
      const double bx = gx + gw * 0.1 + bw * static_cast<double>(s);
      const double y = se.y[g];
      if (y <= 0) {
        body += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"3\" fill=\"{}\"/>\n",
                            Num(bx), Num(f.y1 - 3), Num(bw - 1), se.color);
        continue;
      }
      const double top = std::isfinite(y) ? ay.Pos(y, f.y0, f.y1) : f.y0;
      body += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n",
                          Num(bx), Num(top), Num(std::max(bw - 1, 1.0)),
                          Num(std::max(f.y1 - top, 1.0)), se.color);
    }
  }
  AxesBox(body, f, "", chart.y_label, chart.height);
  return Open(chart.id, chart.title, chart.width, chart.height, ColorsOf(chart.series)) + body +
         "</svg>\n";
}

namespace {

// Colour of a change on a log scale from light yellow (lo) to dark red (hi): a sequential
// ramp through YlOrRd's anchors.
std::string ChangeColor(double v, double lo, double hi) {
  static const int kRamp[5][3] = {
      {255, 237, 160}, {254, 178, 76}, {240, 59, 32}, {189, 0, 38}, {103, 0, 13}};
  double t = std::isfinite(v) ? (std::log10(std::max(v, lo)) - std::log10(lo)) /
                                    (std::log10(hi) - std::log10(lo))
                              : 1.0;
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(static_cast<int>(t), 3);
  const double u = t - i;
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(kRamp[i][c] + u * (kRamp[i + 1][c] - kRamp[i][c])));
  }
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

}  // namespace

std::string Render(const Heatmap& chart) {
  std::string body;
  const double x0 = 48, y0 = 28;
  const double side = std::min(chart.width - x0 - 10, chart.height - y0 - 62.0);
  const double cw = chart.cols > 0 ? side / static_cast<double>(chart.cols) : side;
  const double ch = chart.rows > 0 ? side / static_cast<double>(chart.rows) : side;
  std::set<std::string> colors;
  for (int64_t r = 0; r < chart.rows; ++r) {
    for (int64_t c = 0; c < chart.cols; ++c) {
      const double v = chart.cells[static_cast<size_t>(r * chart.cols + c)];
      std::string color;
      if (std::isnan(v)) {
        color = kNotJudgedColor;
      } else if (v == 0) {
        color = kUnchangedColor;
        colors.insert(color);
      } else {
        color = ChangeColor(v, chart.lo, chart.hi);
      }
      body += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>",
                          Num(x0 + cw * static_cast<double>(c)),
                          Num(y0 + ch * static_cast<double>(r)), Num(cw + 0.3), Num(ch + 0.3),
                          color);
    }
    body += "\n";
  }
  body += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#555555\"/>\n",
      Num(x0), Num(y0), Num(side), Num(side));
  // Position ticks: 0, middle, end, in positions (not blocks).
  for (int64_t k : {int64_t{0}, chart.cols / 2, chart.cols}) {
    const double x = x0 + cw * static_cast<double>(k);
    body += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", Num(x),
                        Num(y0 + side + 13), k * chart.block);
  }
  for (int64_t k : {int64_t{0}, chart.rows / 2, chart.rows}) {
    const double y = y0 + ch * static_cast<double>(k);
    body += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", Num(x0 - 3),
                        Num(y + 4), k * chart.block);
  }
  body += fmt::format("\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                      Num(x0 + side / 2), Num(y0 + side + 26), Escape(chart.col_label));
  body += fmt::format(
      "<text x=\"12\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 12 {})\">{}"
      "</text>\n",
      Num(y0 + side / 2), Num(y0 + side / 2), Escape(chart.row_label));
  // Key: unchanged, not judged, and the change ramp.
  const double ky = y0 + side + 38;
  body += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">"
      "bitwise unchanged</text>",
      Num(x0), Num(ky), kUnchangedColor, Num(x0 + 13), Num(ky + 9));
  body += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">"
      "sees it</text>\n",
      Num(x0 + 128), Num(ky), kNotJudgedColor, Num(x0 + 141), Num(ky + 9));
  const double ry = ky + 15;
  for (int i = 0; i < 10; ++i) {
    const double v = std::pow(10.0, std::log10(chart.lo) +
                                        (std::log10(chart.hi) - std::log10(chart.lo)) * i / 9);
    body += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"9\" fill=\"{}\"/>",
                        Num(x0 + 12 * i), Num(ry), ChangeColor(v, chart.lo, chart.hi));
  }
  body += fmt::format("<text x=\"{}\" y=\"{}\">{:g}</text><text x=\"{}\" y=\"{}\">{:g}: "
                      "change / max |output|</text>\n",
                      Num(x0), Num(ry + 21), chart.lo, Num(x0 + 108), Num(ry + 21), chart.hi);
  return Open(chart.id, chart.title, chart.width, chart.height, colors) + body + "</svg>\n";
}

std::string Render(const ErrorBarChart& chart) {
  std::string body;
  Frame f{62, static_cast<double>(chart.width) - 14, 0, static_cast<double>(chart.height) - 40};
  f.y0 = Legend(body, chart.series, chart.width, 34, false) + 4;
  double m = 0;
  for (const Series& s : chart.series) {
    for (size_t i = 0; i < s.y.size(); ++i) {
      const double e = i < s.err.size() && std::isfinite(s.err[i]) ? 2 * s.err[i] : 0;
      if (std::isfinite(s.y[i])) m = std::max(m, std::fabs(s.y[i]) + e);
    }
  }
  // A symmetric axis with a "nice" step: 1, 2 or 5 times a power of ten.
  m = m > 0 ? m * 1.15 : 0.01;
  const double raw = m / 3;
  const double p10 = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / p10 < 2 ? 2 * p10 : raw / p10 < 5 ? 5 * p10 : 10 * p10;
  const double top = std::ceil(m / step) * step;
  auto py = [&](double v) { return f.y0 + (top - v) / (2 * top) * (f.y1 - f.y0); };
  for (double t = -top; t <= top + step / 2; t += step) {
    const double y = py(t);
    body += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:g}</text>\n",
        Num(f.x0), Num(y), Num(f.x1), Num(y), std::fabs(t) < step / 2 ? "#888888" : "#e6e6e6",
        Num(f.x0 - 4), Num(y + 4), std::fabs(t) < step / 2 ? 0.0 : t);
  }
  const size_t ng = std::max<size_t>(chart.groups.size(), 1);
  const size_t ns = std::max<size_t>(chart.series.size(), 1);
  const double gw = (f.x1 - f.x0) / static_cast<double>(ng);
  for (size_t g = 0; g < chart.groups.size(); ++g) {
    const double gx = f.x0 + gw * static_cast<double>(g);
    body += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                        Num(gx + gw / 2), Num(f.y1 + 15), Escape(chart.groups[g]));
    for (size_t s = 0; s < chart.series.size(); ++s) {
      const Series& se = chart.series[s];
      if (g >= se.y.size() || !std::isfinite(se.y[g])) continue;
      const double x = gx + gw * (0.25 + 0.5 * (static_cast<double>(s) + 0.5) /
                                             static_cast<double>(ns));
      const double e = g < se.err.size() && std::isfinite(se.err[g]) ? 2 * se.err[g] : 0;
      body += fmt::format(
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>"
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>"
          "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>"
          "<circle cx=\"{}\" cy=\"{}\" r=\"4.5\" fill=\"{}\"/>\n",
          Num(x), Num(py(se.y[g] - e)), Num(x), Num(py(se.y[g] + e)), se.color, Num(x - 5),
          Num(py(se.y[g] - e)), Num(x + 5), Num(py(se.y[g] - e)), se.color, Num(x - 5),
          Num(py(se.y[g] + e)), Num(x + 5), Num(py(se.y[g] + e)), se.color, Num(x),
          Num(py(se.y[g])), se.color);
    }
  }
  AxesBox(body, f, "", chart.y_label, chart.height);
  return Open(chart.id, chart.title, chart.width, chart.height, ColorsOf(chart.series)) + body +
         "</svg>\n";
}

}  // namespace attest::svg
