// `plugin:<path.so>[:<name>]` kernels (docs/design.md "External kernels", kernels/plugin/
// attest_kernel.h). By default every call runs in a child process that loaded the library,
// so a segfault, an abort, a device error or a hang becomes a finding (an Error answer) and
// the run goes on with a fresh child; in-process mode exists for debugging.
#pragma once

#include <memory>
#include <string_view>

#include "kernels/kernel.h"

namespace attest {

struct PluginOptions {
  // Run calls in a child process (environment: ATTEST_PLUGIN_ISOLATE=0 turns it off).
  bool isolate = true;
  // Per call (and for loading) in isolated mode; a call that takes longer is killed and
  // reported (environment: ATTEST_PLUGIN_TIMEOUT=<seconds>).
  double timeout_s = 300.0;
};

// Defaults overridden by ATTEST_PLUGIN_ISOLATE and ATTEST_PLUGIN_TIMEOUT; a malformed value
// is an Error naming the variable.
Expected<PluginOptions> PluginOptionsFromEnv();

// Loads `<path.so>[:<name>]` (the part after `plugin:`). Load errors (missing library or
// symbol, wrong ABI version, bad descriptor or capabilities) name the library and the
// symbol or field; the CLI turns them into exit code 2.
Expected<std::unique_ptr<Kernel>> LoadPluginKernel(std::string_view spec,
                                                   const PluginOptions& options);

// Registers the `plugin:` prefix (options from the environment).
void RegisterPluginPrefix(KernelRegistry& registry);

}  // namespace attest
