// What `attest check` is, for every front end that runs it (tools/attest/cmd_check.cc, the
// Python package's attest._core.check in python/src/core.cc): the names and shares it
// validates, and what it adds to RunSuite (verify/run.h): the attest that wrote the report and
// the coverage guard (verify/coverage.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kernels/kernel.h"
#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/status.h"
#include "verify/coverage.h"
#include "verify/run.h"
#include "verify/suite.h"
#include "verify/tolerance.h"

namespace attest::cli {

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

// --oracle-device: verify/run.h ResolveOracleDevice, its error a UsageError.
std::optional<CudaOracleOptions> OracleDeviceFor(std::string_view choice, const Kernel& kernel,
                                                 std::string_view field, std::string* note);
inline constexpr const char* kOracleDeviceHelp =
    "Where the float64 oracle runs: auto (the GPU for a kernel whose tensors live on a CUDA "
    "GPU, when the CUDA oracle finds one), cpu, cuda";

// RunSuite, then the report's attest version and commit (build_info.h) and the coverage
// guard, restricted to `options.only_check` as the run was.
Expected<RunResult> RunCheckSuite(Kernel& kernel, const Suite& suite, const RunOptions& options,
                                  CoveragePolicy policy);

}  // namespace attest::cli
