// content_ids CASE.case.json...: for each case file, the values attest derives from its content
// that must not depend on the compiler or the C++ standard library (docs/design.md "Case files"):
// the perturbation seed (reference/case/inputs.h CaseSeed), the SHA-256 of the inputs a
// kernel is given (MakeCaseInputs: q, k, v, dO as float64, in that order), and the name a
// failing case is saved under (verify/report/repro.h FailureCaseFileName). One line per file; exit 2
// on a file that does not load. tools/portability/libcxx_test.sh builds it with GCC and
// libstdc++ and with clang and libc++ and compares the two outputs.
#include <cstdio>
#include <span>
#include <string>

#include <fmt/format.h>

#include "reference/case/case_file.h"
#include "reference/case/inputs.h"
#include "reference/golden/sha256.h"
#include "verify/report/repro.h"

int main(int argc, char** argv) {
  using namespace attest;
  if (argc < 2) {
    std::fprintf(stderr, "usage: content_ids CASE.case.json...\n");
    return 2;
  }
  for (int a = 1; a < argc; ++a) {
    auto c = LoadCase(argv[a]);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.error().message.c_str());
      return 2;
    }
    auto in = MakeCaseInputs(*c);
    if (!in.ok()) {
      std::fprintf(stderr, "%s: %s\n", argv[a], in.error().message.c_str());
      return 2;
    }
    Sha256 h;
    for (const Tensor* t : {&in->q, &in->k, &in->v, &in->dout}) {
      if (!t->defined()) continue;
      const auto values = t->span<const double>();
      h.Update(std::as_bytes(values));
    }
    const std::string name =
        FailureCaseFileName(CaseToText(*c), "exec:python3 worker.py --dtype bf16", "accuracy", "o");
    std::printf("%s seed=%016llx inputs=%s name=%s\n", argv[a],
                static_cast<unsigned long long>(CaseSeed(*c)), DigestHex(h.Final()).c_str(),
                name.c_str());
  }
  return 0;
}
