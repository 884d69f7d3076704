// The memory budget: how many bytes one attest process may set aside for a problem or a file,
// checked from the problem's sizes before anything is allocated, so that a case with batch
// 10^6 or a kernel claiming head dim 10^6 is refused at once with the fields that make it
// large (exit 2) instead of running for a minute into std::bad_alloc. The budget is fixed
// (not a fraction of this machine's memory), so that the same case is accepted or refused
// the same way everywhere; ATTEST_MEMORY_BUDGET overrides it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "reference/problem/problem.h"
#include "reference/status.h"

namespace attest {

inline constexpr uint64_t kDefaultMemoryBudgetBytes = uint64_t{8} << 30;

// Bytes from ATTEST_MEMORY_BUDGET ("8G", "512M", "1073741824"; suffixes K M G T are powers of
// 1024), else kDefaultMemoryBudgetBytes. A malformed value is an Error naming the variable.
Expected<uint64_t> MemoryBudgetBytes();
// Parses a byte count as ATTEST_MEMORY_BUDGET spells it.
Expected<uint64_t> ParseByteCount(std::string_view text);
// "8 GiB", "512 MiB", "17 bytes".
std::string ByteCountText(uint64_t bytes);

// What a check run on `p` holds at once, estimated from the sizes alone: q, k, v, do, o, lse,
// dq, dk, dv in float64, kWorkingCopies times (inputs, the oracle's outputs, a kernel's
// answers, a perturbed or related copy). Saturates at UINT64_MAX.
inline constexpr uint64_t kWorkingCopies = 4;
uint64_t EstimatedProblemBytes(const Problem& p);

// Refuses a problem whose estimate exceeds the budget: "problem needs about 30 GiB (batch
// 1000000, seqlen_q 1, ... head_dim 64) over the 8 GiB memory budget (ATTEST_MEMORY_BUDGET
// raises it)". `p` must have passed Validate.
Status CheckProblemBudget(const Problem& p);

}  // namespace attest
