// Registers every built-in kernel (cpu/ models, mutant/ seeded bugs) and the external
// prefixes (plugin:, exec:) with a registry. Explicit rather than static self-registration,
// so that linking the static library never silently drops a kernel.
#pragma once

#include "kernels/kernel.h"

namespace attest {

void RegisterBuiltinKernels(KernelRegistry& registry);

// The global registry with every built-in registered (built once).
const KernelRegistry& Kernels();

}  // namespace attest
