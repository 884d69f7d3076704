// The list of built-in kernels (see builtin.h). Later layers add rows here.
#include "kernels/builtin.h"

namespace attest {

void RegisterBuiltinKernels(KernelRegistry& registry) { (void)registry; }

const KernelRegistry& Kernels() {
  static const bool registered = [] {
    RegisterBuiltinKernels(KernelRegistry::Global());
    return true;
  }();
  (void)registered;
  return KernelRegistry::Global();
}

}  // namespace attest
