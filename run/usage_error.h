// Bad input from the user or the environment, as every front end reports it: the CLI prints
// "attest <cmd>: <message>" and exits 2 (tools/attest/command.h), the Python package raises
// ValueError, the public C++ API returns exit_code 2 with the message (include/attest/check.h).
#pragma once

#include <stdexcept>

namespace attest {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace attest
