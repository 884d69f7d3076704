// attest: numerical verification of attention kernels. Registers every subcommand and maps
// outcomes to the fixed exit codes: 0 pass, 1 finding, 2 usage or infrastructure error.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "tools/attest/build_info.h"
#include "tools/attest/command.h"

int main(int argc, char** argv) {
  using namespace attest;
  using namespace attest::cli;
  CLI::App app{"attest: verify attention kernels against a high-precision oracle.\n"
               "Exit codes: 0 all checks hold, 1 a check failed, 2 usage or infrastructure "
               "error."};
  app.require_subcommand(1);
  const std::string commit(AttestCommit());
  app.set_version_flag("--version", fmt::format("attest {}{}", AttestVersion(),
                                                commit.empty() ? "" : " (" + commit + ")"));

  auto& commands = Commands();
  std::sort(commands.begin(), commands.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.order < b.order; });
  std::vector<std::pair<CLI::App*, Runner>> runners;
  for (const auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners.emplace_back(sub, c.setup(*sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }

  for (auto& [sub, run] : runners) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const UsageError& e) {
      std::cerr << "attest " << sub->get_name() << ": " << e.what() << "\n";
      return kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "attest " << sub->get_name() << ": internal error: " << e.what() << "\n";
      return kExitUsage;
    }
  }
  return kExitUsage;
}
