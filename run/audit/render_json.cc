// report.json of `attest audit` (see render.h; docs/audit.md): the same data as the page and
// the Markdown report, numbers as in verify/report/report.h.
#include "run/audit/render.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "run/audit/render_internal.h"
#include "verify/report/report.h"

namespace attest {
namespace {

using audit_render::Systematic;

nlohmann::json Num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::json VerdictsJson(const AuditResult& r) {
  Report rep;
  rep.kernel = r.kernel;
  rep.suite = "audit";
  rep.seed = r.seed;
  for (const AuditVerdict& v : r.verdicts) rep.verdicts.push_back(v.verdict);
  nlohmann::json j = ToJson(rep)["verdicts"];
  for (size_t i = 0; i < r.verdicts.size(); ++i) {
    j[i]["area"] = r.verdicts[i].area;
    j[i]["case"] = r.verdicts[i].case_label;
  }
  return j;
}

nlohmann::json ErrorsJson(const KernelErrors& e) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, t] : e.tensors) {
    if (!t.present) continue;
    j[name] = {{"rel_l2", Num(t.rel_l2)},
               {"max_rel", Num(t.max_rel)},
               {"bias", Num(t.bias)},
               {"magnitude_bias", Num(t.magnitude_bias)},
               {"nonfinite", t.nonfinite},
               {"elements", t.elements}};
  }
  if (!e.note.empty()) j["note"] = e.note;
  return j;
}

nlohmann::json SweepJson(const Sweep& s) {
  nlohmann::json cases = nlohmann::json::array();
  for (size_t i = 0; i < s.cases.size(); ++i) {
    const AuditCase& a = s.cases[i];
    cases.push_back({{"x", s.x[i]},
                     {"label", a.label},
                     {"case", CaseToJson(a.c)},
                     {"kernel", ErrorsJson(a.kernel)},
                     {"baseline", ErrorsJson(a.baseline)}});
  }
  return {{"name", s.name}, {"x_label", s.x_label}, {"cases", cases}};
}

nlohmann::json PlanJson(const AuditPlan& p) {
  return {{"heads", p.heads},
          {"seqlens", p.seqlens},
          {"seqlen_head_dim", p.seqlen_head_dim},
          {"head_dims", p.head_dims},
          {"head_dim_seqlen", p.head_dim_seqlen},
          {"distributions", p.distributions},
          {"distribution_params", p.distribution_params},
          {"distribution_seqlen", p.distribution_seqlen},
          {"leak_seqlen", p.leak_seqlen},
          {"leak_block", p.leak_block},
          {"ni_seqlens", p.ni_seqlens},
          {"consistency_seqlen", p.consistency_seqlen},
          {"bias_seeds", p.bias_seeds},
          {"bias_seqlen", p.bias_seqlen}};
}

}  // namespace

nlohmann::json AuditToJson(std::span<const AuditResult> results) {
  nlohmann::json kernels = nlohmann::json::array();
  bool passed = true;
  for (const AuditResult& r : results) {
    passed = passed && r.passed();
    nlohmann::json maps = nlohmann::json::array();
    for (const LeakMap& m : r.leak.maps) {
      nlohmann::json cells = nlohmann::json::array();
      for (double x : m.cells) cells.push_back(std::isnan(x) ? nlohmann::json() : Num(x));
      maps.push_back({{"tensor", m.tensor},
                      {"rows", m.rows},
                      {"cols", m.cols},
                      {"row_label", m.row_label},
                      {"col_label", m.col_label},
                      {"block", m.block},
                      {"perturbation", m.perturbation},
                      {"judged_cells", m.judged_cells},
                      {"leaking_cells", m.leaking_cells},
                      {"max_change", Num(m.max_change)},
                      {"note", m.note},
                      {"cells", cells}});
    }
    nlohmann::json ni = nlohmann::json::array();
    for (const NonInterferenceCase& c : r.non_interference.cases) {
      Report rep;
      rep.verdicts = c.verdicts;
      ni.push_back({{"label", c.label},
                    {"size", c.size},
                    {"leaks", c.leaks},
                    {"kernel_error", c.kernel_error},
                    {"note", c.note},
                    {"case", CaseToJson(c.c)},
                    {"verdicts", ToJson(rep)["verdicts"]}});
    }
    nlohmann::json cons = nlohmann::json::array();
    for (const ConsistencyCase& c : r.consistency) {
      Report rep;
      rep.verdicts = c.verdicts;
      Report brep;
      brep.verdicts = c.bias;
      cons.push_back({{"label", c.label},
                      {"note", c.note},
                      {"case", CaseToJson(c.c)},
                      {"verdicts", ToJson(rep)["verdicts"]},
                      {"bias_check", {{"note", c.bias_note},
                                      {"verdicts", ToJson(brep)["verdicts"]}}}});
    }
    nlohmann::json bias = nlohmann::json::array();
    for (const BiasStat& b : r.bias) {
      bias.push_back({{"tensor", b.tensor},
                      {"seeds", b.n},
                      {"elements_per_seed", b.elements},
                      {"kernel", {{"mean", Num(b.kernel_mean)}, {"se", Num(b.kernel_se)}}},
                      {"baseline", {{"mean", Num(b.baseline_mean)}, {"se", Num(b.baseline_se)}}},
                      {"kernel_magnitude",
                       {{"mean", Num(b.kernel_magnitude_mean)},
                        {"se", Num(b.kernel_magnitude_se)}}},
                      {"baseline_magnitude",
                       {{"mean", Num(b.baseline_magnitude_mean)},
                        {"se", Num(b.baseline_magnitude_se)}}},
                      {"systematic", Systematic(b.kernel_mean, b.kernel_se, b.n) ||
                                         Systematic(b.kernel_magnitude_mean,
                                                    b.kernel_magnitude_se, b.n)}});
    }
    const NonInterferenceSummary& s = r.non_interference;
    kernels.push_back(
        {{"kernel", r.kernel},
         {"description", r.kernel_description},
         {"baseline", r.baseline},
         {"profile", r.profile},
         {"recipe", r.recipe},
         {"backward", r.has_backward},
         {"sequence_block_scales", r.sequence_block_scales},
         {"passed", r.passed()},
         {"failures", r.failures()},
         {"leaks", r.leaks()},
         {"seconds", r.seconds},
         {"seed", r.seed},
         {"oracle_device", r.oracle_device},
         {"plan", PlanJson(r.plan)},
         {"sweeps",
          {{"seqlen", SweepJson(r.seqlen)},
           {"head_dim", SweepJson(r.head_dim)},
           {"distribution", SweepJson(r.distributions)}}},
         {"leak_maps", {{"problem", ProblemToJson(r.leak.problem)}, {"maps", maps}}},
         {"non_interference",
          {{"cases", ni},
           {"smallest_leak",
            s.smallest_leak >= 0
                ? nlohmann::json(s.cases[static_cast<size_t>(s.smallest_leak)].label)
                : nlohmann::json()},
           {"kernel_errors", s.kernel_errors},
           {"case_file", s.case_file},
           {"repro", s.repro}}},
         {"consistency", cons},
         {"bias", bias},
         {"verdicts", VerdictsJson(r)}});
  }
  return {{"tool", "attest audit"},
          {"baseline", results.empty() ? "" : results[0].baseline},
          {"passed", passed},
          {"kernels", kernels}};
}

}  // namespace attest
