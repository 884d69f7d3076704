// Loading C ABI plugins and calling them in this process (kernels/plugin/attest_kernel.h;
// docs/design.md "External kernels"). The loader checks the ABI version, the three symbols, each
// descriptor's version and struct size and its capabilities JSON, and every error names the
// library and the symbol or field. A call encodes attest's tensors into the problem's dtype,
// places them on the descriptor's device, NaN-fills the outputs, runs the kernel and brings
// the outputs back as raw codes, which attest's checks widen exactly.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/plugin/attest_kernel.h"

namespace attest {

// `<path.so>[:<name>]`: the whole string when it names an existing file, else split at the
// last ':'.
struct PluginSpec {
  std::string path;
  std::string name;  // empty: the library's only kernel
};
PluginSpec ParsePluginSpec(std::string_view spec);

// The C enum value of a DType, or -1 when the ABI has none for it.
int32_t AbiDType(DType dtype);

// One validated descriptor.
struct PluginEntry {
  const attest_kernel_desc* desc = nullptr;
  std::string library;  // path, for messages
  std::string name;
  std::string capabilities_json;
  Capabilities capabilities;
  int32_t device_type = ATTEST_DEVICE_HOST;
};

class PluginLibrary {
 public:
  // dlopen + every ABI check; errors name `path` and the symbol or field.
  static Expected<std::shared_ptr<PluginLibrary>> Open(const std::string& path);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<PluginEntry>& entries() const { return entries_; }
  // The kernel called `name` (or the only one when `name` is empty).
  Expected<PluginEntry> Find(std::string_view name) const;

 private:
  PluginLibrary() = default;
  void* handle_ = nullptr;
  std::string path_;
  std::vector<PluginEntry> entries_;
};

// Outputs as the kernel wrote them: o/dq/dk/dv in the problem's dtype, lse in f32 (codes;
// the checks widen them exactly and judge ULPs in these dtypes).
// Errors are findings (kernel error, protocol violation, device error naming the call).
KernelAnswer<ForwardResult> CallPluginForward(const PluginEntry& entry, const Problem& p,
                                              const Tensor& q, const Tensor& k, const Tensor& v);
KernelAnswer<BackwardResult> CallPluginBackward(const PluginEntry& entry, const Problem& p,
                                                const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& o,
                                                const Tensor& lse, const Tensor& dout);

}  // namespace attest
