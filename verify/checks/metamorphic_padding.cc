// The padding relation (see metamorphic.h): padding tokens leave the real tokens' outputs
// unchanged, for a packed batch (padding sequences in front and behind) and a padded one
// (padding queries and keys hidden by document ids). The helpers it shares with the other
// relations are metamorphic_internal.h.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "reference/problem/problem.h"
#include "verify/checks/metamorphic.h"
#include "verify/checks/metamorphic_internal.h"
#include "verify/checks/relation_bounds.h"

namespace attest {
namespace {

using metamorphic_detail::Agree;
using metamorphic_detail::BaseRun;
using metamorphic_detail::CaseOrderBound;
using metamorphic_detail::LseScale;
using metamorphic_detail::RunKernel;
using metamorphic_detail::RunOutputs;
using metamorphic_detail::SequenceBlock;

constexpr std::string_view kCheck = "padding";

// Rows [begin, begin + n) of `t` along `axis` (a contiguous copy).
Tensor Rows(const Tensor& t, int64_t axis, int64_t begin, int64_t n) {
  std::vector<int64_t> src(static_cast<size_t>(n));
  std::iota(src.begin(), src.end(), begin);
  return Gather(t, axis, src);
}

// `t` with `before` rows inserted in front of and `after` rows behind its rows along `axis`
// (padded: every batch entry gets its own, so `axis` is the sequence axis there). Padding
// rows are copies of the tensor's own rows taken backwards (values of the dtype, and stale
// data is what padding holds in practice). Copies leave a per-tensor amax where it was; with
// `block` > 0 they are taken from the last `block`-aligned block of real rows only, so that
// padding appended into that block leaves its amax, and so its scale, where it was too (a
// recipe blocked along the sequence, SequenceBlock).
Tensor PadRows(const Tensor& t, int64_t axis, int64_t before, int64_t after, int64_t block = 0) {
  const int64_t n = t.dim(axis);
  const int64_t m = block > 0 && n > 0 ? n - (n - 1) / block * block : n;
  std::vector<int64_t> src;
  for (int64_t k = 0; k < before; ++k) src.push_back(n - 1 - (k % m));
  for (int64_t k = 0; k < n; ++k) src.push_back(k);
  for (int64_t k = 0; k < after; ++k) src.push_back((n - 1 - ((before + k) % m)));
  return Gather(t, axis, src);
}

// The padded run of the relation: its problem and inputs, and where the real rows sit in its
// outputs: offset along the row axis of q-side tensors (o, dq; lse's token axis), k-side
// tensors (dk, dv). `what` describes the padding for the verdicts.
struct PaddedRun {
  Problem pp;
  Tensor q2, k2, v2, do2;
  int64_t q_off = 0, k_off = 0, q_axis = 0, k_axis = 0, lse_axis = 0;
  std::string what;
};

// A packed batch with padding sequences in front and behind; nullopt when the relation has
// nothing to judge (a sequence-blocked recipe without queries or keys, no real tokens).
std::optional<PaddedRun> PackedPadding(const CheckContext& ctx, bool bwd) {
  const Problem& p = ctx.case_.problem;
  const CaseInputs& in = ctx.inputs;
  PaddedRun r;
  r.pp = p;
  // Odd lengths, so that every real sequence moves by a non-multiple of any tile or block.
  // A recipe blocked along the sequence (SequenceBlock, block n) may only be asked what
  // keeps its block grid: n padding tokens in front, in padding sequences of at most the
  // longest real length (max_seqlen unchanged; zero-length ones pad the shorter side), so
  // every real token keeps its block and its block's neighbours; and none behind, where
  // padding would join the last real block and move its scale by design.
  const int64_t block = SequenceBlock(ctx);
  const int64_t fq = block > 0 ? block : std::min<int64_t>(7, p.seqlen_q);
  const int64_t fk = block > 0 ? block : std::min<int64_t>(5, p.seqlen_k);
  const int64_t bq = block > 0 ? 0 : std::min<int64_t>(13, p.seqlen_q);
  const int64_t bk = block > 0 ? 0 : std::min<int64_t>(11, p.seqlen_k);
  if (block > 0 && (p.seqlen_q == 0 || p.seqlen_k == 0)) return std::nullopt;
  // Front padding sequences: lengths of at most seqlen each, as many on both sides.
  auto split = [](int64_t total, int64_t cap, int64_t count) {
    std::vector<int32_t> lens;
    for (int64_t c = 0; c < count; ++c) {
      const int64_t n = std::min(cap, total);
      lens.push_back(static_cast<int32_t>(n));
      total -= n;
    }
    return lens;
  };
  const int64_t front_count =
      block > 0 ? std::max((fq + p.seqlen_q - 1) / p.seqlen_q, (fk + p.seqlen_k - 1) / p.seqlen_k)
                : 1;
  std::vector<int32_t> cq = {0}, ck = {0};
  for (int32_t n : split(fq, block > 0 ? p.seqlen_q : fq, front_count)) cq.push_back(cq.back() + n);
  for (int32_t n : split(fk, block > 0 ? p.seqlen_k : fk, front_count)) ck.push_back(ck.back() + n);
  for (size_t b = 1; b < p.cu_seqlens_q->size(); ++b) {
    cq.push_back(static_cast<int32_t>(fq) + (*p.cu_seqlens_q)[b]);
    ck.push_back(static_cast<int32_t>(fk) + (*p.cu_seqlens_k)[b]);
  }
  const int64_t back_count = block > 0 ? 0 : 1;
  if (back_count > 0) {
    cq.push_back(cq.back() + static_cast<int32_t>(bq));
    ck.push_back(ck.back() + static_cast<int32_t>(bk));
  }
  r.pp.batch = p.batch + front_count + back_count;
  r.pp.cu_seqlens_q = cq;
  r.pp.cu_seqlens_k = ck;
  auto pad = [](const Tensor& t, int64_t before, int64_t after) {
    return t.dim(0) == 0 ? t : PadRows(t, 0, before, after);
  };
  r.q2 = pad(in.q, fq, bq);
  r.k2 = pad(in.k, fk, bk);
  r.v2 = pad(in.v, fk, bk);
  if (bwd) r.do2 = pad(in.dout, fq, bq);
  r.q_off = fq;
  r.k_off = fk;
  r.lse_axis = 1;  // [Hq, total_q]
  r.what = block > 0
               ? fmt::format("{} padding sequence(s) of {}x{} tokens in front, none behind "
                             "(sequence blocks of {}: the block grid kept)",
                             front_count, fq, fk, block)
               : fmt::format("padding sequences of {}x{} tokens in front and {}x{} behind", fq,
                             fk, bq, bk);
  if (r.q2.dim(0) == 0 || r.k2.dim(0) == 0) return std::nullopt;
  return r;
}

// A padded batch with padding queries and keys appended to every batch entry, hidden by
// document ids that no real token has.
PaddedRun PaddedBatchPadding(const CheckContext& ctx, bool bwd) {
  const Problem& p = ctx.case_.problem;
  const CaseInputs& in = ctx.inputs;
  PaddedRun r;
  r.pp = p;
  const int64_t n = 9;  // padding tokens per batch entry, queries and keys alike
  // Ids no real token has. Without document ids every real token is given id 0 below, so
  // the first free id is 1 (starting from 0 gave the padding keys the real tokens' id:
  // every real query saw them).
  int32_t next_id = 1;
  if (p.document_ids_q) {
    for (const auto& row : *p.document_ids_q) {
      for (int32_t x : row) next_id = std::max(next_id, x + 1);
    }
    for (const auto& row : *p.document_ids_k) {
      for (int32_t x : row) next_id = std::max(next_id, x + 1);
    }
  }
  const int32_t pad_key_id = next_id, pad_query_id = next_id + 1;
  std::vector<std::vector<int32_t>> dq_ids, dk_ids;
  for (int64_t b = 0; b < p.batch; ++b) {
    std::vector<int32_t> qi = p.document_ids_q ? (*p.document_ids_q)[static_cast<size_t>(b)]
                                               : std::vector<int32_t>(
                                                     static_cast<size_t>(p.seqlen_q), 0);
    std::vector<int32_t> ki = p.document_ids_k ? (*p.document_ids_k)[static_cast<size_t>(b)]
                                               : std::vector<int32_t>(
                                                     static_cast<size_t>(p.seqlen_k), 0);
    qi.insert(qi.end(), static_cast<size_t>(n), pad_query_id);
    ki.insert(ki.end(), static_cast<size_t>(n), pad_key_id);
    dq_ids.push_back(std::move(qi));
    dk_ids.push_back(std::move(ki));
  }
  r.pp.seqlen_q = p.seqlen_q + n;
  r.pp.seqlen_k = p.seqlen_k + n;
  r.pp.document_ids_q = dq_ids;
  r.pp.document_ids_k = dk_ids;
  // The padding joins the last block of a sequence-blocked recipe: copies of that block's
  // own rows keep its scales (PadRows).
  const int64_t block = SequenceBlock(ctx);
  r.q2 = PadRows(in.q, 1, 0, n, block);
  r.k2 = PadRows(in.k, 1, 0, n, block);
  r.v2 = PadRows(in.v, 1, 0, n, block);
  if (bwd) r.do2 = PadRows(in.dout, 1, 0, n, block);
  r.q_axis = r.k_axis = 1;
  r.lse_axis = 2;  // [B, Hq, Sq]
  r.what = fmt::format("{} padding queries and keys appended to every batch entry, masked by "
                       "document ids",
                       n);
  return r;
}

// The real tokens' outputs of the padded run `rel` against the base run's.
std::vector<Verdict> JudgePadding(CheckContext& ctx, bool bwd, const PaddedRun& pad,
                                  const RunOutputs& base, const RunOutputs& rel) {
  const Problem& p = ctx.case_.problem;
  const CaseInputs& in = ctx.inputs;
  const bool packed = p.varlen();
  const Problem& pp = pad.pp;
  const int64_t q_off = pad.q_off, k_off = pad.k_off, q_axis = pad.q_axis, k_axis = pad.k_axis,
                lse_axis = pad.lse_axis;
  // Packed padding leaves every real token's computation as it was: bitwise for a kernel
  // that claims determinism. Padded padding changes Sq and Sk, and with them a kernel's tile
  // count and split points: the window relation's budgets.
  // A hybrid kernel may route the padded problem (documents, varlen) to another backward:
  // dq and dk then also get what its other dP rounding moves (DpAllowance), and bitwise
  // equality is off.
  std::string dp_note;
  const std::optional<DpRoundingAllowance> dpa =
      DpAllowance(ctx, pp, base.fwd, base.bwd.has_value(), &dp_note);
  const bool exact = packed && ctx.kernel->capabilities().deterministic && !dpa;
  const double o_ulps = exact ? 0 : 2, lse_ulps = exact ? 0 : 4, g_ulps = exact ? 0 : 2;
  const int64_t nq = packed ? p.TotalQ() : p.seqlen_q, nk = packed ? p.TotalK() : p.seqlen_k;
  // Padded padding changes the shapes the kernel sums over: SumOrderBound on top.
  const OrderAllowance order =
      exact ? OrderAllowance{} : CaseOrderBound(ctx, base.fwd.o, base.fwd.lse);
  std::vector<Verdict> out;
  out.push_back(Agree(kCheck, "o", p, ctx.profile, base.fwd.o, Rows(rel.fwd.o, q_axis, q_off, nq),
                      o_ulps, nullptr, order.o_or_null()));
  if (JudgesLse(*ctx.kernel)) {
    const Tensor lse_scale = LseScale(p, base.fwd.lse);
    out.push_back(Agree(kCheck, "lse", p, ctx.profile, base.fwd.lse, Rows(rel.fwd.lse, lse_axis, q_off, nq),
                        lse_ulps, &lse_scale));
  }
  if (bwd) {
    // Not bitwise (exact needs !dpa): each run's own roundings (RecomputeBound) on top.
    const RecomputeAllowance extra =
        exact ? RecomputeAllowance{}
              : RecomputeBound(ctx, p, in, base.fwd.o, base.fwd.lse,
                               Rows(rel.fwd.o, q_axis, q_off, nq),
                               Rows(rel.fwd.lse, lse_axis, q_off, nq),
                               [&] { return ctx.OracleForward().lse; }, dpa ? &*dpa : nullptr);
    out.push_back(Agree(kCheck, "dq", p, ctx.profile, base.bwd->dq,
                        Rows(rel.bwd->dq, q_axis, q_off, nq), g_ulps, nullptr,
                        extra.dq_or_null()));
    out.push_back(Agree(kCheck, "dk", p, ctx.profile, base.bwd->dk,
                        Rows(rel.bwd->dk, k_axis, k_off, nk), g_ulps, nullptr,
                        extra.dk_or_null()));
    out.push_back(Agree(kCheck, "dv", p, ctx.profile, base.bwd->dv,
                        Rows(rel.bwd->dv, k_axis, k_off, nk), g_ulps, nullptr,
                        order.dv_or_null()));
  }
  for (Verdict& v : out) v.message += " (" + pad.what + "; real tokens only" + dp_note + ")";
  return out;
}

}  // namespace

std::vector<Verdict> RunPadding(CheckContext& ctx) {
  const Problem& p = ctx.case_.problem;
  const Capabilities caps = ctx.kernel->capabilities();
  const bool bwd = ctx.WantsBackward();
  const bool packed = p.varlen();
  // Packed: a padding sequence in front of and one behind the batch (the fixed token count
  // of CUDA-graph captures), each no longer than the longest real one, so that max_seqlen and
  // every real sequence's own lengths are unchanged and a correct kernel computes every real
  // token exactly as before. Padded: padding queries and keys appended to every batch entry,
  // hidden by document ids that no real token has (a key-padding mask); the same count on
  // both sides keeps the bottom-right diagonal, window and ALiBi offsets of the real rows.
  if (packed ? false : (!caps.documents || p.prefix_lm > 0 || p.block_sparse)) {
    ctx.not_applicable = "a padded batch is padded with document ids, which need documents "
                         "claimed and no prefix-LM or block list";
    return {};
  }
  if (packed && p.TotalQ() == 0 && p.TotalK() == 0) return {};
  // A padded batch without queries or without keys has no real token pairs whose outputs
  // padding could move (and no real row to copy padding values from).
  if (!packed && (p.seqlen_q == 0 || p.seqlen_k == 0)) return {};
  RunOutputs base = BaseRun(kCheck, ctx, bwd);
  if (base.stop) return *base.stop;

  const std::optional<PaddedRun> pad =
      packed ? PackedPadding(ctx, bwd) : PaddedBatchPadding(ctx, bwd);
  if (!pad) return {};
  if (Status s = Validate(pad->pp); !s.ok()) {
    throw HarnessError("padding relation: " + s.error().message);
  }
  if (!caps.Covers(pad->pp)) return {};
  RunOutputs rel = RunKernel(kCheck, *ctx.kernel, pad->pp, pad->q2, pad->k2, pad->v2, pad->do2,
                             bwd, pad->what);
  if (rel.stop) return *rel.stop;
  return JudgePadding(ctx, bwd, *pad, base, rel);
}

}  // namespace attest
