// RDNA3 wave32 WMMA, 16x16x16 f16 -> f32 (v_wmma_f32_16x16x16_f16; clang builtin
// __builtin_amdgcn_wmma_f32_16x16x16_f16_w32): the per-lane fragment layout, written once
// and compiled both for the GPU (clang++-19 -x hip, gfx1100 / gfx1151) and for the host (g++),
// where hip_wmma_emulate.h runs the same index math against a CPU model of the instruction.
//
// Layout (AMD, "RDNA 3 Instruction Set Architecture", section 7.9 "Wave Matrix Multiply
// Accumulate"; GPUOpen, "How to accelerate AI applications on RDNA 3 using WMMA", 2023):
//   D = A x B + C, A 16x16 (m, k), B 16x16 (k, n), C and D 16x16 (m, n), one wave of 32 lanes.
//   A: lane l holds row m = l % 16, its element e is k = e (16 halves per lane).
//   B: lane l holds column n = l % 16, its element e is k = e.
//   C, D: lane l holds column n = l % 16, its element r (of 8 floats) is row m = 2r + l / 16.
//   Lanes l and l + 16 must hold identical A and B fragments (RDNA3 replicates the inputs
//   across the two half-waves); the emulator refuses fragments that are not replicated.
#pragma once

#if defined(__HIP__)
// clang HIP (host or device pass): these functions exist on both sides.
#define ATTEST_HD __attribute__((host, device))
// Fully unrolled loops keep fragment arrays in registers (indexed by constants), not scratch.
#define ATTEST_UNROLL _Pragma("unroll")
#else
#define ATTEST_HD
#define ATTEST_UNROLL
#endif

namespace attest::wmma {

inline constexpr int kTile = 16;  // M = N = K = 16
inline constexpr int kWave = 32;  // wave32
inline constexpr int kAccPerLane = 8;

#if defined(__HIP__)
typedef _Float16 Half16 __attribute__((ext_vector_type(16)));
typedef float Float8 __attribute__((ext_vector_type(8)));
#else
// Host stand-ins with the same element access (g++ has no ext_vector_type).
struct Half16 {
  _Float16 e[16];
  _Float16& operator[](int i) { return e[i]; }
  const _Float16& operator[](int i) const { return e[i]; }
};
struct Float8 {
  float e[8];
  float& operator[](int i) { return e[i]; }
  const float& operator[](int i) const { return e[i]; }
};
#endif

// A operand: the row this lane supplies; element e of the fragment is column k = e.
ATTEST_HD constexpr int ARow(int lane) { return lane % kTile; }
// B operand: the column this lane supplies; element e of the fragment is row k = e.
ATTEST_HD constexpr int BCol(int lane) { return lane % kTile; }
// C / D: element r of lane l is (row CRow(l, r), column CCol(l)).
ATTEST_HD constexpr int CRow(int lane, int r) { return 2 * r + lane / kTile; }
ATTEST_HD constexpr int CCol(int lane) { return lane % kTile; }

}  // namespace attest::wmma
