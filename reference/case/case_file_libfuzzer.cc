// libFuzzer entry point for the case-file parser (case_file.h ParseCaseText), built only with
// -DATTEST_LIBFUZZER=ON and clang (usage as in reference/io/safetensors_libfuzzer.cc):
//   cmake --build build/fuzz --target case_file_libfuzzer
//   mkdir -p /tmp/case_corpus && build/fuzz/reference/case/case_file_libfuzzer \
//         -max_total_time=60 /tmp/case_corpus golden/cases
// Any input must give a case or an Error; an accepted case must survive CaseToText. ASan and
// UBSan (on in that build) turn memory errors and undefined behaviour into crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "reference/case/case_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attest;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = ParseCaseText(text, "input");
  if (!c.ok()) return 0;
  auto again = ParseCaseText(CaseToText(*c), "rewritten");
  if (!again.ok() || !(*again == *c)) std::abort();
  return 0;
}
