// Inline SVG charts for `attest audit`'s report.html (self-contained, inline
// SVG, no JavaScript, no network): log-y line charts, grouped bar charts, heatmaps and
// error-bar charts, written as polyglot markup (well-formed XML inside HTML5) so that a
// strict XML parser validates the page. Every chart is one <svg> element with an id, class
// "plot", a <title>, and data-colors listing the colours its data marks use, so that a test
// can look for them in a screenshot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attest::svg {

// Colours of the marks: kernels (several in a side-by-side report) and the baseline.
extern const char* const kKernelColors[5];
inline constexpr const char* kBaselineColor = "#1f77b4";
// Heatmap cells: judged and bitwise unchanged; not judged (the row sees the perturbation).
inline constexpr const char* kUnchangedColor = "#a1d99b";
inline constexpr const char* kNotJudgedColor = "#d9d9d9";

struct Series {
  std::string name;
  std::string color;
  std::vector<double> y;    // one per x / group; NaN: no value
  std::vector<double> err;  // error bars (ErrorBarChart), same length as y or empty
  bool dashed = false;
};

struct LineChart {
  std::string id, title, x_label, y_label;
  std::vector<double> x;              // positions (log2 spacing when log_x)
  std::vector<std::string> x_ticks;   // one label per x
  bool log_x = true;
  std::vector<Series> series;
  int width = 325, height = 290;
};
// y is on a log10 axis over the positive finite values; a value <= 0 (an exact result) is
// drawn as an open marker on the bottom edge and listed in the title as exact.
std::string Render(const LineChart& chart);

struct BarChart {
  std::string id, title, y_label;
  std::vector<std::string> groups;  // one cluster of bars per group
  std::vector<Series> series;       // one bar per series in each group
  int width = 660, height = 300;
};
// Log10 y axis; zeros drawn as a short tick at the bottom.
std::string Render(const BarChart& chart);

struct Heatmap {
  std::string id, title, row_label, col_label;
  int64_t rows = 0, cols = 0;
  std::vector<double> cells;  // rows x cols: NaN not judged, 0 unchanged, > 0 change
  int64_t block = 1;          // positions per cell (axis labels count positions)
  double lo = 1e-10, hi = 1;  // colour scale of changes (log10)
  int width = 300, height = 352;
};
std::string Render(const Heatmap& chart);

struct ErrorBarChart {
  std::string id, title, y_label;
  std::vector<std::string> groups;
  std::vector<Series> series;  // y with +-err bars (err: one standard error)
  int width = 440, height = 300;
};
// Linear y axis through zero, symmetric; bars are +-2 err (about 95 % for a normal mean).
std::string Render(const ErrorBarChart& chart);

// Escapes text for XML character data and attributes.
std::string Escape(const std::string& text);

}  // namespace attest::svg
