// The "layouts" check (docs/checks.md): q, k, v and dO passed as the views users make, not as
// fresh contiguous tensors, must give the same outputs as the contiguous call.
//
// A model does not hand attention contiguous tensors: q, k and v are slices of one fused
// projection (`qkv.view(B, S, 3, H, D).unbind(2)`), or a transpose of [B, H, S, D] storage, or a
// head slice of a larger tensor. A kernel that reads its inputs as if they were contiguous
// ("strides ignored": flash-attention issue 2665) passes every check that hands it fresh
// tensors. The layouts a kernel can be handed are what its interface takes
// (Capabilities::strides): "any" (every layout below), "inner" (the last dimension
// contiguous: FlashAttention's and the fused SDPA backends' requirement), "contiguous" (the
// check does not apply: a C ABI plugin receives packed buffers).
#pragma once

#include <vector>

#include "verify/checks/check.h"

namespace attest {

// The layouts, applied to q, k, v, dO and the o the backward reads:
//   fused projection  q, k, v as slices of one [.., S, Hq·D + Hkv·D + Hkv·Dv] buffer (k, v of
//                     a [.., Sk, Hkv·(D + Dv)] buffer when Sq != Sk); dO and o with a head gap;
//   heads-major       a transpose of [B, H, S, X] storage ([H, T, X] when packed);
//   head gap          heads 1..H of an [.., H + 1, X] buffer whose head 0 holds NaN;
//   every other       a stride of 2 in the last dimension ("any" only), NaN between.
// Results must be bitwise equal to the contiguous call's where the kernel claims determinism,
// else within twice the spread of two contiguous calls; a refusal (Unsupported) is honest.
std::vector<Verdict> RunLayouts(CheckContext& ctx);

}  // namespace attest
