// Metamorphic relations (docs/design.md "Checks", last bullet; docs/checks.md): the
// kernel against itself on a transformed problem, no oracle involved, so even errors far
// below the accuracy tolerance show (a kernel that leaks 1e-6 of a neighbouring head passes
// accuracy and fails permutation).
//   gqa-mha:       kernel on (Hq, Hkv) = kernel on (Hq, Hq) with k/v repeated per group
//                  (dk, dv: the group sum of the MHA gradients; when the kernel declares
//                  another dP rounding point for one of the two, dq and dk also get the
//                  bound of what that rounding moves);
//   permutation:   permuting batch entries (padded, or the sequences of a packed batch) and
//                  heads of the inputs permutes the outputs, within 2 ulps of the row (a
//                  GQA group's dk/dv sum and a kernel's split points change order);
//   padding:       padding tokens leave the real tokens' outputs unchanged: a padding
//                  sequence in front of and behind a packed batch (bitwise when
//                  deterministic), or padding queries and keys appended to every entry of a
//                  padded batch and hidden by document ids (within a few ulps: Sq and Sk
//                  change, and with them a kernel's tiling). For a recipe block-scaled along
//                  the sequence (cpu/mxfp8-cudnn) the relations keep the block grid: one block
//                  of packed padding in front and none behind, padded padding copied from the
//                  last block's own rows, packed permutation of heads only;
//   window-causal: window (L, 0) without causal = causal on the same diagonal, L reaching
//                  key 0 from every query's diagonal: Sk bottom-right, Sq top-left; and a
//                  window whose bounds reach past every key = no window.
// What two runs may differ by beyond their ulps (reordered fp32 sums, another dP rounding
// point, roundings that move with the tiling) is verify/checks/relation_bounds.h.
#pragma once

#include <cstdint>
#include <vector>

#include "verify/checks/check.h"

namespace attest {

std::vector<Verdict> RunGqaEquivalence(CheckContext& ctx);
std::vector<Verdict> RunPermutation(CheckContext& ctx);
std::vector<Verdict> RunWindowCausal(CheckContext& ctx);
std::vector<Verdict> RunPadding(CheckContext& ctx);

// result[..., k, ...] = t[..., src[k], ...] along `axis`, which gets src.size() entries (any
// dtype; contiguous copy).
Tensor Gather(const Tensor& t, int64_t axis, const std::vector<int64_t>& src);

}  // namespace attest
