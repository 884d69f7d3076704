// `attest golden verify|regen [--dir golden/cases] [--only NAME]` (docs/design.md
// "CLI contract"): verify the pinned mp256 golden cases against the float64
// oracle, or regenerate them from reference/golden/catalog.cc. Exit 0 all hold, 1 drift
// (inputs no longer reproduce, or the oracle left its certified bound), 2 a missing or
// corrupt file.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/exec/process.h"
#include "reference/golden/golden.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

struct GoldenOptions {
  std::string action;
  std::string dir = "golden/cases";
  std::string only;
  int threads = 0;
  std::string commit;
};

// The first line of a git command's output ("" if it cannot run or fails). argv-based
// (kernels/exec/process.h CaptureOutput): no shell sees the folder name, so a quote or `;` in
// it is just a character of the path.
std::string GitFirstLine(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"git"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto out = CaptureOutput(argv, /*timeout_s=*/60);
  if (!out) return "";
  std::string line = out->substr(0, out->find('\n'));
  while (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

// `git rev-parse HEAD` of the tree holding `dir`, "+dirty" when it has uncommitted changes
// outside the golden folder itself, or "unknown" outside a checkout.
std::string GitCommit(const std::string& dir) {
  const std::string head = GitFirstLine({"-C", dir, "rev-parse", "HEAD"});
  if (head.size() != 40) return "unknown";
  const std::string dirty = GitFirstLine({"-C", dir, "status", "--porcelain",
                                          "--untracked-files=no", "--", ":/", ":!:golden/cases"});
  return dirty.empty() ? head : head + "+dirty";
}

std::string Repro(const GoldenOptions& opt, const std::string& name) {
  return fmt::format("attest golden verify --dir {} --only {}", opt.dir, name);
}

int RunVerify(const GoldenOptions& opt) {
  GoldenVerifyOptions v;
  v.dir = opt.dir;
  if (!opt.only.empty()) v.only = opt.only;
  v.oracle.threads = opt.threads;
  auto reports = VerifyGolden(v);
  if (!reports) throw UsageError(reports.error().message);
  // One row per case and tensor: the observed error, the certified bound, their ratio.
  std::cout << fmt::format("{:<34} {:<6} {:>10} {:>10} {:>10} {:>9}  {}\n", "case", "tensor",
                           "max|err|", "rel", "bound", "margin", "worst index");
  int pass = 0, fail = 0;
  for (const GoldenCaseReport& r : *reports) {
    for (const GoldenTensorCheck& t : r.tensors) {
      std::cout << fmt::format("{:<34} {:<6} {:>10.3e} {:>10.3e} {:>10.3e} {:>9.2e}  {}{}\n",
                               r.name, t.tensor, t.max_abs_error, t.relative_error(), t.bound,
                               t.margin(), t.worst_index, t.pass ? "" : "  DRIFT");
    }
    if (r.outcome == GoldenOutcome::kPass) {
      ++pass;
    } else {
      ++fail;
      for (const std::string& m : r.messages) {
        std::cerr << (r.outcome == GoldenOutcome::kBroken ? "BROKEN " : "DRIFT ") << m
                  << "\n  repro: " << Repro(opt, r.name) << "\n";
      }
    }
  }
  std::cout << fmt::format("golden verify: {} passed, {} failed\n", pass, fail);
  return GoldenExitCode(*reports);
}

int RunRegen(const GoldenOptions& opt) {
  GoldenRegenOptions g;
  g.dir = opt.dir;
  if (!opt.only.empty()) g.only = opt.only;
  g.oracle.threads = opt.threads;
  g.commit = opt.commit.empty() ? GitCommit(opt.dir) : opt.commit;
  g.log = [](std::string_view line) { std::cerr << "regen " << line << "\n"; };
  auto report = RegenGolden(g);
  if (!report) throw UsageError(report.error().message);
  std::cout << fmt::format("golden regen: {} written, {} unchanged, {} dropped{}\n",
                           report->written.size(), report->unchanged.size(),
                           report->dropped.size(),
                           report->dropped.empty()
                               ? std::string()
                               : fmt::format(" ({})", fmt::join(report->dropped, ", ")));
  return kExitPass;
}

Runner SetupGolden(CLI::App& sub) {
  auto opt = std::make_shared<GoldenOptions>();
  sub.add_option("action", opt->action, "verify: check hashes and the oracle against the "
                                        "mp256 outputs; regen: rewrite everything")
      ->required()
      ->check(CLI::IsMember({"verify", "regen"}));
  sub.add_option("--dir", opt->dir, "Folder of the golden cases and manifest.json")
      ->capture_default_str();
  sub.add_option("--only", opt->only, "Only this case (its name, without suffixes)");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  sub.add_option("--commit", opt->commit,
                 "regen: commit recorded in the provenance (default: git rev-parse HEAD)");
  return [opt] { return opt->action == "verify" ? RunVerify(*opt) : RunRegen(*opt); };
}

}  // namespace

ATTEST_COMMAND("golden", "Verify or regenerate the pinned mp256 golden cases", 90, SetupGolden);

}  // namespace attest::cli
