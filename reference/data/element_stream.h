// Internal to reference/data/: the normals of consecutive elements of one stream, drawn
// several at a time (element_stream.cc). Not part of the public API.
#pragma once

#include <cstdint>
#include <span>

namespace attest {

// out[i] = ElementStream(seed, stream, first + i).NextNormal() (generate.h), bit for bit:
// with AVX2 where the CPU has it, sixteen elements at a time by the same IEEE operations in
// the same order; else one at a time.
void NormalsOf(uint64_t seed, uint32_t stream, uint64_t first, std::span<double> out);

}  // namespace attest
