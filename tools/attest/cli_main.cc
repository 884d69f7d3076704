// The attest command line (cli_main.h): registers every subcommand with one CLI::App and maps
// outcomes to the fixed exit codes.
#include "tools/attest/cli_main.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernels/exec/children.h"
#include "reference/names.h"
#include "run/build_info.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

// A parse error as the other usage errors read: the command, the message (an unexpected
// option with the nearest real one: "--sute (did you mean '--suite'?)"), then the usage line
// of the subcommand with its required options and where the rest are listed.
std::string ParseErrorText(const CLI::App& app, const CLI::ParseError& e, int argc,
                           char** argv) {
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands()) sub = s;
  const std::string command = sub != nullptr ? "attest " + sub->get_name() : "attest";
  std::string text = command + ": " + e.what();
  if (sub == nullptr && argc > 1 && argv[1][0] != '-') {  // a mistyped command
    std::vector<std::string> commands;
    for (const CLI::App* s : app.get_subcommands({})) commands.push_back(s->get_name());
    text += " ('" + std::string(argv[1]) + "' is not a command" + DidYouMean(argv[1], commands) +
            ")";
  }
  if (sub != nullptr) {
    std::vector<std::string> options;
    for (const CLI::Option* o : sub->get_options()) {
      for (const std::string& l : o->get_lnames()) options.push_back("--" + l);
    }
    std::string word;
    std::istringstream words(e.what());
    while (words >> word) {
      if (word.rfind("--", 0) != 0) continue;
      text += DidYouMean(word, options);
    }
  }
  text += "\nusage: " + command;
  if (sub != nullptr) {
    for (const CLI::Option* o : sub->get_options()) {
      if (o->get_required() && !o->get_lnames().empty()) {
        text += " --" + o->get_lnames().front() + " " + o->get_type_name();
      }
    }
    text += " [options]  (`" + command + " --help` lists them)";
  } else {
    text += " <command> ...  (`attest --help` lists the commands)";
  }
  return text + "\n";
}

}  // namespace

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
    std::cerr << ParseErrorText(app, e, argc, argv);
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
