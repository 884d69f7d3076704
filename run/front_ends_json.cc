// The public C++ API's side of run/front_ends_test.sh: RunChecks (include/attest/check.h) on
// one kernel, suite and seed, its JSON report written to a file, exit code RunChecks' own.
// Usage: front_ends_json KERNEL SUITE SEED FAILURE_DIR OUT.json
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "attest/check.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: front_ends_json KERNEL SUITE SEED FAILURE_DIR OUT.json\n";
    return 2;
  }
  attest::CheckOptions options;
  options.suite = argv[2];
  options.seed = std::strtoull(argv[3], nullptr, 10);
  options.failure_dir = argv[4];
  const attest::CheckResult result = attest::RunChecks(argv[1], options);
  if (result.exit_code == 2) {
    std::cerr << result.Summary();
    return 2;
  }
  std::ofstream out(argv[5], std::ios::binary);
  out << result.json;
  if (!out) {
    std::cerr << "front_ends_json: cannot write " << argv[5] << "\n";
    return 2;
  }
  return result.exit_code;
}
