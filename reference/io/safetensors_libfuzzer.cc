// libFuzzer entry point for the safetensors reader (safetensors.h), built only with
// -DATTEST_LIBFUZZER=ON and a clang compiler (see reference/io/CMakeLists.txt):
//   cmake -S . -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//         -DATTEST_LIBFUZZER=ON -DATTEST_BUILD_BENCH=OFF
//   cmake --build build/fuzz --target safetensors_libfuzzer
//   mkdir -p /tmp/st_corpus   # libFuzzer adds new inputs to the first directory only
//   build/fuzz/reference/io/safetensors_libfuzzer -max_total_time=60 /tmp/st_corpus \
//         reference/io/testdata/valid reference/io/testdata/malformed
// Any input must give a value or an Error; accepted inputs must survive a write/read round
// trip. ASan/UBSan (enabled on this target) turn memory errors into crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "reference/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attest;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto parsed = ParseSafetensors(bytes, "input");
  if (!parsed.ok()) return 0;
  auto rewritten = SerializeSafetensors(*parsed);
  if (!rewritten.ok()) std::abort();  // everything the reader accepts must be writable
  auto again = ParseSafetensors(*rewritten, "rewritten");
  if (!again.ok() || again->tensors.size() != parsed->tensors.size()) std::abort();
  for (const auto& [name, t] : parsed->tensors) {
    const Tensor* other = again->Find(name);
    if (other == nullptr || !other->BitwiseEqual(t)) std::abort();
  }
  return 0;
}
