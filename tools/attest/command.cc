// The subcommand list (see command.h).
#include "tools/attest/command.h"

namespace attest::cli {

std::vector<CommandInfo>& Commands() {
  static std::vector<CommandInfo> commands;
  return commands;
}

}  // namespace attest::cli
