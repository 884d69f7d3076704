// `attest compare --case FILE.case.json --outputs F.safetensors [--profile P] [--json F]
// [--junit F] [--markdown F]` (docs/design.md "CLI contract"): judges
// outputs produced elsewhere (a PyTorch script, a GPU run) against the float64 oracle with a
// tolerance profile. Exit 0 every check holds, 1 a check failed, 2 bad input.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "reference/case/case_file.h"
#include "reference/formats/format.h"
#include "reference/io/safetensors.h"
#include "run/build_info.h"
#include "run/check_run.h"
#include "tools/attest/command.h"
#include "run/compare.h"
#include "verify/report/report.h"

namespace attest::cli {
namespace {

struct CompareCliOptions {
  std::string case_file;
  std::string outputs;
  std::string profile;
  std::string output_format;
  bool lse_pos_inf = false;
  bool no_lse = false;
  int threads = 0;
  std::string json, junit, markdown;
};

std::string Quote(const std::string& s) {
  if (s.find_first_of(" \t'\"$\\;&|<>()*?") == std::string::npos) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void WriteOrThrow(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  if (Status s = WriteTextFile(path, text); !s.ok()) throw UsageError(s.error().message);
}

int RunCompare(const CompareCliOptions& opt) {
  auto c = LoadCase(opt.case_file);
  if (!c.ok()) throw UsageError(c.error().message);
  auto outputs = ReadSafetensors(opt.outputs);
  if (!outputs.ok()) throw UsageError(outputs.error().message);

  CompareOutputsOptions copt;
  if (!opt.profile.empty()) {
    copt.profile = &ProfileNamed(opt.profile, "--profile");
  }
  if (!opt.output_format.empty()) {
    copt.output_format = ParseFormat(opt.output_format);
    if (!copt.output_format)
      throw UsageError("--output-format: unknown format '" + opt.output_format + "'");
  }
  copt.lse_pos_inf_for_empty = opt.lse_pos_inf;
  copt.lse = !opt.no_lse;
  copt.oracle.threads = opt.threads;
  copt.repro = "attest compare --case " + Quote(opt.case_file) + " --outputs " + Quote(opt.outputs);
  if (!opt.profile.empty()) copt.repro += " --profile " + Quote(opt.profile);
  if (!opt.output_format.empty()) copt.repro += " --output-format " + opt.output_format;
  if (opt.lse_pos_inf) copt.repro += " --lse-pos-inf";
  if (opt.no_lse) copt.repro += " --no-lse";

  auto result = CompareOutputs(*c, *outputs, copt);
  if (!result.ok()) throw UsageError(opt.outputs + ": " + result.error().message);
  Report& report = result->report;
  report.kernel = "outputs:" + opt.outputs;
  report.attest_version = std::string(AttestVersion());
  report.attest_commit = std::string(AttestCommit());
  for (Verdict& v : report.verdicts) {  // every verdict judges the one case given
    v.case_ = *c;
    v.case_label = opt.case_file;
    v.case_file = opt.case_file;
  }
  std::cout << ToConsole(report);
  WriteOrThrow(opt.json,
               ToJsonText(report));
  WriteOrThrow(opt.junit, ToJUnitXml(report));
  WriteOrThrow(opt.markdown, ToMarkdown(report));
  return report.passed() ? kExitPass : kExitFinding;
}

Runner SetupCompare(CLI::App& sub) {
  auto opt = std::make_shared<CompareCliOptions>();
  sub.add_option("--case", opt->case_file, "Case file (*.case.json) whose inputs were used")
      ->required();
  sub.add_option("--outputs", opt->outputs,
                 "safetensors file with o, lse (required) and dq, dk, dv (optional)")
      ->required();
  sub.add_option("--profile", opt->profile,
                 "Tolerance profile (`attest list profiles`); default: the problem's dtype");
  sub.add_option("--output-format", opt->output_format,
                 "Format the reported ULP error is counted in (default: each tensor's stored "
                 "dtype); the profile's bounds count ULPs in the formats they promise");
  sub.add_flag("--lse-pos-inf", opt->lse_pos_inf,
               "The producer declares lse = +inf for empty rows");
  sub.add_flag("--no-lse", opt->no_lse,
               "The producer returns no lse (capabilities \"lse\": false): judge o and the "
               "gradients only");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  sub.add_option("--json", opt->json, "Write the report as JSON");
  sub.add_option("--junit", opt->junit, "Write the report as JUnit XML");
  sub.add_option("--markdown", opt->markdown, "Write the report as Markdown");
  return [opt] { return RunCompare(*opt); };
}

}  // namespace

ATTEST_COMMAND("compare", "Judge outputs produced elsewhere against the oracle", 60, SetupCompare);

}  // namespace attest::cli
