// The list of built-in kernels (see builtin.h). Later layers add rows here.
#include "kernels/builtin.h"

#include "kernels/models/flash_models.h"
#include "kernels/models/lowp_models.h"
#include "kernels/mutants/mutants.h"
#include "kernels/exec/exec_kernel.h"
#include "kernels/plugin/plugin.h"

namespace attest {

void RegisterBuiltinKernels(KernelRegistry& registry) {
  RegisterFlashModels(registry);  // cpu/flash2-bf16, cpu/flash2-fp16, cpu/feather-fp16
  RegisterLowpModels(registry);   // cpu/mxfp8-{cudnn,pvbf16}, cpu/nvfp4-mixed, cpu/fp8-e4m3-tensor
  RegisterMutants(registry);      // mutant/<name>: the seeded-bug catalogue
  RegisterPluginPrefix(registry);  // plugin:<path.so>[:<name>] (kernels/plugin/)
  RegisterExecKernels(registry);   // exec:<command line> (kernels/exec/, docs/protocol.md)
}

const KernelRegistry& Kernels() {
  static const bool registered = [] {
    RegisterBuiltinKernels(KernelRegistry::Global());
    return true;
  }();
  (void)registered;
  return KernelRegistry::Global();
}

}  // namespace attest
