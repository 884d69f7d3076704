// The attest command line as a function: the `attest` executable (main.cc) and the Python
// package (python/src/core.cc, `python -m attest` and attest.cli()) run the same parser and
// subcommands. Exit codes as verify/report/exit_codes.h: 0 pass, 1 finding, 2 usage or
// infrastructure error.
#pragma once

namespace attest::cli {

// Parses argv (argv[0] is the program name) and runs the chosen subcommand. `own_process`:
// attest owns the process (the executable): on the way out it ends by a stop signal it
// received and kills every child it started and every stray that reached it through the
// subreaper (kernels/exec/children.h). A host process (Python) owns its signals and its other
// children, so neither happens there; the kernels a run started are gone either way.
int Main(int argc, char** argv, bool own_process);

}  // namespace attest::cli
