// Subcommand registry of the attest CLI (CLI11 `subcom_in_files` pattern): each cmd_*.cc
// defines an options struct, a Setup that declares its options on a CLI::App and returns
// the runner, and registers itself with ATTEST_COMMAND. Runners only call the library and
// return an exit code (verify/exit_codes.h); they throw UsageError for bad input.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "verify/exit_codes.h"

namespace attest::cli {

// Bad input from the user or the environment: printed as "attest <cmd>: <message>",
// exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
