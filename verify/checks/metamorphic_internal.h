// Internals of the metamorphic relations (verify/checks/metamorphic.h), shared by their two
// files: metamorphic.cc (these helpers; gqa-mha, permutation, window-causal) and
// metamorphic_padding.cc (padding).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "verify/checks/check.h"
#include "verify/checks/relation_bounds.h"

namespace attest::metamorphic_detail {

// The outputs of one kernel run, or the verdicts explaining why there are none.
struct RunOutputs {
  std::optional<std::vector<Verdict>> stop;  // set: no outputs (failure verdicts or none)
  ForwardResult fwd;
  std::optional<BackwardResult> bwd;
};

// The kernel's forward (and backward) on a transformed problem; `what` names the run in the
// verdicts of one without outputs. A problem with a learnable sink goes through the sink entry
// points with `sink` (required then).
RunOutputs RunKernel(std::string_view check, Kernel& kernel, const Problem& p, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& dout, bool with_backward,
                     std::string_view what, const Tensor* sink = nullptr);

// The base run: the context's cached answers.
RunOutputs BaseRun(std::string_view check, CheckContext& ctx, bool with_backward);

// Whether `got` agrees with what the relation predicts (`expected`) within `ulps` of the row
// and the per-element allowance `extra` (see metamorphic.cc).
Verdict Agree(std::string_view check, std::string_view tensor, const Problem& p,
              const Profile* profile, const Tensor& expected, const Tensor& got, double ulps,
              const Tensor* scale = nullptr, const Tensor* extra = nullptr);

// The scale lse's ulps are counted at in a relation (see metamorphic.cc).
Tensor LseScale(const Problem& p, const Tensor& lse);

// SumOrderBound on the case's own problem, P from the run's lse (the oracle's where the kernel
// returns none).
OrderAllowance CaseOrderBound(CheckContext& ctx, const Tensor& o, const Tensor& lse);

// The longest block, in positions, of the kernel's recipe operands that are block-scaled along
// the sequence; 0 when there are none (see metamorphic.cc).
int64_t SequenceBlock(const CheckContext& ctx);

}  // namespace attest::metamorphic_detail
