// The metamorphic relation of a learnable sink of -inf (docs/semantics.md "Learnable sink"):
// a head whose sink is -inf has no sink, so its o and lse are bitwise those of the same call
// without a sink (Kernel::Forward on the problem with Problem::sink off). Exact: the sink
// joins the row only at its end, and a -inf sink adds nothing there.
#pragma once

#include <vector>

#include "verify/checks/check.h"

namespace attest {

// Appends special-values verdicts for o and lse (lse where the kernel returns it) over the
// heads of ctx's sink case whose sink is -inf, against the kernel's own call without the sink;
// nothing when no head has a -inf sink or the kernel refuses the plain call.
void JudgeMinusInfSinkHeads(CheckContext& ctx, const ForwardResult& fwd,
                            std::vector<Verdict>& out);

}  // namespace attest
