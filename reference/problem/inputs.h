// The inputs a kernel sees for a case: q, k, v, do as float64 tensors holding exactly the
// values of the problem's dtype (docs/design.md: "data is generated in float64, rounded to the
// kernel's input dtype, and the oracle runs on exactly those rounded values"). Loaded from
// the case's safetensors file (widened exactly) or generated from its seed.
#pragma once

#include "reference/problem/case_file.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

struct CaseInputs {
  Tensor q, k, v, dout;  // f64, contiguous, problem shapes, values representable in dtype
};

Expected<CaseInputs> MakeCaseInputs(const Case& c);

}  // namespace attest
