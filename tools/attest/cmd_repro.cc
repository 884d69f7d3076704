// `attest repro --kernel K --case F [--check NAME] [--dump DIR] [--oracle-device auto|cpu|cuda]`
// (docs/design.md "CLI contract"):
// re-runs the checks on a saved case with bit-identical inputs (MakeCaseInputs) and the same
// verdict and exit code as `attest check` (0 pass, 1 finding, 2 usage). Without --check, the
// check is read from a file name written by `attest check` (<kernel>-<check>-<tensor>-<hash>
// .case.json) or `attest fuzz` (<check>-<hash>.case.json); failing that, every check runs.
// --dump writes inputs.safetensors (q, k, v, do), outputs.safetensors (the kernel's o, lse,
// dq, dk, dv as returned) and oracle.safetensors.
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "kernels/builtin.h"
#include "reference/case/inputs.h"
#include "reference/io/safetensors.h"
#include "reference/oracle/oracle.h"
#include "run/check_run.h"
#include "tools/attest/command.h"
#include "verify/report/report.h"
#include "run/run.h"

namespace attest::cli {
namespace {

struct ReproCliOptions {
  std::string kernel;
  std::string case_file;
  std::string check;
  std::string dump;
  int threads = 0;
  std::string oracle_device = "auto";
};

// The check named in a failure file's name: attest check writes <kernel>-<check>-<tensor>-
// <hash>.case.json, attest fuzz <check>-<hash>.case.json. The kernel's name may itself hold a
// check's name (mutant/store-permutation), so the rightmost "-<name>-" wins (the check comes
// after the kernel), then a name that starts the file; on a tie the longest name.
const CheckInfo* CheckFromFileName(const std::string& file) {
  const std::string name = std::filesystem::path(file).filename().string();
  const CheckInfo* best = nullptr;
  size_t best_at = 0;
  for (const CheckInfo& c : AllChecks()) {
    const std::string check(c.name);
    size_t at = std::string::npos;
    if (const size_t inner = name.rfind("-" + check + "-"); inner != std::string::npos) {
      at = inner + 1;
    } else if (name.rfind(check + "-", 0) == 0) {
      at = 0;
    }
    if (at == std::string::npos) continue;
    if (best == nullptr || at > best_at || (at == best_at && c.name.size() > best->name.size())) {
      best = &c;
      best_at = at;
    }
  }
  return best;
}

void Dump(Kernel& kernel, const Case& c, const CaseInputs& in, const std::filesystem::path& dir,
          int threads, const CudaOracleOptions* cuda) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError(dir.string() + ": cannot create directory: " + ec.message());
  auto write = [&](const NamedTensors& t, const char* file) {
    if (Status s = WriteSafetensors((dir / file).string(), t); !s.ok()) {
      throw UsageError(s.error().message);
    }
  };
  NamedTensors inputs;
  inputs.Add("q", in.q);
  inputs.Add("k", in.k);
  inputs.Add("v", in.v);
  if (in.dout.defined()) inputs.Add("do", in.dout);
  write(inputs, "inputs.safetensors");
  OracleOptions oo;
  oo.threads = threads;
  NamedTensors oracle;
  if (in.dout.defined()) {
    BackwardOut b = OracleBackwardOn(cuda, c.problem, in.q, in.k, in.v, in.dout, oo);
    oracle.Add("o", b.o);
    oracle.Add("lse", b.lse);
    oracle.Add("dq", b.dq);
    oracle.Add("dk", b.dk);
    oracle.Add("dv", b.dv);
  } else {
    ForwardOut f = OracleForwardOn(cuda, c.problem, in.q, in.k, in.v, oo);
    oracle.Add("o", f.o);
    oracle.Add("lse", f.lse);
  }
  write(oracle, "oracle.safetensors");
  NamedTensors outputs;
  auto f = kernel.Forward(c.problem, in.q, in.k, in.v);
  if (auto* r = std::get_if<ForwardResult>(&f)) {
    outputs.Add("o", r->o);
    if (r->lse.defined()) outputs.Add("lse", r->lse);  // a kernel without lse has none
    if (in.dout.defined() && kernel.capabilities().backward) {
      auto b = kernel.Backward(c.problem, in.q, in.k, in.v, r->o, r->lse, in.dout);
      if (auto* g = std::get_if<BackwardResult>(&b)) {
        outputs.Add("dq", g->dq);
        outputs.Add("dk", g->dk);
        outputs.Add("dv", g->dv);
      }
    }
  }
  write(outputs, "outputs.safetensors");
  std::cout << "dumped inputs, outputs and oracle to " << dir.string() << "\n";
}

int RunRepro(const ReproCliOptions& opt) {
  auto kernel = Kernels().Create(opt.kernel);
  if (!kernel.ok()) throw UsageError(kernel.error().message);
  auto c = LoadCase(opt.case_file);
  if (!c.ok()) throw UsageError(c.error().message);
  std::vector<const CheckInfo*> checks;
  if (!opt.check.empty()) {
    RequireCheck(opt.check, "--check");
    const CheckInfo* check = FindCheck(opt.check);
    checks.push_back(check);
  } else if (const CheckInfo* from_name = CheckFromFileName(opt.case_file)) {
    checks.push_back(from_name);
  } else {
    for (const CheckInfo& check : AllChecks()) checks.push_back(&check);
  }
  RunOptions ro;
  ro.kernel_spec = opt.kernel;
  ro.oracle.threads = opt.threads;
  std::string note;
  ro.cuda_oracle = OracleDeviceFor(opt.oracle_device, **kernel, "--oracle-device", &note);
  if (!note.empty()) std::cerr << "attest repro: " << note << "\n";
  auto result = RunCase(**kernel, *c, checks, ro, opt.case_file);
  if (!result.ok()) throw UsageError(result.error().message);
  std::cout << ToConsole(result->report);
  if (!opt.dump.empty()) {
    auto inputs = MakeCaseInputs(*c);
    if (!inputs.ok()) throw UsageError(inputs.error().message);
    Dump(**kernel, *c, *inputs, opt.dump, opt.threads,
         ro.cuda_oracle ? &*ro.cuda_oracle : nullptr);
  }
  return result->report.passed() ? kExitPass : kExitFinding;
}

Runner SetupRepro(CLI::App& sub) {
  auto opt = std::make_shared<ReproCliOptions>();
  sub.add_option("--kernel", opt->kernel, "Kernel to run")->required();
  sub.add_option("--case", opt->case_file, "Case file (*.case.json), e.g. from attest check")
      ->required();
  sub.add_option("--check", opt->check,
                 "Check to run (default: the one in the file name, else all)");
  sub.add_option("--dump", opt->dump,
                 "Write inputs/outputs/oracle .safetensors into this directory");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  sub.add_option("--oracle-device", opt->oracle_device, kOracleDeviceHelp)->capture_default_str();
  return [opt] { return RunRepro(*opt); };
}

}  // namespace

ATTEST_COMMAND("repro", "Re-run the checks on a saved case", 40, SetupRepro);

}  // namespace attest::cli
