// The exact relation of a zero relative-bias table (docs/semantics.md "Learnable relative
// bias": x + 0 = x, so a zero table gives bitwise the answer of no bias): part of
// special-values (basic.h RunSpecialValues).
#pragma once

#include <vector>

#include "verify/checks/check.h"

namespace attest {

// On ctx's relative-bias case: the kernel's o and lse (lse where it returns them) with an
// all-zero table (Kernel::ForwardRelBias, the case's sink if any) are bitwise those of its own
// call without the bias (Problem::rel_bias off: Kernel::ForwardSink with a sink, else
// Kernel::Forward). Nothing when either call is refused.
void JudgeZeroRelBias(CheckContext& ctx, std::vector<Verdict>& out);

}  // namespace attest
