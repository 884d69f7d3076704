// The attest command line (cli_main.h): registers every subcommand with one CLI::App and maps
// outcomes to the fixed exit codes.
#include "tools/attest/cli_main.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernels/exec/children.h"
#include "tools/attest/build_info.h"
#include "tools/attest/command.h"

namespace attest::cli {

int Main(int argc, char** argv, bool own_process) {
  CLI::App app{"attest: verify attention kernels against a high-precision oracle.\n"
               "Exit codes: 0 all checks hold, 1 a check failed, 2 usage or infrastructure "
               "error."};
  app.require_subcommand(1);
  const std::string commit(AttestCommit());
  app.set_version_flag("--version", fmt::format("attest {}{}", AttestVersion(),
                                                commit.empty() ? "" : " (" + commit + ")"));

  auto& commands = Commands();
  std::stable_sort(commands.begin(), commands.end(),
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
    int code = kExitUsage;
    try {
      code = run();
    } catch (const UsageError& e) {
      std::cerr << "attest " << sub->get_name() << ": " << e.what() << "\n";
    } catch (const InfrastructureError& e) {
      std::cerr << "attest " << sub->get_name() << ": " << e.what() << "\n";
    } catch (const std::exception& e) {
      std::cerr << "attest " << sub->get_name() << ": internal error: " << e.what() << "\n";
    }
    std::cout.flush();
    if (own_process) {
      // Stopped by a signal: the run said what it could; end by that signal.
      FinishIfStopped();
      // Every kernel is gone by now, and with it its processes; whatever a child left
      // behind that reached attest through the subreaper goes too.
      KillAllChildren();
    }
    return code;
  }
  return kExitUsage;
}

}  // namespace attest::cli
