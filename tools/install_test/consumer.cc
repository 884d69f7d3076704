// Links the installed attest package and exercises one symbol per library.
#include <cstdio>

#include "kernels/kernel.h"
#include "reference/problem/mask.h"
#include "reference/tensor.h"
#include "verify/exit_codes.h"

int main() {
  attest::Problem p;
  p.seqlen_q = 4;
  p.seqlen_k = 6;
  p.causal = true;
  attest::MaskView mask(p, 0);
  attest::Tensor t = attest::Tensor::Zeros(attest::DType::kF32, {2, 3});
  attest::KernelRegistry registry;
  const bool ok = mask.Visible(0, 2) && !mask.Visible(0, 3) && t.numel() == 6 &&
                  !registry.Create("cpu/none").ok() &&
                  attest::ExitCodeMeaning(attest::kExitFinding) == "a check failed";
  std::printf("consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
