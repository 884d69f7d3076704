// The inputs a kernel sees for a case: q, k, v, do as float64 tensors holding exactly the
// values of the problem's dtype (docs/design.md: "data is generated in float64, rounded to the
// kernel's input dtype, and the oracle runs on exactly those rounded values"). Loaded from
// the case's safetensors file (widened exactly) or generated from its seed.
#pragma once

#include "reference/case/case_file.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

struct CaseInputs {
  Tensor q, k, v, dout;  // f64, contiguous, problem shapes, values representable in dtype
  // Problem::sink: [Hq] f64 holding float32 values (finite, or -inf for no sink in that
  // head), whatever the problem's dtype; undefined without a sink. A file stores it as an
  // F32 tensor named "sink".
  Tensor sink;
  // Problem::rel_bias: [Hq, seqlen_q + seqlen_k - 1] f64 holding finite float32 values,
  // whatever the dtype; undefined without it. A file stores it as an F32 tensor "rel_bias".
  Tensor rel_bias;
};

Expected<CaseInputs> MakeCaseInputs(const Case& c);

// The seed of the perturbations the checks draw for a case (run/run.cc), so that a saved
// case reproduces them: its generator's seed, or for a case with input files the first eight
// bytes of the SHA-256 of its canonical text (reference/golden/sha256.h ContentHash64), the
// same under every compiler and standard library (tools/portability checks it under libc++).
uint64_t CaseSeed(const Case& c);

}  // namespace attest
