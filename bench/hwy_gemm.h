// The oracle's panel product (reference/oracle/oracle_gemm.h) with its micro-kernel written
// once with Highway (github.com/google/highway, hwy/highway.h) and compiled for every target
// Highway attains (SSE4, AVX2, AVX-512 on x86; NEON, SVE, SVE2 on aarch64), picked at run time
// by HWY_DYNAMIC_DISPATCH. The evaluation of bench/hwy_gemm_bench.cc (bench/README.md
// "Highway") runs it beside the hand-written AVX2/AVX-512 kernels of
// reference/oracle/oracle_gemm.cc: same blocking, same driver, the same FMA per k step in the
// same order, so the bits must be the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/oracle/oracle_gemm.h"

namespace attest::hwy_gemm {

// oracle_internal::GemmPanels's contract and rounding sequence, on the best target this CPU
// runs.
void GemmPanels(int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs, int64_t a_cs,
                oracle_internal::Panels b, double alpha, bool accumulate, double* c, int64_t ldc);

// While alive, GemmPanels runs on `target` (an HWY_* bit) alone (google/highway
// hwy/targets.h SetSupportedTargetsForTest); ok() is false, and dispatch unchanged, where it
// was not compiled or this CPU lacks it. Set once around a timing loop: Highway reads CPUID
// when the set of targets changes, which costs microseconds in a virtual machine.
class OnlyTarget {
 public:
  explicit OnlyTarget(int64_t target);
  ~OnlyTarget();
  OnlyTarget(const OnlyTarget&) = delete;
  OnlyTarget& operator=(const OnlyTarget&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

// The targets compiled into this program that this CPU runs, best first, and their names.
std::vector<int64_t> Targets();
std::string TargetName(int64_t target);
// The target GemmPanels dispatches to, and the micro-kernel's shape there ("6x32 (4 vectors of
// 8)"): rows, columns per pass, vectors per row.
std::string ChosenTarget();
std::string KernelShape(int64_t target);

}  // namespace attest::hwy_gemm
