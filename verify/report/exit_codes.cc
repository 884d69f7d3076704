// Exit code meanings (see exit_codes.h).
#include "verify/report/exit_codes.h"

namespace attest {

std::string_view ExitCodeMeaning(int code) {
  switch (code) {
    case kExitPass:
      return "all checks hold";
    case kExitFinding:
      return "a check failed";
    case kExitUsage:
      return "usage or infrastructure error";
    default:
      return "unknown exit code";
  }
}

}  // namespace attest
