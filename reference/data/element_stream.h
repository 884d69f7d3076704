// Internal to reference/data/: the normals of consecutive elements of one stream, drawn
// several at a time (element_stream.cc). Not part of the public API.
#pragma once

#include <cstdint>
#include <span>

namespace attest {

// out[i] = ElementStream(seed, stream, first + i).NextNormal() (generate.h), bit for bit:
// with AVX-512F or else AVX2 where the CPU has it, 24 or 16 elements at a time by the same
// IEEE operations in the same order; else one at a time.
void NormalsOf(uint64_t seed, uint32_t stream, uint64_t first, std::span<double> out);

// For tests only (generate_test.cc): NormalsOf on one chosen instruction set, so that each
// path is compared with the scalar stream whatever the dispatch would pick on this CPU.
namespace internal {

enum class NormalsIsa { kScalar, kAvx2, kAvx512 };

// Whether this build and CPU can run `isa` (kScalar always can).
bool HaveNormalsIsa(NormalsIsa isa);

// NormalsOf on `isa`, which must be available (HaveNormalsIsa).
void NormalsOfIsa(NormalsIsa isa, uint64_t seed, uint32_t stream, uint64_t first,
                  std::span<double> out);

}  // namespace internal

}  // namespace attest
