// Renders audit results as an HTML page (inline SVG) and a Markdown report (see render.h;
// docs/audit.md). The charts come from render_figures.cc (Figures), report.json from
// render_json.cc.
#include "run/audit/render.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "run/audit/render_internal.h"
#include "run/audit/svg.h"
#include "verify/report/report.h"
#include "run/suite.h"

namespace attest {
namespace {

// A mean over n seeds is called systematic when |mean| / standard error exceeds Student's t
// at two-sided p = 0.001 with n - 1 degrees of freedom (the one-sample t-test; the t rather
// than the normal quantile because n is small and the standard error is itself estimated).
// At p = 0.001 the 8 tests of a report (4 tensors x signed / magnitude) raise a false alarm in
// under 1 % of unbiased kernels. Quantiles t_{0.9995} from any t table (e.g. NIST/SEMATECH
// e-Handbook 1.3.6.7.2).
double TCritical(int dof) {
  static const double kTable[] = {0,     636.62, 31.599, 12.924, 8.610, 6.869, 5.959, 5.408,
                                  5.041, 4.781,  4.587,  4.437,  4.318, 4.221, 4.140, 4.073};
  if (dof <= 0) return std::numeric_limits<double>::infinity();
  if (dof < 16) return kTable[dof];
  if (dof < 20) return 4.015;  // 16..19: the value at 16 (conservative)
  if (dof < 30) return 3.850;
  if (dof < 60) return 3.646;
  return 3.460;
}

}  // namespace

namespace audit_render {

bool Systematic(double mean, double se, int n) {
  return n >= 3 && std::isfinite(se) && std::fabs(mean) > TCritical(n - 1) * se;
}

}  // namespace audit_render

namespace {

using audit_render::Figure;
using audit_render::Figures;
using audit_render::IdPart;
using audit_render::PlotTensors;
using audit_render::Systematic;

std::string Fmt(double v, const char* spec = "{:.3g}") {
  if (std::isnan(v)) return "–";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format(fmt::runtime(spec), v);
}

std::string Esc(const std::string& s) { return svg::Escape(s); }

// Text for a Markdown table cell: '|' would end the cell, a newline the row.
std::string Cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else {
      out += c == '\n' ? ' ' : c;
    }
  }
  return out;
}
// A table cell of the error: "0.0412", or "inf (12 non-finite)".
std::string ErrorCell(const KernelErrors& e, const std::string& t) {
  auto it = e.tensors.find(t);
  if (it == e.tensors.end() || !it->second.present) return "–";
  if (it->second.nonfinite > 0) {
    return fmt::format("{} non-finite", it->second.nonfinite);
  }
  return Fmt(it->second.rel_l2);
}

// Worst (largest margin) verdict among those matching `pred`; nullptr when none.
template <class Pred>
const AuditVerdict* Worst(const AuditResult& r, Pred pred) {
  const AuditVerdict* w = nullptr;
  for (const AuditVerdict& v : r.verdicts) {
    if (!pred(v)) continue;
    if (w == nullptr || v.verdict.margin > w->verdict.margin ||
        (std::isnan(v.verdict.margin) && !std::isnan(w->verdict.margin))) {
      w = &v;
    }
  }
  return w;
}
// "margin 0.41" cells of a verdict list, "PASS"/"FAIL" first.
std::string MarginText(const Verdict& v) {
  return fmt::format("{} {}", v.pass ? "PASS" : "FAIL", Fmt(v.margin));
}

// The one-paragraph findings per kernel (Markdown and HTML share the words).
struct Findings {
  std::string verdict, accuracy, leak, consistency, bias;
};

Findings Summarise(const AuditResult& r) {
  Findings f;
  f.verdict = fmt::format("{}: {} of {} verdicts fail", r.passed() ? "PASS" : "FAIL",
                          r.failures(), r.verdicts.size());
  if (const AuditVerdict* w = Worst(r, [](const AuditVerdict& v) { return v.area == "accuracy"; })) {
    f.accuracy = fmt::format("worst margin {} ({} {}, {}, {})", Fmt(w->verdict.margin),
                             w->verdict.check, w->verdict.tensor, w->case_label,
                             w->verdict.policy);
  } else {
    f.accuracy = "no accuracy verdicts";
  }
  const NonInterferenceSummary& ni = r.non_interference;
  int judged = 0;
  const NonInterferenceCase* first_error = nullptr;
  for (const NonInterferenceCase& c : ni.cases) {
    judged += c.verdicts.empty() || !c.kernel_error.empty() ? 0 : 1;
    if (!c.kernel_error.empty() && first_error == nullptr) first_error = &c;
  }
  // A case whose kernel call failed was not judged: never "no leak", never a leak.
  const std::string errors =
      first_error == nullptr
          ? ""
          : fmt::format("; not judged in {} case{}, the kernel failed (smallest: {}: {})",
                        ni.kernel_errors, ni.kernel_errors == 1 ? "" : "s", first_error->label,
                        first_error->kernel_error);
  if (ni.smallest_leak >= 0) {
    const NonInterferenceCase& c = ni.cases[static_cast<size_t>(ni.smallest_leak)];
    std::string tensors;
    for (const Verdict& v : c.verdicts) {
      if (!v.pass) tensors += (tensors.empty() ? "" : ", ") + v.tensor;
    }
    f.leak = fmt::format("LEAKS{}: smallest leaking case {} ({} moved){}",
                         r.sequence_block_scales ? " through shared block scales" : "", c.label,
                         tensors, errors);
  } else if (first_error != nullptr) {
    f.leak = fmt::format("NOT JUDGED: no leak in the {} cases judged{}", judged, errors);
  } else {
    f.leak = fmt::format("no leak: protected outputs bitwise unchanged in {} cases", judged);
  }
  if (const AuditVerdict* w =
          Worst(r, [](const AuditVerdict& v) { return v.area == "consistency"; })) {
    f.consistency = fmt::format("worst margin {} ({}, {})", Fmt(w->verdict.margin),
                                w->verdict.tensor, w->case_label);
  } else {
    f.consistency = r.has_backward ? "no consistency verdicts" : "no backward";
  }
  std::string sys;
  for (const BiasStat& b : r.bias) {
    if (Systematic(b.kernel_mean, b.kernel_se, b.n) ||
        Systematic(b.kernel_magnitude_mean, b.kernel_magnitude_se, b.n)) {
      sys += (sys.empty() ? "" : ", ") + b.tensor;
    }
  }
  const int n = r.bias.empty() ? 0 : r.bias[0].n;
  f.bias = sys.empty() ? fmt::format("no systematic bias (t-test over {} seeds, p = 0.001)", n)
                       : fmt::format("systematic bias in {} (t-test over {} seeds, p < 0.001)",
                                     sys, n);
  return f;
}

const char* kCss = R"(
body{font-family:"DejaVu Sans",sans-serif;margin:24px;color:#222222;background:#ffffff;max-width:1500px}
h1{font-size:24px;margin:0 0 4px 0}h2{font-size:19px;margin-top:30px;border-bottom:1px solid #cccccc}
h3{font-size:15px}p.note{color:#555555;font-size:13px;max-width:1100px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #cccccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2}.pass{color:#1a7f37;font-weight:bold}.fail{color:#c62828;font-weight:bold}
.figs{display:flex;flex-wrap:wrap;gap:10px}.figs svg{border:1px solid #e0e0e0}
pre{background:#f6f6f6;padding:6px 8px;font-size:12px;white-space:pre-wrap}
.card{border:1px solid #cccccc;padding:8px 12px;margin:8px 0;max-width:1100px}
.card b.pass,.card b.fail{font-size:15px}
)";

std::string PassFail(bool pass) {
  return pass ? "<span class=\"pass\">PASS</span>" : "<span class=\"fail\">FAIL</span>";
}

}  // namespace

std::string AuditToMarkdown(std::span<const AuditResult> results) {
  std::string md = "# attest audit\n\n";
  const std::vector<std::string> tensors = PlotTensors(results);
  for (const AuditResult& r : results) {
    const Findings f = Summarise(r);
    md += fmt::format("## {}\n\n{}\n\n", r.kernel, r.kernel_description);
    md += fmt::format(
        "- **Verdict:** {}\n- **Accuracy** (profile `{}`): {}\n- **Non-interference:** {}\n"
        "- **Consistency:** {}\n- **Gradient bias:** {}\n- Baseline `{}`, seed {}, oracle on "
        "the {}, {:.1f} s\n\n",
        f.verdict, r.profile, f.accuracy, f.leak, f.consistency, f.bias, r.baseline, r.seed,
        r.oracle_device == "cuda" ? "GPU" : "CPU", r.seconds);
    if (!r.non_interference.repro.empty()) {
      md += fmt::format("Smallest leaking case, to reproduce:\n\n```\n{}\n```\n\n",
                        r.non_interference.repro);
    }
    for (const Sweep* sw : {&r.seqlen, &r.head_dim, &r.distributions}) {
      md += fmt::format("### Relative L2 error by {}\n\n| {} |", sw->x_label, sw->name);
      for (const std::string& t : tensors) md += fmt::format(" {} | {} baseline |", t, t);
      md += "\n|---|";
      for (size_t i = 0; i < tensors.size(); ++i) md += "---|---|";
      md += "\n";
      for (const AuditCase& a : sw->cases) {
        md += "| " + a.label + " |";
        for (const std::string& t : tensors) {
          md += fmt::format(" {} | {} |", ErrorCell(a.kernel, t), ErrorCell(a.baseline, t));
        }
        if (!a.kernel.note.empty()) md.append(" ").append(Cell(a.kernel.note));
        md += "\n";
      }
      if (sw == &r.distributions) {
        md += "\ninf: the oracle's tensor is exactly zero (dq, dk of constant rows) and the "
              "kernel's is not; \"non-finite\": NaN/Inf where the oracle is finite.\n";
      }
      md += "\n";
    }
    md += fmt::format("### Leak maps (causal, S = {}, blocks of {})\n\n| output | judged cells | "
                      "cells that moved | largest change / max abs |\n|---|---|---|---|\n",
                      r.leak.problem.seqlen_q, r.plan.leak_block);
    for (const LeakMap& m : r.leak.maps) {
      md += fmt::format("| {} | {} | {} | {} |\n", m.tensor, m.judged_cells, m.leaking_cells,
                        Fmt(m.max_change));
    }
    md += "\n### Non-interference (smallest case first)\n\n| case | size | result | tensors |\n"
          "|---|---|---|---|\n";
    for (const NonInterferenceCase& c : r.non_interference.cases) {
      std::string ts;
      for (const Verdict& v : c.verdicts) {
        ts += fmt::format("{}{} {}", ts.empty() ? "" : ", ", v.tensor, MarginText(v));
      }
      md += fmt::format("| {} | {} | {} | {} |\n", c.label, c.size,
                        c.verdicts.empty()        ? "n/a"
                        : c.leaks                 ? "LEAK"
                        : !c.kernel_error.empty() ? "kernel error"
                                                  : "bitwise unchanged",
                        Cell(c.verdicts.empty() ? c.note : ts));
    }
    md += "\n### Consistency identities\n\n| case | identity | policy | result |\n|---|---|---|---|\n";
    for (const ConsistencyCase& c : r.consistency) {
      if (c.verdicts.empty()) md += fmt::format("| {} | | | {} |\n", c.label, Cell(c.note));
      for (const Verdict& v : c.verdicts) {
        md += fmt::format("| {} | {} | {} | {} |\n", c.label, v.tensor, Cell(v.policy), MarginText(v));
      }
    }
    md += "\n### Bias check (mean signed error in ulps against the recipe's, "
          "verify/checks/bias.h)\n\n| case | tensor | result | figures |\n|---|---|---|---|\n";
    for (const ConsistencyCase& c : r.consistency) {
      if (c.bias.empty()) {
        md += fmt::format("| {} | | | {} |\n", c.label,
                          Cell(c.bias_note.empty() ? c.note : c.bias_note));
      }
      for (const Verdict& v : c.bias) {
        md += fmt::format("| {} | {} | {} | {} |\n", c.label, v.tensor, MarginText(v),
                          Cell(v.message));
      }
    }
    md += fmt::format(
        "\n### Gradient bias ({} seeds; mean ± standard error over seeds)\n\n| tensor | signed "
        "(kernel) | signed (baseline) | magnitude (kernel) | magnitude (baseline) | |\n"
        "|---|---|---|---|---|---|\n",
        r.plan.bias_seeds);
    for (const BiasStat& b : r.bias) {
      const bool sys = Systematic(b.kernel_mean, b.kernel_se, b.n) ||
                       Systematic(b.kernel_magnitude_mean, b.kernel_magnitude_se, b.n);
      md += fmt::format("| {} | {} ± {} | {} ± {} | {} ± {} | {} ± {} | {} |\n", b.tensor,
                        Fmt(b.kernel_mean), Fmt(b.kernel_se), Fmt(b.baseline_mean),
                        Fmt(b.baseline_se), Fmt(b.kernel_magnitude_mean),
                        Fmt(b.kernel_magnitude_se), Fmt(b.baseline_magnitude_mean),
                        Fmt(b.baseline_magnitude_se), sys ? "systematic" : "noise");
    }
    md += "\n### Verdicts (failures first)\n\n| area | case | tensor | policy | observed | "
          "allowed | margin | result |\n|---|---|---|---|---|---|---|---|\n";
    std::vector<const AuditVerdict*> order;
    for (const AuditVerdict& v : r.verdicts) order.push_back(&v);
    std::stable_partition(order.begin(), order.end(),
                          [](const AuditVerdict* v) { return !v->verdict.pass; });
    for (const AuditVerdict* v : order) {
      md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", v->area, v->case_label,
                        v->verdict.tensor, Cell(v->verdict.policy), Fmt(v->verdict.observed),
                        Fmt(v->verdict.allowed), Fmt(v->verdict.margin),
                        v->verdict.pass ? "PASS" : "FAIL");
    }
    md += "\n";
    for (const AuditVerdict* v : order) {
      if (v->verdict.pass) break;
      md += fmt::format("- {} / {} / {}: {}\n", v->area, v->case_label, v->verdict.tensor,
                        v->verdict.message);
      if (!v->verdict.repro.empty()) md += fmt::format("  `{}`\n", v->verdict.repro);
    }
    md += "\n";
  }
  return md;
}

namespace {

// The charts of one section of the page, in a figure row.
std::string SectionFigures(const std::vector<Figure>& figs, const std::string& section) {
  std::string out = "<div class=\"figs\">\n";
  for (const Figure& f : figs) {
    if (f.section == section) out += f.svg;
  }
  return out + "</div>\n";
}

// The summary cards: one per kernel, its findings and how the run was made.
void HtmlSummary(std::string& h, std::span<const AuditResult> results) {
  h += "<section id=\"summary\">\n<h2>Summary</h2>\n";
  for (const AuditResult& r : results) {
    const Findings f = Summarise(r);
    h += "<div class=\"card\">\n<h3>" + Esc(r.kernel) + "</h3>\n<p class=\"note\">" +
         Esc(r.kernel_description) + "</p>\n<table>\n";
    h += "<tr><th>verdict</th><td>" + PassFail(r.passed()) + " " + Esc(f.verdict) + "</td></tr>\n";
    h += "<tr><th>accuracy (profile " + Esc(r.profile) + ")</th><td>" + Esc(f.accuracy) +
         "</td></tr>\n";
    h += "<tr><th>non-interference</th><td>" +
         PassFail(!r.leaks() && r.non_interference.kernel_errors == 0) + " " + Esc(f.leak) +
         "</td></tr>\n";
    h += "<tr><th>consistency</th><td>" + Esc(f.consistency) + "</td></tr>\n";
    h += "<tr><th>gradient bias</th><td>" + Esc(f.bias) + "</td></tr>\n";
    h += fmt::format("<tr><th>run</th><td>baseline {}, seed {}, oracle on the {}, {:.1f} s"
                     "</td></tr>\n",
                     Esc(r.baseline), r.seed, r.oracle_device == "cuda" ? "GPU" : "CPU",
                     r.seconds);
    h += "</table>\n";
    if (!r.non_interference.repro.empty()) {
      h += "<p>Smallest leaking case (written next to this report):</p>\n<pre>" +
           Esc(r.non_interference.repro) + "</pre>\n";
    }
    h += "</div>\n";
  }
  h += "</section>\n";
}

// The leak maps: what each column perturbs, then per kernel a table of its maps and their
// charts.
void HtmlLeakMaps(std::string& h, std::span<const AuditResult> results,
                  const std::vector<Figure>& figs) {
  h += "<section id=\"leak\">\n<h2>Leak maps</h2>\n<p class=\"note\">";
  if (!results[0].leak.maps.empty()) {
    h += Esc(fmt::format(
        "Causal, S = {}, one head. Each column perturbs one block of {} positions ({}); each "
        "cell shows how far the outputs of a block of rows that must not see any of them moved "
        "(max |change| / max |output|). Green: bitwise unchanged. A leak through shared block "
        "scales shows as a coloured band above the diagonal.",
        results[0].leak.problem.seqlen_q, results[0].plan.leak_block,
        results[0].leak.maps[0].perturbation));
  }
  h += "</p>\n";
  for (const AuditResult& r : results) {
    h += "<h3>" + Esc(r.kernel) + "</h3>\n<table><tr><th>output</th><th>judged cells</th>"
         "<th>cells that moved</th><th>largest change</th><th>note</th></tr>\n";
    for (const LeakMap& m : r.leak.maps) {
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                       Esc(m.tensor), m.judged_cells,
                       m.leaking_cells > 0 ? "<span class=\"fail\">" +
                                                 std::to_string(m.leaking_cells) + "</span>"
                                           : std::string("0"),
                       Fmt(m.max_change), Esc(m.note));
    }
    h += "</table>\n<div class=\"figs\">\n";
    for (const Figure& f : figs) {
      if (f.section == "leak" && f.id.rfind("plot-leak-" + IdPart(r.kernel) + "-", 0) == 0) {
        h += f.svg;
      }
    }
    h += "</div>\n";
  }
  h += "</section>\n";
}

// The error charts against sequence length, head dim and input distribution.
void HtmlErrorCurves(std::string& h, std::span<const AuditResult> results,
                     const std::vector<Figure>& figs) {
  h += "<section id=\"seqlen\">\n<h2>Error against sequence length</h2>\n<p class=\"note\">"
       "Causal (non-causal for a kernel that claims no causal mask: the axis label says "
       "which), batch 1, " +
       std::to_string(results[0].plan.heads) + " heads, D = " +
       std::to_string(results[0].plan.seqlen_head_dim) +
       ", gaussian inputs; log scale. An open circle on the bottom edge is an exact result."
       "</p>\n" +
       SectionFigures(figs, "seqlen") + "</section>\n";
  h += "<section id=\"headdim\">\n<h2>Error against head dim</h2>\n" +
       SectionFigures(figs, "headdim") + "</section>\n";
  h += "<section id=\"distribution\">\n<h2>Error by input distribution</h2>\n<p class=\"note\">"
       "Non-causal, S = " +
       std::to_string(results[0].plan.distribution_seqlen) +
       "; generators of reference/data (the rows of the fuzzer's value families; near-max "
       "draws near the e4m3 maximum, 448). A bar at the top edge is infinite: the kernel "
       "returned non-finite values where the oracle is finite, or the oracle's tensor is "
       "exactly zero (dq and dk of constant rows) and the kernel's is not.</p>\n" +
       SectionFigures(figs, "distribution") + "</section>\n";
}

// The non-interference cases per kernel, smallest first, and the smallest leak's message.
void HtmlNonInterference(std::string& h, std::span<const AuditResult> results) {
  h += "<section id=\"non-interference\">\n<h2>Non-interference</h2>\n<p class=\"note\">"
       "Outputs of rows that must not see a set of inputs must stay bitwise unchanged when "
       "those inputs are perturbed (large values, the e4m3 maximum, sign flips, tiny values); "
       "forward and both backward directions. Margin: change / allowed change.</p>\n";
  for (const AuditResult& r : results) {
    h += "<h3>" + Esc(r.kernel) + "</h3>\n<table><tr><th>case (smallest first)</th><th>size"
         "</th><th>result</th><th>per tensor</th></tr>\n";
    for (size_t i = 0; i < r.non_interference.cases.size(); ++i) {
      const NonInterferenceCase& c = r.non_interference.cases[i];
      std::string ts;
      for (const Verdict& v : c.verdicts) {
        ts += fmt::format("{}{} {}", ts.empty() ? "" : ", ", v.tensor, MarginText(v));
      }
      const bool smallest = static_cast<int>(i) == r.non_interference.smallest_leak;
      h += fmt::format("<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", Esc(c.label),
                       smallest ? " <b>(smallest leak)</b>" : "", c.size,
                       c.verdicts.empty() ? "n/a"
                       : !c.leaks && !c.kernel_error.empty()
                           ? std::string("<span class=\"fail\">kernel error</span>")
                           : PassFail(!c.leaks),
                       Esc(c.verdicts.empty() ? c.note : ts));
    }
    h += "</table>\n";
    if (r.non_interference.smallest_leak >= 0) {
      const NonInterferenceCase& c =
          r.non_interference.cases[static_cast<size_t>(r.non_interference.smallest_leak)];
      for (const Verdict& v : c.verdicts) {
        if (!v.pass) {
          h += "<p>" + Esc(v.tensor + ": " + v.message) + "</p>\n";
          break;
        }
      }
      if (!r.non_interference.repro.empty()) {
        h += "<pre>" + Esc(r.non_interference.repro) + "</pre>\n";
      }
    }
  }
  h += "</section>\n";
}

// The forward/backward consistency identities per kernel and case.
void HtmlConsistency(std::string& h, std::span<const AuditResult> results) {
  h += "<section id=\"consistency\">\n<h2>Forward/backward consistency</h2>\n<p class=\"note\">"
       "Identities that hold only when the backward differentiates the forward that ran (delta, "
       "dk-sum, dv-sum, the constant-V probe) and the gradients against the oracle at the "
       "recipe's quantised operands; each margin is observed / its rounding bound.</p>\n";
  for (const AuditResult& r : results) {
    h += "<h3>" + Esc(r.kernel) + "</h3>\n<table><tr><th>case</th><th>identity</th><th>policy"
         "</th><th>observed</th><th>allowed</th><th>margin</th></tr>\n";
    for (const ConsistencyCase& c : r.consistency) {
      if (c.verdicts.empty()) {
        h += fmt::format("<tr><td>{}</td><td colspan=\"5\">{}</td></tr>\n", Esc(c.label),
                         Esc(c.note));
      }
      for (const Verdict& v : c.verdicts) {
        h += fmt::format(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} {}</td></tr>\n",
            Esc(c.label), Esc(v.tensor), Esc(v.policy), Fmt(v.observed), Fmt(v.allowed),
            PassFail(v.pass), Fmt(v.margin));
      }
    }
    h += "</table>\n";
  }
  h += "</section>\n";
}

// The gradient-bias charts and per kernel a table of the means and their reading.
void HtmlBias(std::string& h, std::span<const AuditResult> results,
              const std::vector<Figure>& figs) {
  h += fmt::format(
      "<section id=\"bias\">\n<h2>Gradient bias</h2>\n<p class=\"note\">Per tensor and seed, "
      "the mean signed error over its rms (signed), and the mean of err * sign(oracle) over "
      "its rms (magnitude: below zero the kernel shrinks values toward zero). Points are means "
      "over {} seeds (causal where the kernel claims it, S = {}), bars +-2 standard errors; a "
      "mean beyond {:.2f} standard "
      "errors (Student's t, two-sided p = 0.001) is called systematic. Unbiased rounding gives "
      "about 1/sqrt(elements) per seed.</p>\n",
      results[0].plan.bias_seeds, results[0].plan.bias_seqlen,
      TCritical(results[0].plan.bias_seeds - 1));
  h += SectionFigures(figs, "bias");
  for (const AuditResult& r : results) {
    h += "<h3>" + Esc(r.kernel) + "</h3>\n<table><tr><th>tensor</th><th>signed (kernel)</th>"
         "<th>signed (baseline)</th><th>magnitude (kernel)</th><th>magnitude (baseline)</th>"
         "<th>elements per seed</th><th>reading</th></tr>\n";
    for (const BiasStat& b : r.bias) {
      const bool sys = Systematic(b.kernel_mean, b.kernel_se, b.n) ||
                       Systematic(b.kernel_magnitude_mean, b.kernel_magnitude_se, b.n);
      h += fmt::format(
          "<tr><td>{}</td><td>{} ± {}</td><td>{} ± {}</td><td>{} ± {}</td><td>{} ± {}</td>"
          "<td>{:g}</td><td>{}</td></tr>\n",
          b.tensor, Fmt(b.kernel_mean), Fmt(b.kernel_se), Fmt(b.baseline_mean),
          Fmt(b.baseline_se), Fmt(b.kernel_magnitude_mean), Fmt(b.kernel_magnitude_se),
          Fmt(b.baseline_magnitude_mean), Fmt(b.baseline_magnitude_se), b.elements,
          sys ? "<span class=\"fail\">systematic</span>" : "consistent with noise");
    }
    h += "</table>\n";
  }
  h += "</section>\n";
}

// The worst margin per area and tensor, then every failure with its repro line.
void HtmlVerdicts(std::string& h, std::span<const AuditResult> results) {
  h += "<section id=\"verdicts\">\n<h2>Verdicts</h2>\n<p class=\"note\">Worst margin per area "
       "and tensor (margin = observed / allowed; above 1 fails), then every failure with its "
       "reason and repro line. Accuracy is judged on the sweep cases with the kernel's "
       "tolerance profile; the distribution cases are measurements, not verdicts.</p>\n";
  for (const AuditResult& r : results) {
    h += "<h3>" + Esc(r.kernel) + "</h3>\n<table><tr><th>area</th><th>tensor</th><th>worst "
         "case</th><th>policy</th><th>observed</th><th>allowed</th><th>margin</th><th>verdicts"
         "</th></tr>\n";
    std::vector<std::pair<std::string, std::string>> keys;
    for (const AuditVerdict& v : r.verdicts) {
      const auto key = std::make_pair(v.area, v.verdict.tensor);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
    for (const auto& [area, tensor] : keys) {
      int n = 0, fails = 0;
      for (const AuditVerdict& v : r.verdicts) {
        if (v.area != area || v.verdict.tensor != tensor) continue;
        ++n;
        fails += v.verdict.pass ? 0 : 1;
      }
      const AuditVerdict* w = Worst(r, [&, a = area, t = tensor](const AuditVerdict& v) {
        return v.area == a && v.verdict.tensor == t;
      });
      h += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} {}</td>"
          "<td>{} of {} fail</td></tr>\n",
          Esc(area), Esc(tensor), Esc(w->case_label), Esc(w->verdict.policy),
          Fmt(w->verdict.observed), Fmt(w->verdict.allowed), PassFail(w->verdict.pass),
          Fmt(w->verdict.margin), fails, n);
    }
    h += "</table>\n";
    bool any = false;
    for (const AuditVerdict& v : r.verdicts) {
      if (v.verdict.pass) continue;
      if (!any) h += "<h3>Failures</h3>\n<ul>\n";
      any = true;
      h += "<li>" + Esc(v.area + " / " + v.case_label + " / " + v.verdict.tensor + ": " +
                        v.verdict.message);
      if (!v.verdict.repro.empty()) h += "<br/><code>" + Esc(v.verdict.repro) + "</code>";
      h += "</li>\n";
    }
    if (any) h += "</ul>\n";
  }
  h += "</section>\n";
}

}  // namespace

std::string AuditToHtml(std::span<const AuditResult> results) {
  const std::vector<Figure> figs = Figures(results);
  std::string title = "attest audit";
  for (const AuditResult& r : results) title += " " + r.kernel;
  std::string h = "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n"
                  "<head>\n<meta charset=\"utf-8\"/>\n<title>" +
                  Esc(title) + "</title>\n<style>" + kCss + "</style>\n</head>\n<body>\n";
  h += "<h1>" + Esc(title) + "</h1>\n";
  h += "<p class=\"note\">Is this low-precision attention mode safe to train with? Errors are "
       "measured against attest's float64 oracle on the inputs the kernel saw (rounded to the "
       "input dtype); the baseline, " +
       Esc(results.empty() ? std::string() : results[0].baseline) +
       " (dashed blue), runs the same cases, so a kernel close to it loses nothing that a run "
       "with the baseline does not.</p>\n";
  HtmlSummary(h, results);
  HtmlLeakMaps(h, results, figs);
  HtmlErrorCurves(h, results, figs);
  HtmlNonInterference(h, results);
  HtmlConsistency(h, results);
  HtmlBias(h, results, figs);
  HtmlVerdicts(h, results);
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace attest
