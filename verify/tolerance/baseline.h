// The same-precision reference ("pt") of the baseline-ratio policy (docs/tolerances.md;
// docs/references.md "Their pass rules" and "Measured: PyTorch 2.11 SDPA backends on an H200"):
// attention computed naively from the problem's dtype-valued inputs, rounded where PyTorch
// rounds. Two modes, because PyTorch has two "pt" paths:
//
// kSdpaMath (default): torch.nn.functional.scaled_dot_product_attention's math backend as
//   PyTorch >= 2.5 runs it by default. aten/src/ATen/native/transformers/attention.cpp
//   `_scaled_dot_product_attention_math` converts fp16/bf16 q, k, v to fp32 unless
//   `allowFP16BF16ReductionMathSDP()` (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp,
//   default False), computes in fp32 and casts the output back; autograd casts the gradients
//   back the same way. So: every intermediate fp32, o / dq / dk / dv rounded once to the
//   dtype. This is the "pt" of docs/references.md's H200 table, the evidence behind the profile
//   ratios (verify/tolerance/tolerance.cc), so profiles use it.
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
// attention_ref's masked_fill does. A learnable sink (Problem::sink; docs/semantics.md) is one
// more fp32 logit per row with no value, built as gpt-oss's reference builds it (openai/gpt-oss
// gpt_oss/torch/model.py `sdpa`: the sink concatenated as the last column of the scores,
// softmax, the column dropped): it joins the row's max and, last, its sum of exp
// (lse too); an empty row then has o = 0, lse = sink; autograd gives the sink column
// dS = p_sink (0 - sum_j dP_j p_j), so dsink_h = -sum over (batch, row) of p_sink rowdot,
// summed sequentially in fp32 (batch, then row) and left in fp32 (the sink is an fp32 tensor).
// A sink of -inf adds nothing (bitwise the no-sink answer, dsink 0). A learnable relative bias
// (Problem::rel_bias; docs/semantics.md) is an fp32 tensor gathered at the sequence-local
// relative position and added last (after softcap and ALiBi), as a FlexAttention-style
// reference `scores + rel_bias[:, i - j + Sk - 1]` does: it promotes the scores to fp32 as
// ALiBi's fp32 bias does (the softmax's output is fp32, rounded to the dtype for P·V);
// drel_bias[h, d] is the sum of the fp32 dS (before the softcap's derivative) over the pairs of
// diagonal d, summed sequentially in fp32 (batch, row, key) as the gather's backward
// accumulates. A zero table adds nothing (x + 0 = x): the scores' values are those of the
// promoted no-bias path. SDPA has no softcap, so kSdpaMath applies it in fp32.
// lse has no counterpart in PyTorch's math path; every kernel returns it in fp32, so its
// reference is the naive fp32 logsumexp of fp32 scores sum_d fp32(q_d / sqrt(D)) k_d (then
// softcap and ALiBi in fp32): the kSdpaMath scores, in both modes. Sums
// run sequentially in fp32 without FMA contraction (cuBLAS's order is unknown; bf16 and fp16
// products are exact in fp32, so for them only the summation order is a choice).
#pragma once

#include <cstdint>
#include <vector>

#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"
#include "reference/status.h"
#include "reference/tensor.h"
#include "verify/tolerance/tolerance.h"

namespace attest {

enum class BaselineMode : uint8_t { kSdpaMath, kEveryOp };

struct BaselineOut {
  Tensor o, lse;      // f64 tensors holding dtype values (o) and fp32 values (lse)
  Tensor dq, dk, dv;  // undefined after BaselineForward
  Tensor dsink;       // [Hq] f64 holding fp32 values: backward of a problem with a sink only
  Tensor drel_bias;   // [Hq, W] f64 holding fp32 values: backward with a relative bias only
};

// Inputs are f64 tensors of the problem's shapes holding values of its dtype (any strides).
// Dtypes with a PyTorch math path: f32, bf16, f16; others are an Error naming the dtype.
// threads (0: all cores): the result is bitwise the same for every count (each element's
// operations keep the order above; the work is split by query rows and by keys).
// Whether `sink` fits p: given (defined, [Hq]) exactly when p.sink; the Error names the field.
Status ValidateBaselineSink(const Problem& p, const Tensor* sink);
// Whether `rel_bias` fits p: given ([Hq, W]) exactly when p.rel_bias; the Error names the field.
Status ValidateBaselineRelBias(const Problem& p, const Tensor* rel_bias);

// sink: the case's [Hq] sink (reference/case/inputs.h CaseInputs::sink), required exactly
// when p.sink (an Error names problem.sink otherwise); rel_bias likewise (CaseInputs::rel_bias).
Expected<BaselineOut> BaselineForward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v, BaselineMode mode = BaselineMode::kSdpaMath,
                                      int threads = 1, const Tensor* sink = nullptr,
                                      const Tensor* rel_bias = nullptr);
Expected<BaselineOut> BaselineBackward(const Problem& p, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& dout,
                                       BaselineMode mode = BaselineMode::kSdpaMath,
                                       int threads = 1, const Tensor* sink = nullptr,
                                       const Tensor* rel_bias = nullptr);

// ---- The recipe reference: the "pt" of a low-precision recipe ----
//
// A low-precision kernel has no PyTorch math path in its precision; the reference of the same
// recipe plays that role (cudnn-frontend judges cuDNN's MXFP8 SDPA against
// test/python/sdpa/mxfp8_ref.py: the operands quantised as the kernel quantises them, the
// attention computed in high precision, P and dS rounded where the recipe rounds them). Here:
//   operands   every GEMM operand quantised over the whole tensor exactly as the recipe row
//              says (QuantizeForRecipe: Q·Kᵀ's Q and K, P·V's V, dO·Vᵀ's dO and V, Pᵀ·dO's dO,
//              dS·K's K, dSᵀ·Q's Q), bit for bit what the engine feeds its GEMMs;
//   forward    scores, softmax and every sum in float64 (no tiling); P = exp(s - m) with m the
//              row's final max (P <= 1, as an untiled reference forms it) rounded by the
//              recipe's pv.a; o = Σ_j round(P_j) v_j / Σ_j P_j (the row sum of the unrounded
//              P, FlashAttention-2's order); o rounded to the recipe's output format, lse to
//              fp32;
//   backward   P = exp(s - lse) rounded by pdo.a for dV = Σ_i P_ij dO_i; dP = dO·Vᵀ from the
//              dO·Vᵀ operands (rounded to the recipe's dp format where it names one);
//              D = rowsum(dO∘O) from this reference's own rounded o (kRoundedO) or its
//              unrounded o (kFp32O), and the dO as given (DeltaDo::kInput) or as dO·Vᵀ's
//              operand (kDovOperand); dS = P (dP - D) times the softcap derivative, rounded by
//              dsk.a for dQ = scale Σ_j dS_ij k_j and by dsq.a for dK = scale Σ_i dS_ij q_i
//              (block schemes of dS run over the [Sq, Sk] matrix of one (batch, head), along
//              keys or queries as the operand's axis says); GQA gradients summed over the
//              group in float64; dq, dk, dv rounded once to the recipe's gradient format.
// A learnable sink is a logit with no value: it joins the row's max m and sum of exp (never
// rounded: it is not an operand of P·V), so lse includes it and an empty row has o = 0,
// lse = sink; dsink_h = -Σ_i exp(sink_h - lse_i) D_i with this reference's D, in float64,
// rounded once to fp32. A relative bias is added to the float64 score after the transform;
// drel_bias sums P (dP - D) (before the softcap's derivative) per diagonal in float64, rounded
// once to fp32.
// What separates a correct kernel from this reference is its fp32 accumulation, its tile
// order and where its running max puts P's rounding grid: the baseline-ratio policy bounds
// that by k times the reference's own error (verify/tolerance/tolerance.cc; docs/tolerances.md).
// Errors name the recipe and operand.

// `t` (f64, token-major [B, S, H, X] or packed [T, H, X]) as `quant` represents it before a
// product: kSequence blocks run along the token axis, kHeadDim along the last axis.
Expected<Tensor> QuantizeForRecipe(const Tensor& t, const OperandQuant& quant);

Expected<BaselineOut> RecipeReferenceForward(const Problem& p, const Recipe& recipe,
                                             const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor* sink = nullptr,
                                             const Tensor* rel_bias = nullptr);
Expected<BaselineOut> RecipeReferenceBackward(const Problem& p, const Recipe& recipe,
                                              const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& dout, const Tensor* sink = nullptr,
                                              const Tensor* rel_bias = nullptr);

// The baseline of `profile`'s baseline-ratio policies on (q, k, v[, dout]): the recipe
// reference of profile.baseline_recipe when it names one, else the kSdpaMath "pt". dout
// nullptr: forward only. query_rows ([total_q] flags, verify/metrics/sample.h; forward of the kSdpaMath
// path only): only the flagged rows are computed, one at a time, each bitwise as in the whole
// run; the others are o = 0, lse = -inf. The Error names the profile. threads (0: all
// cores) splits the same-precision path's work (bitwise the same result for every count); the
// recipe reference runs on the calling thread.
Expected<BaselineOut> ProfileBaseline(const Profile& profile, const Problem& p, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor* dout,
                                      const std::vector<uint8_t>* query_rows = nullptr,
                                      int threads = 1, const Tensor* sink = nullptr,
                                      const Tensor* rel_bias = nullptr);

}  // namespace attest
