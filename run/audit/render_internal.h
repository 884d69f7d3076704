// Internals of the audit renderings (run/audit/render.h) shared by their three files:
// render.cc (the HTML page and the Markdown report), render_figures.cc (the SVG charts) and
// render_json.cc (report.json).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "run/audit/audit.h"

namespace attest::audit_render {

struct Figure {
  std::string section;  // "seqlen", "head_dim", "distribution", "leak", "bias"
  std::string id;
  std::string svg;
};

// Every chart of the page, in page order (render_figures.cc): one function builds them all,
// so the page and AuditPlotIds agree on what a screenshot must show.
std::vector<Figure> Figures(std::span<const AuditResult> results);

// `s` with every character but letters and digits replaced by '-' (a fragment of an id).
std::string IdPart(const std::string& s);

// The tensors the charts and tables show: o, and dq, dk, dv when any result has a backward.
std::vector<std::string> PlotTensors(std::span<const AuditResult> results);

// Whether a mean over n seeds is systematic (render.cc: the one-sample t-test at p = 0.001).
bool Systematic(double mean, double se, int n);

}  // namespace attest::audit_render
