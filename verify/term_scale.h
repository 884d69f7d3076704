// The magnitude of the terms that make up each gradient row (issue 8, "false alarm on real
// kernels"; DESIGN.md "Checks"): a floor of "n ULPs" must scale with what a kernel actually
// adds up, not with the possibly cancelled result. dq_i = scale * sum_j dS_ij k_j with
// dS_ij = P_ij (dP_ij - D_i) [* (1 - tanh^2) under softcap]: when the exact dS vanishes (a
// single visible key: P = 1, dP = D) the reference row is exactly 0, yet a correct kernel that
// forms D = rowsum(dO o) in another order than dP = dO v^T returns rounding noise of the size
// of the dot products' own terms. That size is what this file computes, with
// W_ij = sum_d |dO_id| |v_jd| (the terms of dP_ij) and Dabs_i = sum_j P_ij W_ij (which bounds
// sum_d |dO_id| |o_id|, the terms of D_i), times Dv (Higham's gamma_n for the two fp32 dot
// products of length Dv that cancel):
//   dq_terms[b, h, i]   = Dv |scale| max_d sum_j P_ij (W_ij + Dabs_i) |k_jd|
//   dk_terms[b, hkv, j] = Dv |scale| max_d sum_{h in group} sum_i P_ij (W_ij + Dabs_i) |q_id|
// H200 2026-12-02: with |dP| and |D| in place of W and Dabs (cancelled values) PyTorch's
// flash/efficient/cudnn backward noise reached 21-42 fp32 ULPs of that smaller magnitude.
// (|1 - tanh^2| <= 1, so softcap keeps these upper bounds of |dS| |k| and |dS| |q|).
#pragma once

#include "reference/problem/problem.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// Per-row term magnitudes, f64, contiguous, in the row order of the gradients' metrics rows
// (verify/metrics.h: one row per (token, head) vector along d): dq [TotalQ, Hq], dk
// [TotalK, Hkv]. Rows nothing sees (an empty query row; a key no query sees) are exactly 0.
struct GradientTermScales {
  Tensor dq;
  Tensor dk;
};

// q, k, v, dout: f64 inputs of the problem's shapes; lse and delta: the oracle's forward lse
// and D = rowsum(dO o) (reference/oracle/oracle.h BackwardOut), lse's shape (-inf lse marks
// an empty row). P = exp(s - lse) with s the oracle's score (mask.h TransformScore, MaskView).
// Tiled over query blocks and key blocks with cblas_dgemm: memory beyond the inputs is one
// tile plus one [k_len, D] accumulator per kv head. Errors name the tensor whose shape or
// dtype is wrong.
Expected<GradientTermScales> ComputeGradientTermScales(const Problem& p, const Tensor& q,
                                                       const Tensor& k, const Tensor& v,
                                                       const Tensor& dout, const Tensor& lse,
                                                       const Tensor& delta);

}  // namespace attest
