// The split-KV relation (docs/checks.md "Splits agree"): a kernel that declares the split
// counts it accepts (kernels/kernel.h Capabilities::num_splits; FlashAttention's num_splits)
// computes the same attention at every count, only the combine's arithmetic differs:
//   splits-agree:  the forward at every declared count agrees with the forward at the first
//                  one within 2 ulps of the row plus SplitBound's allowance (o) and 4 fp32
//                  ulps of the row's lse scale plus its allowance (lse). Forward only: the
//                  backward does not split (FlashAttention's does not).
// Every count is also judged alone against the oracle by the suite's split rows (run/suite.h).
#pragma once

#include <vector>

#include "reference/formats/format.h"
#include "reference/problem/problem.h"
#include "reference/tensor.h"
#include "verify/checks/check.h"

namespace attest {

std::vector<Verdict> RunSplitsAgree(CheckContext& ctx);

// Per-element allowance (f64; o's and lse's shapes) for two forwards of one problem at split
// counts up to `max_splits`, beyond the 2 ulps of o's row and 4 fp32 ulps of lse's scale that
// the check's comparisons carry. With u = 2^-24 (fp32, the combine's and the accumulation's
// format), u_P the unit roundoff of P's rounding before P·V (`p_format`; 0 when P stays fp32),
// T_id = Σ_j P_ij |v_jd|, L_i = max(|lse_i|, max_j |s_ij|) + ln(n_i) (n_i keys visible) and
// N = max_splits:
//   o_id:  2 u_P (T_id + |o_id|)            each split rounds P = exp(s − m_s) relative to its
//                                           own max m_s, so P's roundings differ between counts
//                                           (each within u_P of P, also in l if it sums them)
//        + 2 u (2 L_i + N + 4) (T_id + |o_id|)  the combine in fp32: o_s = acc_s / l_s stored
//                                           (1 u), lse_s = m_s + log l_s (|lse_s| <= L_i),
//                                           exp(lse_s − lse) (its argument's two roundings and
//                                           exp's), N partials summed, lse itself
//        + SumOrderBound(fp32)'s o          every sum reordered by the split points
//   lse_i: 2 u (2 L_i + N + 4 + R(n_i) + max_j e_ij)  the same combine, and l_s's fp32 sums
//                                           (R and e of relation_bounds.h SumOrderBound; l_s is
//                                           the sum of P before its rounding, FlashAttention's
//                                           softmax.h row_sum)
// A finite learnable sink (Problem::sink) is one more term of the combine's max and sum: L_i
// also bounds |sink_h| and N + 4 becomes N + 5; it has no value, so T is unchanged.
// (the factor 2: two runs). P, T and L come from `lse` (the first count's run, or the
// oracle's where the kernel returns none) and `o` that run's output; no oracle value is the
// reference.
struct SplitAllowance {
  Tensor o, lse;
};
SplitAllowance SplitBound(const Problem& p, const CaseInputs& in, const Tensor& o,
                          const Tensor& lse, double p_unit_roundoff, int64_t max_splits);

}  // namespace attest
