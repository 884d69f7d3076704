// Subcommand registry of the attest CLI (CLI11 `subcom_in_files` pattern): each cmd_*.cc
// defines an options struct, a Setup that declares its options on a CLI::App and returns
// the runner, and registers itself with ATTEST_COMMAND. Runners only call the library and
// return an exit code (verify/report/exit_codes.h); they throw UsageError for bad input.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "reference/status.h"
#include "run/launcher.h"
#include "run/usage_error.h"
#include "verify/report/exit_codes.h"

namespace attest::cli {

// Bad input from the user or the environment (run/usage_error.h): printed as
// "attest <cmd>: <message>", exit code 2.
using ::attest::UsageError;

// Numeric options parsed strictly: the whole word must be a number of the option's type
// inside [min, max] (std::from_chars: no sign on unsigned options, no blanks, no trailing
// characters, no wrap-around), so that "--seed -1", "--seed 18446744073709551616",
// "--seed ''" and "--shard 0/99999999999999999999" are usage errors naming the option
// instead of 2^64 - 1, 0 or an internal error.
CLI::Option* AddUnsignedOption(CLI::App& app, const std::string& name, uint64_t& target,
                               const std::string& help);
CLI::Option* AddIntegerOption(CLI::App& app, const std::string& name, int64_t& target,
                              int64_t min, int64_t max, const std::string& help);
CLI::Option* AddIntegerOption(CLI::App& app, const std::string& name, int& target, int min,
                              int max, const std::string& help);
// A finite number of seconds > 0.
CLI::Option* AddSecondsOption(CLI::App& app, const std::string& name, double& target,
                              const std::string& help);
// Parses a whole word as an integer in [min, max]; the Error says what is wrong with it.
Expected<int64_t> ParseInteger(std::string_view text, int64_t min, int64_t max);

// `--gpu auto|keep` of `attest check` and `attest fuzz` (run/launcher.h). auto (the default):
// a process a launcher started as one of several on a node (LOCAL_RANK, SLURM_LOCALID, ...)
// narrows the visible GPUs to its own, and says so on stderr unless `quiet`; keep: the
// environment is left as it is. Call before the kernel or the oracle touches a GPU.
void AddGpuOption(CLI::App& app, std::string& target);
std::optional<GpuChoice> ApplyGpuOption(const std::string& mode, bool quiet,
                                        std::string_view command);

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string help;
  Setup setup;
  int order;  // position in `attest --help`
};

std::vector<CommandInfo>& Commands();

struct RegisterCommand {
  RegisterCommand(std::string name, std::string help, int order, Setup setup) {
    Commands().push_back({std::move(name), std::move(help), std::move(setup), order});
  }
};

#define ATTEST_COMMAND_CONCAT2(a, b) a##b
#define ATTEST_COMMAND_CONCAT(a, b) ATTEST_COMMAND_CONCAT2(a, b)
// ATTEST_COMMAND("list", "List kernels, checks, ...", 10, SetupList);
#define ATTEST_COMMAND(name, help, order, setup) \
  static ::attest::cli::RegisterCommand ATTEST_COMMAND_CONCAT(attest_cmd_, __LINE__)(name, help, order, setup)

}  // namespace attest::cli
