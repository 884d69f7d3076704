// `attest audit --kernel K [--baseline K2] --out DIR [--seed S] [--quick]
// [--oracle-device auto|cpu|cuda]` and
// `attest audit --compare K1 K2 ... --out DIR` (docs/design.md "CLI contract"; docs/audit.md):
// writes DIR/report.html (self-contained, inline SVG), DIR/report.md and DIR/report.json,
// and the smallest leaking case of each kernel into DIR. A progress bar on a terminal, plain
// lines otherwise (tools/attest/progress.h). Exit 0 when every verdict of the audit holds, 1
// when one failed (the reports are written either way), 2 on usage or infrastructure errors.
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "run/check_run.h"
#include "tools/attest/command.h"
#include "tools/attest/progress.h"
#include "run/audit/audit.h"
#include "run/audit/render.h"
#include "verify/report/report.h"

namespace attest::cli {
namespace {

struct AuditCliOptions {
  std::string kernel;
  std::vector<std::string> compare;
  std::string baseline = "cpu/flash2-bf16";
  std::string out;
  uint64_t seed = 0;
  bool quick = false;
  std::string distributions;  // comma-separated override of the plan's list
  int threads = 0;
  std::string oracle_device = "auto";
};

void Write(const std::filesystem::path& path, const std::string& text) {
  if (Status s = WriteTextFile(path, text); !s.ok()) throw UsageError(s.error().message);
}

int RunAuditCli(const AuditCliOptions& opt) {
  std::vector<std::string> kernels = opt.compare;
  if (!opt.kernel.empty()) kernels.insert(kernels.begin(), opt.kernel);
  if (kernels.empty()) throw UsageError("give --kernel K or --compare K1 K2 ...");
  if (!opt.kernel.empty() && !opt.compare.empty()) {
    throw UsageError("--kernel and --compare exclude each other");
  }
  const std::filesystem::path dir(opt.out);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError(opt.out + ": cannot create directory: " + ec.message());

  AuditPlan plan = opt.quick ? QuickAuditPlan() : DefaultAuditPlan();
  if (!opt.distributions.empty()) {
    plan.distributions.clear();
    std::stringstream ss(opt.distributions);
    for (std::string item; std::getline(ss, item, ',');) {
      if (!item.empty()) plan.distributions.push_back(item);
    }
  }
  std::vector<AuditResult> results;
  for (const std::string& k : kernels) {
    AuditOptions ao;
    ao.kernel_spec = k;
    ao.baseline_spec = opt.baseline;
    ao.seed = opt.seed;
    ao.plan = plan;
    ao.threads = opt.threads;
    ao.oracle_device = opt.oracle_device;
    ao.out_dir = dir;
    // Progress on stderr (tools/attest/progress.h): the step that runs.
    auto progress = std::make_shared<ProgressLine>(ProgressLine::Detect("audit " + k, false));
    ao.progress = [progress](const AuditProgress& p) {
      progress->Update(p.done, p.total, p.what);
    };
    auto r = RunAudit(ao);
    progress->Finish();
    if (!r.ok()) throw UsageError(k + ": " + r.error().message);
    if (!r->oracle_note.empty()) {
      std::cerr << "attest audit: " << k << ": " << r->oracle_note << "\n";
    }
    results.push_back(std::move(r).value());
  }
  Write(dir / "report.html", AuditToHtml(results));
  Write(dir / "report.md", AuditToMarkdown(results));
  Write(dir / "report.json",
        AuditToJson(results).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
            "\n");
  bool passed = true;
  for (const AuditResult& r : results) {
    passed = passed && r.passed();
    std::cout << fmt::format("{} {}: {} of {} verdicts fail; {}; {:.1f} s\n",
                             r.passed() ? "PASS" : "FAIL", r.kernel, r.failures(),
                             r.verdicts.size(),
                             r.leaks() ? "LEAKS (smallest case: " +
                                             r.non_interference
                                                 .cases[static_cast<size_t>(
                                                     r.non_interference.smallest_leak)]
                                                 .label +
                                             ")"
                             : r.non_interference.kernel_errors > 0
                                 ? fmt::format("leaks not judged in {} case(s): kernel error",
                                               r.non_interference.kernel_errors)
                                 : "no leak",
                             r.seconds);
    if (!r.non_interference.repro.empty()) {
      std::cout << "  repro: " << r.non_interference.repro << "\n";
    }
    for (const AuditVerdict& v : r.verdicts) {
      if (v.verdict.pass) continue;
      std::cout << fmt::format("  FAIL {} [{}] {} margin {:.3g}\n", v.area, v.case_label,
                               v.verdict.tensor, v.verdict.margin);
    }
  }
  std::cout << "wrote " << (dir / "report.html").string() << ", report.md, report.json\n";
  return passed ? kExitPass : kExitFinding;
}

Runner SetupAudit(CLI::App& sub) {
  auto opt = std::make_shared<AuditCliOptions>();
  auto* kernel = sub.add_option("--kernel", opt->kernel, "Kernel to audit");
  auto* compare = sub.add_option("--compare", opt->compare,
                                 "Audit several kernels and render them side by side");
  kernel->excludes(compare);
  sub.add_option("--baseline", opt->baseline, "Kernel plotted beside it")->capture_default_str();
  sub.add_option("--out", opt->out, "Directory for report.html, report.md, report.json")
      ->required();
  AddUnsignedOption(sub, "--seed", opt->seed, "Run seed (same seed, same data; default 0)");
  sub.add_flag("--quick", opt->quick, "Smaller sweeps (seconds instead of minutes)");
  sub.add_option("--distributions", opt->distributions,
                 "Comma-separated generator names (default: the ten value families)");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  sub.add_option("--oracle-device", opt->oracle_device, kOracleDeviceHelp)->capture_default_str();
  return [opt] { return RunAuditCli(*opt); };
}

}  // namespace

ATTEST_COMMAND("audit", "Audit a low-precision kernel: plots, leak maps, bias (report.html)", 45,
               SetupAudit);

}  // namespace attest::cli
