// The same-precision reference ("pt") of the baseline-ratio policy (issue "verify/" item 6;
// REFERENCES.md "Their pass rules" and "Measured: PyTorch 2.11 SDPA backends on an H200"):
// attention computed naively from the problem's dtype-valued inputs, rounded where PyTorch
// rounds. Two modes, because PyTorch has two "pt" paths:
//
// kSdpaMath (default): torch.nn.functional.scaled_dot_product_attention's math backend as
//   PyTorch >= 2.5 runs it by default. aten/src/ATen/native/transformers/attention.cpp
//   `_scaled_dot_product_attention_math` converts fp16/bf16 q, k, v to fp32 unless
//   `allowFP16BF16ReductionMathSDP()` (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp,
//   default False), computes in fp32 and casts the output back; autograd casts the gradients
//   back the same way. So: every intermediate fp32, o / dq / dk / dv rounded once to the
//   dtype. This is the "pt" of REFERENCES.md's H200 table, the evidence behind the profile
//   ratios (verify/tolerance.cc), so profiles use it.
// kEveryOp: flash-attention tests/test_util.py `attention_ref(..., upcast=False)` and its
//   autograd backward: every tensor op computes in fp32 and rounds its result to the dtype:
//     q' = rnd(q / sqrt(D)) (rnd(q * scale) for an explicit scale); s = rnd(q' . k);
//     softcap s = rnd(rnd(tanh(rnd(s / cap))) * cap); ALiBi s = fp32(s + bias) (the fp32
//     bias promotes the scores); p = rnd(softmax_fp32(s)); o = rnd(p . v);
//     dP = rnd(dO . v); dS = rnd(p (dP - sum_j dP p)) (softmax backward from its output:
//     p rounded, or fp32 p with ALiBi); softcap dS = rnd(rnd(rnd(dS cap)(1 - t^2)) / cap);
//     dq = rnd(rnd(dS . k) / sqrt(D)); dk_h = rnd(dS^T . q'); dv_h = rnd(p^T . dO);
//     GQA dk = rnd(sum over the group of dk_h) (repeat's backward), same for dv.
//   Its errors are several times larger (scores rounded to bf16: ~1e-2 of max|o| at S=1024,
//   D=128, against ~2e-3 for kSdpaMath), so ratios measured against one do not apply to
//   the other.
//
// Both: masked scores are -inf, empty rows give p = 0 (o = 0, dq = 0, lse = -inf) as
// attention_ref's masked_fill does; SDPA has no softcap, so kSdpaMath applies it in fp32.
// lse has no counterpart in PyTorch's math path; every kernel returns it in fp32, so its
// reference is the naive fp32 logsumexp of fp32 scores sum_d fp32(q_d / sqrt(D)) k_d (then
// softcap and ALiBi in fp32): the kSdpaMath scores, in both modes. Sums
// run sequentially in fp32 without FMA contraction (cuBLAS's order is unknown; bf16 and fp16
// products are exact in fp32, so for them only the summation order is a choice).
#pragma once

#include "reference/problem/problem.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

enum class BaselineMode : uint8_t { kSdpaMath, kEveryOp };

struct BaselineOut {
  Tensor o, lse;      // f64 tensors holding dtype values (o) and fp32 values (lse)
  Tensor dq, dk, dv;  // undefined after BaselineForward
};

// Inputs are f64 tensors of the problem's shapes holding values of its dtype (any strides).
// Dtypes with a PyTorch math path: f32, bf16, f16; others are an Error naming the dtype.
Expected<BaselineOut> BaselineForward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v, BaselineMode mode = BaselineMode::kSdpaMath);
Expected<BaselineOut> BaselineBackward(const Problem& p, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& dout,
                                       BaselineMode mode = BaselineMode::kSdpaMath);

}  // namespace attest
