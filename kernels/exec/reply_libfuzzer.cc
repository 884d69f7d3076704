// libFuzzer entry point for the exec reply parser (reply.h), built only with
// -DATTEST_LIBFUZZER=ON and clang (usage as in reference/io/safetensors_libfuzzer.cc):
//   cmake --build build/fuzz --target reply_libfuzzer
//   mkdir -p /tmp/reply_corpus && build/fuzz/kernels/reply_libfuzzer -max_total_time=60 \
//         /tmp/reply_corpus
// Any line must give a reply or an Error, as a describe and as a call reply; accepted
// capabilities must survive their JSON round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/exec/reply.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attest;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  if (auto d = ParseDescribeReply(line); d.ok()) {
    auto again = CapabilitiesFromJson(CapabilitiesToJson(d->capabilities));
    if (!again.ok() || CapabilitiesToJson(*again) != CapabilitiesToJson(d->capabilities)) {
      std::abort();
    }
  }
  (void)ParseCallReply(line);
  return 0;
}
