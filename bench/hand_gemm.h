// bench/hand_gemm.cc: the oracle's panel product by the hand-written AVX-512 and AVX2
// micro-kernels that reference/oracle/oracle_gemm.cc had before Highway (bench/README.md
// "Highway"), kept as the evaluation's baseline.
#pragma once

#include <cstdint>

#include "reference/oracle/oracle_gemm.h"

namespace attest::hand_gemm {

// oracle_internal::GemmPanelsOn by the hand-written version `isa` ("avx512", "avx2",
// "portable"); false if this machine cannot run it.
bool GemmPanelsOn(const char* isa, int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs,
                  int64_t a_cs, oracle_internal::Panels b, double alpha, bool accumulate,
                  double* c, int64_t ldc);

}  // namespace attest::hand_gemm
