// The behavioural checks of docs/design.md "Checks", last bullet (docs/checks.md):
// determinism, unwritten outputs, special values and honesty. Each names its bug class in
// its verdicts, so that a failure says what kind of bug it is, not only that a number is off.
#pragma once

#include <vector>

#include "verify/checks/check.h"

namespace attest {

// "determinism": the forward run twice more and the backward (on the first forward's o and
// lse) twice more must be bitwise equal to the first run where the kernel claims
// `deterministic`; a kernel that does not claim it passes, with a note that it varies.
std::vector<Verdict> RunDeterminism(CheckContext& ctx);

// "unwritten-outputs": every output exists with the problem's shape and a float dtype, and
// holds no NaN where the oracle is finite (the plugin harness poisons buffers with NaN, so a
// NaN there is an element the kernel never wrote, or one it computed as NaN).
std::vector<Verdict> RunUnwrittenOutputs(CheckContext& ctx);

// "special-values": no NaN/Inf where the oracle is finite (huge logits, format-edge inputs),
// and the exact semantics of docs/design.md "Empty rows": a row with no visible key has o = 0,
// lse = -inf and dq = 0; a key no query sees has dk = dv = 0 (zero-length sequences
// included). Empty-row verdicts are only emitted for cases that have such rows.
std::vector<Verdict> RunSpecialValues(CheckContext& ctx);

// "honesty": a case inside the kernel's capabilities must be answered (not Unsupported) and
// right; a case outside them may be refused, but if answered it must be right too.
std::vector<Verdict> RunHonesty(CheckContext& ctx);

}  // namespace attest
