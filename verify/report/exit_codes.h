// Process exit codes, fixed up front (docs/design.md "CLI contract"): 0 every check holds,
// 1 a check failed (or a fuzz run found a failure), 2 usage or infrastructure error.
#pragma once

#include <string_view>

namespace attest {

enum ExitCode : int {
  kExitPass = 0,
  kExitFinding = 1,
  kExitUsage = 2,
};

std::string_view ExitCodeMeaning(int code);

}  // namespace attest
