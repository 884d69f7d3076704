// attest: numerical verification of attention kernels (tools/attest/cli_main.h runs the
// command line). Before anything runs, attest becomes a child subreaper and installs the
// signal cleanup (kernels/exec/children.h): nothing it starts outlives it, and a
// SIGINT/SIGTERM/SIGHUP ends it by that signal after its children are killed and its
// temporary files removed.
#include "kernels/exec/children.h"
#include "tools/attest/cli_main.h"

int main(int argc, char** argv) {
  attest::BecomeSubreaper();
  attest::InstallSignalCleanup();
  return attest::cli::Main(argc, argv, /*own_process=*/true);
}
