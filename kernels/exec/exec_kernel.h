// External-process kernels (`exec:<command line>`) and process isolation for in-process
// kernels, both speaking the exec protocol of docs/design.md "External kernels" (docs/protocol.md
// is the kernel author's guide): JSON lines on the worker's stdin/stdout, tensors in
// safetensors files in a private temporary directory. A worker that crashes, hangs, writes
// garbage or answers with missing or misshapen outputs becomes an Error answer (a finding)
// naming what happened; the next call restarts it; the harness never dies with it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kernels/kernel.h"
#include "reference/status.h"

namespace attest {

struct ExecOptions {
  // Wall-clock limit for one request (describe, forward or backward), restart included. A
  // worker that has not answered by then is killed with its whole process group.
  double timeout_s = 300;
  // Where the private temporary directory (mkdtemp, mode 0700) is made; "" means $TMPDIR,
  // else /tmp. The directory and everything in it are removed when the kernel is destroyed.
  std::string tmp_root;
  // How many of the worker's last stderr lines an Error quotes.
  int stderr_tail_lines = 12;
  // Name the kernel reports; "" means the worker's `describe` name (exec:) or the factory's
  // kernel's name (forked).
  std::string name;
};

// Spawns `command_line` (split into words like a shell's simple command, without expansions;
// leading NAME=VALUE words set the environment: process.h SplitCommandLine) in its own
// process group, stdin/stdout as the protocol pipes and stderr captured, asks it to
// `describe` itself and returns a Kernel named "exec:<command_line>" whose capabilities are
// the reply's. Each call's inputs are written in the problem's dtype. Fails (an Error naming the command and the stderr tail) when
// the worker cannot be started or does not answer `describe` correctly.
Expected<std::unique_ptr<Kernel>> MakeExecKernel(std::string command_line, ExecOptions options = {});

// Isolation for in-process kernels (plugins): forks a child that calls `factory` and serves
// the protocol on pipes (ServeProtocol); the parent's client is the same as exec:'s. The
// child runs only the factory, the kernel and the protocol loop (no OpenBLAS, no threads of
// the parent), and ends with _exit. The child is forked again after a crash.
using KernelFactory = std::function<Expected<std::unique_ptr<Kernel>>()>;
Expected<std::unique_ptr<Kernel>> MakeForkedKernel(KernelFactory factory, ExecOptions options = {});

// The worker side of the protocol for a C++ kernel: reads requests from `in_fd` until EOF,
// writes one reply line per request to `out_fd`. Returns the process exit code to use: 0 at
// EOF, 2 when a reply could not be written (the client is gone).
int ServeProtocol(Kernel& kernel, int in_fd, int out_fd);

// Registers the `exec:` prefix: `exec:python3 tools/workers/numpy_worker.py`.
void RegisterExecKernels(KernelRegistry& registry);

}  // namespace attest
