// What `attest check` is, for every front end that runs it (the CLI's tools/attest/cmd_check.cc,
// the Python package's attest._core.check in python/src/core.cc, the public C++ API's RunChecks
// in run/public_check.cc): one request (CheckRequest), validated the same way (PrepareCheck:
// names, shares, where the oracle runs), run the same way (RunCheckSuite: RunSuite (run/run.h),
// the attest that wrote the report, the coverage guard of run/coverage.h), and written as the
// same JSON text (verify/report/report.h ToJsonText). run/front_ends_test.sh holds the three to it.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/kernel.h"
#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/status.h"
#include "run/coverage.h"
#include "run/run.h"
#include "run/suite.h"
#include "run/usage_error.h"
#include "verify/tolerance/tolerance.h"

namespace attest {

// The suite called `name`; else a UsageError "<field>: unknown suite ..." (`field` as the
// front end spells the option: "--suite", "suite").
const Suite& SuiteNamed(std::string_view name, std::string_view field);
// Nothing when `name` is empty or a registered check; else a UsageError naming `field`.
void RequireCheck(std::string_view name, std::string_view field);
// The tolerance profile called `name`; else a UsageError naming `field`. Each of these errors
// suggests the nearest name (reference/names.h DidYouMean).
const Profile& ProfileNamed(std::string_view name, std::string_view field);
// The coverage guard's policy for --max-skipped and --allow-skips; a share outside [0, 1] is
// a UsageError naming `field`.
CoveragePolicy CoverageFor(double max_skipped, bool allow_skips, std::string_view field);

// --oracle-device: run/run.h ResolveOracleDevice, its error a UsageError.
std::optional<CudaOracleOptions> OracleDeviceFor(std::string_view choice, const Kernel& kernel,
                                                 std::string_view field, std::string* note);
inline constexpr const char* kOracleDeviceHelp =
    "Where the float64 oracle runs: auto (the GPU for a kernel whose tensors live on a CUDA "
    "GPU, when the CUDA oracle finds one), cpu, cuda";

// RunSuite, then the report's attest version and commit (build_info.h) and the coverage
// guard, restricted to `options.only_check` as the run was.
Expected<RunResult> RunCheckSuite(Kernel& kernel, const Suite& suite, const RunOptions& options,
                                  CoveragePolicy policy);

// One `attest check`, as its user states it to any front end (`attest check --help` documents
// each field under its option's name).
struct CheckRequest {
  std::string kernel_spec;  // as the report and repro lines name the kernel
  std::string suite = "quick";
  uint64_t seed = 0;
  std::string only_check;                            // "" every check
  std::optional<std::filesystem::path> failure_dir;  // failing cases saved there (unset: none)
  int threads = 0;                                   // oracle threads (0: all cores)
  std::string oracle_device = "auto";                // auto, cpu, cuda
  std::optional<double> time_budget_s;               // wall-time budget of the suite
  bool timings = false;                              // wall times in the JSON report
  double max_skipped = CoveragePolicy{}.max_skipped_share;
  bool allow_skips = false;
  std::function<void(const RunOptions::Progress&)> progress;
};

// How a front end spells the request's options in its errors.
struct CheckFieldNames {
  std::string_view suite = "--suite", check = "--check", max_skipped = "--max-skipped",
                   oracle_device = "--oracle-device";
};

// A request validated for one kernel: what RunCheckSuite takes.
struct PreparedCheck {
  const Suite* suite = nullptr;
  CoveragePolicy policy;
  RunOptions options;
  std::string oracle_note;  // why a CUDA kernel's oracle runs on the CPU ("": nothing to say)
};

// Validates the suite, check and share names (a UsageError naming the field otherwise,
// with "did you mean") before the kernel is made.
void ValidateCheckNames(const CheckRequest& request, const CheckFieldNames& fields = {});
// ValidateCheckNames, then where the oracle runs for `kernel`; a UsageError on bad input.
PreparedCheck PrepareCheck(const CheckRequest& request, const Kernel& kernel,
                           const CheckFieldNames& fields = {});

}  // namespace attest
