// What attest was built from, for `attest --version` and the reports (JSON "attest", JUnit
// properties): the project version of CMakeLists.txt and the git commit the build tree was
// configured from (run/CMakeLists.txt re-configures when HEAD moves).
#pragma once

#include <string_view>

namespace attest {

std::string_view AttestVersion();  // "0.1.0"
std::string_view AttestCommit();   // 40 hex digits, or "" outside a git checkout

}  // namespace attest
