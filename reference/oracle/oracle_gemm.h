// The float64 oracle's own matrix product (oracle_double.cc; docs/design.md "Oracle"), for the
// tiles' six products: C = alpha A B or C += A B, with B stored once per head as column
// panels and A read where it lies (any row and column stride), so that nothing is packed per
// tile. OpenBLAS's dgemm packs both operands on every call; for the attention tiles the
// packed operand is mostly P or dS, new in every tile and 2 D flops per element, so the
// packing cost ~13 % of the oracle's time with a cblas interface that cannot take pre-packed
// operands (OpenBLAS 0.3.21 has no dgemm_pack; docs/bench-oracle.md has the profile).
//
// Method (GotoBLAS / BLIS, Goto and van de Geijn, ACM TOMS 34(3), 2008): the k range is cut
// into blocks of kGemmKc; for each block and each B panel (kPanelWidth columns, kGemmKc rows:
// 32 KiB, stays in L1) a register-blocked micro-kernel sweeps the rows of A, keeping an
// MR x kPanelWidth block of C in vector registers: per k, the panel row is loaded once and
// each of the MR entries of A is broadcast and multiplied into it by FMA.
//
// Results (bitwise the same on every ISA and thread count, with any blocking of the caller):
// for each element, each k block's partial t_b is the FMA chain t = fma(a_ik, b_kj, t) over
// the block's k in ascending order, from t = 0; then C = alpha (((t_0 + t_1) + t_2) ...)
// (overwrite) or C = ((C + t_0) + t_1) ... (accumulate). The AVX-512 and AVX2 versions
// vectorise across j only, so every element sees exactly this sequence of roundings; the
// portable version writes it out with std::fma. A dot product of length k so computed errs
// by at most gamma_k times the sum of the absolute products (Higham §3.1), the bound
// ErrorBound assumes of any summation order.
#pragma once

#include <cstdint>

namespace attest::oracle_internal {

// Width of a B panel (four AVX-512 vectors of doubles).
constexpr int64_t kPanelWidth = 32;
// k block of the micro-kernel: a 32 x 128 panel block is 32 KiB (L1 is 32-48 KiB).
constexpr int64_t kGemmKc = 128;

// Number of panels for `cols` columns.
constexpr int64_t PanelCount(int64_t cols) { return (cols + kPanelWidth - 1) / kPanelWidth; }

// A matrix stored as column panels: element (r, c) at
// data[(c / kPanelWidth) * panel_stride + r * kPanelWidth + c % kPanelWidth], columns past
// the matrix's last one zero. `Rows(r0)` views the panels from row r0 on.
struct Panels {
  const double* data = nullptr;
  int64_t panel_stride = 0;  // >= rows * kPanelWidth
  Panels Rows(int64_t r0) const { return {data + r0 * kPanelWidth, panel_stride}; }
};

// Packs src (rows x cols; element (r, c) at src[r * rs + c * cs]) into dst as panels of
// stride rows * kPanelWidth (dst holds PanelCount(cols) * rows * kPanelWidth doubles).
void PackPanels(const double* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, double* dst);

// C (m x n, row stride ldc) = alpha A B, or C += A B when `accumulate` (alpha must be 1):
// A (m x k) element (i, l) at a[i * a_rs + l * a_cs]; B (k x n) the first k rows of `b`.
// The rounding sequence is the one in the file comment.
void GemmPanels(int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs, int64_t a_cs,
                Panels b, double alpha, bool accumulate, double* c, int64_t ldc);

// Which version GemmPanels runs on this machine: "avx512", "avx2", on aarch64 "neon", "sve",
// "sve2", "sve_256" or "sve2_128" (Highway's targets, oracle_gemm.cc), or "portable": the widest
// one the CPU runs, or the one the environment variable ATTEST_ORACLE_ISA names if the CPU
// runs it (read once; for tests, and to show on one machine what another computes: every
// version gives the same bits).
const char* GemmPanelsIsa();

// GemmPanels by the named version (a name above; for tests, which check that
// every version gives the portable one's bits); false if this machine cannot run it.
bool GemmPanelsOn(const char* isa, int64_t m, int64_t n, int64_t k, const double* a, int64_t a_rs,
                  int64_t a_cs, Panels b, double alpha, bool accumulate, double* c, int64_t ldc);

}  // namespace attest::oracle_internal
