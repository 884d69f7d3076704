// `attest repro --kernel K --case F [--check NAME] [--dump DIR] [--oracle-device auto|cpu|cuda]`
// (docs/design.md "CLI contract"):
// re-runs the checks on a saved case with bit-identical inputs (MakeCaseInputs) and the same
// verdict and exit code as `attest check` (0 pass, 1 finding, 2 usage). Without --check, the
// check is read from a file name written by `attest check` (<kernel>-<check>-<tensor>-<hash>
// .case.json) or `attest fuzz` (<check>-<hash>.case.json); failing that, every check runs.
// --dump writes inputs.safetensors (q, k, v, do), outputs.safetensors (the kernel's o, lse,
// dq, dk, dv as returned) and oracle.safetensors.
// --export DIR writes a failing verdict as a folder a maintainer runs without attest (docs/
// python.md "Exporting a finding"): the dump, the case (case.json), the report (report.json)
// and REPORT.md with the one attest repro command; for a kernel reached from Python (an exec:
// worker running tools/workers/torch_worker.py or `python -m attest.worker`) the worker then
// adds repro.py, the standalone script (tools/workers/torch_export.py). Written to a temporary
// folder beside DIR and renamed: never half a folder.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <sys/wait.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/case/inputs.h"
#include "reference/formats/format.h"
#include "reference/io/safetensors.h"
#include "reference/oracle/oracle.h"
#include "run/build_info.h"
#include "run/check_run.h"
#include "tools/attest/command.h"
#include "verify/report/report.h"
#include "verify/report/repro.h"
#include "run/run.h"

namespace attest::cli {
namespace {

struct ReproCliOptions {
  std::string kernel;
  std::string case_file;
  std::string check;
  std::string dump;
  std::string export_dir;
  std::string export_tensor;  // the failing verdict exported: the first on this tensor
  std::string export_name;  // how REPORT.md's command names the kernel (default: --kernel)
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
          int threads, const CudaOracleOptions* cuda, bool quiet = false) {
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
  if (in.sink.defined()) {  // F32, as a case file's inputs hold it (reference/case/inputs.h)
    auto sink = Convert(in.sink, Format::kF32);
    if (!sink.ok()) throw UsageError("sink: " + sink.error().message);
    inputs.Add("sink", *sink);
  }
  if (in.rel_bias.defined()) {  // F32 likewise
    auto bias = Convert(in.rel_bias, Format::kF32);
    if (!bias.ok()) throw UsageError("rel_bias: " + bias.error().message);
    inputs.Add("rel_bias", *bias);
  }
  write(inputs, "inputs.safetensors");
  OracleOptions oo;
  oo.threads = threads;
  if (in.sink.defined()) oo.sink = &in.sink;
  if (in.rel_bias.defined()) oo.rel_bias = &in.rel_bias;
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
  if (!quiet) std::cout << "dumped inputs, outputs and oracle to " << dir.string() << "\n";
}

// Whether `spec` is an exec: worker that renders its calls (torch_export.py): the PyTorch
// adapters' worker or the Python package's.
bool RendersPython(const std::string& spec) {
  return spec.rfind("exec:", 0) == 0 && (spec.find("torch_worker.py") != std::string::npos ||
                                         spec.find("attest.worker") != std::string::npos);
}

void WriteText(const std::filesystem::path& file, const std::string& text) {
  std::ofstream f(file, std::ios::binary);
  f << text;
  if (!f.good()) throw UsageError(file.string() + ": cannot write");
}

// Runs `command` through /bin/sh; its exit status, its stdout in `out`.
int RunCommand(const std::string& command, std::string* out) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

// The export folder (see the file comment). `dir` is checked before the run (CheckExportDir).
void Export(Kernel& kernel, const ReproCliOptions& opt, const Case& c, const RunResult& result,
            const CudaOracleOptions* cuda) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(opt.export_dir);
  const Verdict* first = nullptr;
  for (const Verdict& v : result.report.verdicts) {
    if (!v.pass && (opt.export_tensor.empty() || v.tensor == opt.export_tensor)) {
      first = &v;
      break;
    }
  }
  if (first == nullptr) {
    std::cout << "attest repro: no failing verdict"
              << (opt.export_tensor.empty() ? "" : " on " + opt.export_tensor)
              << "; nothing exported to " << opt.export_dir << "\n";
    return;
  }
  const fs::path tmp = dir.parent_path() /
                       fmt::format(".{}.export-{}", dir.filename().string(), getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw UsageError(tmp.string() + ": cannot create directory: " + ec.message());
  struct Cleanup {
    fs::path path;
    bool armed = true;
    ~Cleanup() {
      std::error_code e;
      if (armed) fs::remove_all(path, e);
    }
  } cleanup{tmp};

  auto inputs = MakeCaseInputs(c);
  if (!inputs.ok()) throw UsageError(inputs.error().message);
  Dump(kernel, c, *inputs, tmp, opt.threads, cuda, /*quiet=*/true);
  fs::copy_file(opt.case_file, tmp / "case.json", ec);
  if (ec) throw UsageError(opt.case_file + ": cannot copy: " + ec.message());
  WriteText(tmp / "report.json", ToJsonText(result.report));
  const std::string name = opt.export_name.empty() ? opt.kernel : opt.export_name;
  const std::string command = ReproCommand(name, "case.json", first->check);
  const std::string case_label = fs::path(opt.case_file).filename().string();
  nlohmann::json meta = {{"attest_version", std::string(AttestVersion())},
                         {"attest_commit", std::string(AttestCommit())},
                         {"kernel", name},
                         {"case_label", case_label},
                         {"command", command},
                         {"check", first->check},
                         {"tensor", first->tensor}};
  WriteText(tmp / "export.json", meta.dump(1) + "\n");
  WriteText(tmp / "repro.sh", "#!/bin/sh\n# Run from this folder, with attest on PATH.\n" +
                                  command + "\n");
  fs::permissions(tmp / "repro.sh", fs::perms::owner_exec | fs::perms::group_exec |
                                        fs::perms::others_exec, fs::perm_options::add, ec);

  std::string why;
  if (RendersPython(opt.kernel)) {
    std::string out;
    const int rc = RunCommand(opt.kernel.substr(5) + " --export " + ShellQuote(tmp.string()),
                              &out);
    if (rc == 3) {
      why = LastLine(out);
      if (why.rfind("not exportable: ", 0) == 0) why = why.substr(16);
    } else if (rc != 0) {
      why = fmt::format("the worker's export failed (exit status {}): {}", rc, LastLine(out));
      std::cerr << "attest repro: " << why << "\n";
    }
  } else if (opt.kernel.rfind("py:", 0) == 0) {
    why = "a Python function in this process: Verdict.export / Report.export render its call";
  } else {
    why = "the kernel is not reached from Python (a built-in, a C ABI plugin or an exec worker "
          "that does not render its calls), so there is no Python call to write down";
  }
  if (!why.empty()) {
    std::string md = fmt::format("# {}: {} fails on {}\n\n", name, first->check,
                                 first->tensor.empty() ? "the case" : first->tensor);
    md += fmt::format("**Case.** `case.json` ({})\n\n", case_label);
    md += fmt::format("**Verdict.** {}\n\n", first->message);
    if (first->policy.size()) md += fmt::format("Allowance: {}\n\n", first->policy);
    md += fmt::format("No standalone script: {}.\n\n", why);
    md += "**Reproduce** with attest, from this folder:\n\n```bash\n" + command + "\n```\n\n";
    md += "Files: `case.json` (the case), `inputs.safetensors` (q, k, v, do in attest's "
          "layout, bit for bit what the kernel was given), `oracle.safetensors` (attest's "
          "float64 reference: o, lse and the gradients), `outputs.safetensors` (what the kernel "
          "returned), `report.json` (the verdicts), `repro.sh` (the command above).\n";
    md += fmt::format("\nExported by attest {}.\n", AttestVersion());
    WriteText(tmp / "REPORT.md", md);
  }
  if (fs::exists(dir)) fs::remove(dir, ec);  // an empty folder (CheckExportDir)
  fs::rename(tmp, dir, ec);
  if (ec) throw UsageError(dir.string() + ": cannot create: " + ec.message());
  cleanup.armed = false;
  if (opt.kernel.rfind("py:", 0) == 0) return;  // the Python package finishes and says so
  std::cout << "attest repro: exported " << first->check << "/" << first->tensor << " to "
            << opt.export_dir
            << (why.empty() ? " (repro.py runs it with PyTorch alone)" : " (attest only: " + why + ")")
            << "\n";
}

// --export DIR must be new or an empty folder: an export never mixes with other files.
void CheckExportDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    const fs::path parent = fs::absolute(dir).parent_path();
    if (!fs::is_directory(parent, ec)) {
      throw UsageError("--export " + dir + ": the folder " + parent.string() +
                       " does not exist");
    }
    return;
  }
  if (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec)) {
    throw UsageError("--export " + dir + ": exists and is not an empty folder");
  }
}

int RunRepro(const ReproCliOptions& opt) {
  auto kernel = Kernels().Create(opt.kernel);
  if (!kernel.ok()) throw UsageError(kernel.error().message);
  auto c = LoadCase(opt.case_file);
  if (!c.ok()) throw UsageError(c.error().message);
  if (!opt.export_dir.empty()) CheckExportDir(opt.export_dir);
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
  if (!opt.export_dir.empty()) {
    Export(**kernel, opt, *c, *result, ro.cuda_oracle ? &*ro.cuda_oracle : nullptr);
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
  sub.add_option("--export", opt->export_dir,
                 "Write the first failing verdict as a folder to send upstream (a new or "
                 "empty DIR): the case, inputs, oracle, REPORT.md with the attest repro "
                 "command, and for a kernel reached from Python (exec: torch_worker.py or "
                 "python -m attest.worker) repro.py, a script that needs PyTorch alone and "
                 "exits 1 while the finding reproduces (docs/python.md)");
  sub.add_option("--export-tensor", opt->export_tensor,
                 "With --export: the first failing verdict on this tensor (o, lse, dq, dk, "
                 "dv) rather than the first failing one");
  sub.add_option("--export-name", opt->export_name,
                 "How --export's commands name the kernel (default: --kernel)");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Oracle threads (0: all cores)");
  sub.add_option("--oracle-device", opt->oracle_device, kOracleDeviceHelp)->capture_default_str();
  return [opt] { return RunRepro(*opt); };
}

}  // namespace

ATTEST_COMMAND("repro", "Re-run the checks on a saved case", 40, SetupRepro);

}  // namespace attest::cli
