// The engine's forward (flash_engine.h FlashForward): FlashAttention-2's Algorithm 1 as
// flash-attention csrc/flash_attn/src/flash_fwd_kernel.h compute_attn_1rowblock and softmax.h
// run it, one query tile of one head per work item.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/models/flash_engine.h"
#include "kernels/models/flash_engine_internal.h"
#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "reference/problem/paged.h"

namespace attest {
namespace engine_detail {
namespace {

struct ForwardPlan {
  const Problem* p;
  const Recipe* recipe;
  const EngineOptions* opt;
  ScoreParams sp;
  Operand q, k, v;  // as the recipe represents them for Q·Kᵀ (q, k) and P·V (v)
  Format out_format;        // the format MakeOutput stores o in
  OperandScheme out_round;  // o's rounding (recipe.h OutputRoundingOf)
  std::vector<float> o;     // [total_q, Hq, Dv], rounded by out_round
  std::vector<float> lse;  // lse layout
  std::vector<float> sink;  // [Hq] (EngineOptions::sink), empty without one
};

// A finished row's o (rounded by out_round) and lse, with the learnable sink (finite) joining
// the sum at the row's end in fp32: below the row max it adds exp(sink - m) to the sum; above
// it becomes the max (the accumulator and the sum rescaled by exp(m - sink)), so a huge sink
// neither overflows nor loses lse = sink.
void FinishSinkRow(const ForwardPlan& plan, const EngineHooks& hooks, float row_max, float sum,
                   float sink, const float* acc, int64_t dv, float* out, float* lse) {
  const float m = row_max * plan.sp.scale_softmax;
  float f = 1.0f, total = 0.0f;
  if (sink <= m) {
    total = sum + std::exp(sink - m);
    *lse = hooks.RowLse(row_max, total, plan.sp.scale_softmax);
  } else {
    f = std::exp(m - sink);
    total = sum * f + 1.0f;
    *lse = sink + std::log(total);
  }
  const float inv = 1.0f / total;
  for (int64_t c = 0; c < dv; ++c) out[c] = RoundElement(acc[c] * f * inv, plan.out_round);
}

// Keys outside [k_lo, k_hi) of a tile [.., n0, nlen) hidden in `vis`; the visible count left.
int64_t KeepKeys(std::vector<uint8_t>& vis, int64_t mlen, int64_t n0, int64_t nlen, int64_t k_lo,
                 int64_t k_hi) {
  int64_t visible = 0;
  for (int64_t i = 0; i < mlen; ++i) {
    for (int64_t j = 0; j < nlen; ++j) {
      uint8_t& v = vis[static_cast<size_t>(i * nlen + j)];
      if (n0 + j < k_lo || n0 + j >= k_hi) v = 0;
      visible += v;
    }
  }
  return visible;
}

// The splits a forward runs: a mutant's forced count, else the problem's (0: one).
int64_t SplitCount(const Problem& p, const EngineHooks& hooks) {
  if (hooks.KvSplits() > 1) return hooks.KvSplits();
  return std::max<int64_t>(1, p.num_splits);
}

// One query tile of one head (flash_fwd_kernel.h compute_attn_1rowblock).
Status ForwardRowBlock(ForwardPlan& plan, int64_t b, int64_t h, int64_t m0) {
  const Problem& p = *plan.p;
  const EngineHooks& hooks = HooksOf(*plan.opt);
  const MaskView mask(p, b);
  const Sequence& seq = mask.sequence();
  const int64_t bm = plan.opt->fwd_block_m, bn = plan.opt->fwd_block_n;
  const int64_t mlen = std::min(bm, seq.q_len - m0);
  const int64_t d = p.head_dim, dv = p.head_dim_v, hk = hooks.KvHead(p, h);

  std::vector<float> qt(static_cast<size_t>(mlen * d));
  GatherRows(plan.q, seq.q_begin + m0, h, mlen, qt.data());
  std::vector<float> kt(static_cast<size_t>(d * bn)), vt(static_cast<size_t>(bn * dv));
  std::vector<float> s(static_cast<size_t>(mlen * bn));
  std::vector<uint8_t> vis;

  // Key tiles that can hold a visible key for some row of this tile (n_block_min/max):
  // nb from `top` down to `bottom` (empty when top < bottom).
  const auto [lo, hi] = KeyRangeOf(mask, m0, mlen);
  const int64_t top = hi > lo ? (hi - 1) / bn : -1;
  const int64_t bottom = hi > lo ? lo / bn : 0;

  // flash_fwd_kernel.h iterates the key blocks in reverse order (last block first). A split
  // reads the keys [k_lo, k_hi) of its tiles only (its bounds are tile multiples unless a
  // mutant's KvSplitEnd moves one).
  auto run_tiles = [&](int64_t nb_top, int64_t nb_bottom, SoftmaxRows& st, int64_t k_lo,
                       int64_t k_hi) -> Status {
    for (int64_t nb = nb_top; nb >= nb_bottom; --nb) {
      const int64_t n0 = nb * bn, nlen = std::min(bn, seq.k_len - n0);
      int64_t visible = TileVisibility(mask, m0, mlen, n0, nlen, vis);
      if (n0 < k_lo || n0 + nlen > k_hi) visible = KeepKeys(vis, mlen, n0, nlen, k_lo, k_hi);
      if (visible == 0) continue;  // skipped exactly
      hooks.ForwardTileMask(visible, vis);
      GatherRowsTransposed(plan.k, seq.k_begin + n0, hk, nlen, kt.data());
      GatherRows(plan.v, seq.k_begin + n0, hk, nlen, vt.data());
      std::fill(s.begin(), s.begin() + mlen * nlen, 0.0f);
      GemmAcc(s.data(), nlen, qt.data(), d, 1, kt.data(), nlen, mlen, nlen, d);
      TransformScores(plan.sp, hooks, mask, h, m0, mlen, n0, nlen, vis, s, nullptr);
      // softmax.h softmax_rescale_o: new max, rescale row_sum and acc_o, then exp2 with the
      // scale folded in: p = exp2(s · scale_log2 − max · scale_log2).
      for (int64_t i = 0; i < mlen; ++i) {
        float* si = s.data() + i * nlen;
        float m_new = st.row_max[i];
        for (int64_t j = 0; j < nlen; ++j) m_new = std::max(m_new, si[j]);
        m_new = hooks.RowMax(st.row_max[i], m_new, plan.sp.scale_log2);
        const float m_cur = m_new == -kInf ? 0.0f : m_new;  // Check_inf
        const float rescale = std::exp2((st.row_max[i] - m_cur) * plan.sp.scale_log2);
        st.row_max[i] = m_new;
        st.row_sum[i] *= rescale;
        hooks.RescaleAcc(st.acc.data() + i * dv, dv, rescale);
        const float max_scaled = m_new == -kInf ? 0.0f : m_new * plan.sp.scale_log2;
        for (int64_t j = 0; j < nlen; ++j) {
          si[j] = std::exp2(FmaF32(si[j], plan.sp.scale_log2, -max_scaled));
          st.row_sum[i] += si[j];  // the row sum uses P before its rounding (FA2)
        }
      }
      // P rounded before P·V (convert_type<Element>(acc_s)).
      if (Status r = RoundTile(s, mlen, nlen, plan.recipe->pv.a, false); !r) return r;
      GemmAcc(st.acc.data(), dv, s.data(), nlen, 1, vt.data(), dv, mlen, dv, nlen);
    }
    return Status::Ok();
  };

  // FlashAttention-2 runs every key tile into one state. Split-KV (flash-decoding; the
  // problem's num_splits, or a mutant's KvSplits) cuts the sequence's key tiles into n ranges
  // of ceil(tiles / n) tiles (flash_fwd_kernel.h compute_attn_1rowblock_splitkv:
  // n_blocks_per_split), each with its own online softmax over the tiles this query tile can
  // see, and combines them per row (CombineKvSplits).
  const int64_t n_splits = SplitCount(p, hooks);
  const float sink_h = plan.sink.empty() ? -kInf : plan.sink[static_cast<size_t>(h)];
  if (n_splits > 1) {
    const int64_t tiles = (seq.k_len + bn - 1) / bn;
    const int64_t per = (tiles + n_splits - 1) / n_splits;
    std::vector<SoftmaxRows> parts;
    std::vector<const SoftmaxRows*> views;
    parts.reserve(static_cast<size_t>(n_splits));
    int64_t k_lo = 0;
    for (int64_t s = 0; s < n_splits; ++s) {
      int64_t k_hi = std::min(seq.k_len, (s + 1) * per * bn);
      if (s + 1 < n_splits) k_hi = std::clamp(hooks.KvSplitEnd(k_hi, seq.k_len), k_lo, seq.k_len);
      else k_hi = seq.k_len;
      parts.emplace_back(mlen, dv);
      const int64_t hi_tile = std::min(top, (k_hi - 1) / bn), lo_tile = std::max(bottom, k_lo / bn);
      if (k_hi > k_lo && hi_tile >= lo_tile) {
        if (Status r = run_tiles(hi_tile, lo_tile, parts.back(), k_lo, k_hi); !r) return r;
      }
      k_lo = std::min(seq.k_len, (s + 1) * per * bn);
    }
    for (const SoftmaxRows& r : parts) views.push_back(&r);
    for (int64_t i = 0; i < mlen; ++i) {
      float* out = plan.o.data() + ((seq.q_begin + m0 + i) * p.heads_q + h) * dv;
      float& lse = plan.lse[static_cast<size_t>(LseIndex(p, b, h, m0 + i))];
      hooks.CombineKvSplits(views, i, dv, plan.sp.scale_softmax, sink_h, plan.out_round, out,
                            &lse);
    }
    return Status::Ok();
  }
  SoftmaxRows st(mlen, dv);
  if (Status r = run_tiles(top, bottom, st, 0, seq.k_len); !r) return r;

  // softmax.h normalize_softmax_lse: o = acc · (1 / sum); lse = max · scale + log(sum).
  for (int64_t i = 0; i < mlen; ++i) {
    float* out = plan.o.data() + ((seq.q_begin + m0 + i) * p.heads_q + h) * dv;
    float& lse = plan.lse[static_cast<size_t>(LseIndex(p, b, h, m0 + i))];
    const float sum = st.row_sum[i];
    const float sink = sink_h;
    if (sum == 0 || sum != sum) {  // no visible key (or nothing left of them)
      EmptyRow(out, dv, &lse);
      if (sum == 0 && sink > -kInf) lse = sink;  // o = 0, lse = sink (docs/semantics.md)
      continue;
    }
    if (sink > -kInf) {
      FinishSinkRow(plan, hooks, st.row_max[i], sum, sink, &st.acc[i * dv], dv, out, &lse);
      continue;
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < dv; ++c) {
      out[c] = RoundElement(st.acc[i * dv + c] * inv, plan.out_round);
    }
    lse = hooks.RowLse(st.row_max[i], sum, plan.sp.scale_softmax);
  }
  return Status::Ok();
}

}  // namespace
}  // namespace engine_detail

using engine_detail::ForwardPlan;
using engine_detail::ForwardRowBlock;
using engine_detail::HooksOf;
using engine_detail::InputFloats;
using engine_detail::InputFormat;
using engine_detail::kInf;
using engine_detail::MakeOutput;
using engine_detail::MakeScoreParams;
using engine_detail::Operand;
using engine_detail::Prepare;
using engine_detail::RunItems;

KernelAnswer<ForwardResult> FlashForward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                         const Tensor& k, const Tensor& v,
                                         const EngineOptions& options) {
  if (Status s = Validate(p); !s) return s.error();
  if (Status s = ValidateInputShapes(p, q, k, v); !s) return s.error();
  if (HasLogicalView(p)) return engine_detail::PagedForward(p, recipe, q, k, v, options);
  if (std::string why = EngineUnsupportedReason(p, recipe, options); !why.empty()) {
    return Unsupported{why};
  }
  ForwardPlan plan;
  plan.p = &p;
  plan.recipe = &recipe;
  plan.opt = &options;
  plan.sp = MakeScoreParams(p, options.rel_bias);
  plan.out_round = OutputRoundingOf(recipe, InputFormat(p));
  // A scaled rounding's values are not the format's (E4M3 / 2^k): kept as fp32.
  plan.out_format = recipe.output_scale == 1.0 ? plan.out_round.element : Format::kF32;
  const Operand raw_q{InputFloats(q, p.dtype), p.heads_q, p.head_dim};
  const Operand raw_k{InputFloats(k, p.dtype), p.heads_kv, p.head_dim};
  const Operand raw_v{InputFloats(v, p.dtype), p.heads_kv, p.head_dim_v};
  {
    const EngineHooks& hooks = HooksOf(options);
    Expected<Operand> a = Prepare(p, raw_q, recipe.qk.a, hooks);
    if (!a.ok()) return a.error();
    Expected<Operand> b = Prepare(p, raw_k, recipe.qk.b, hooks);
    if (!b.ok()) return b.error();
    Expected<Operand> c = Prepare(p, raw_v, recipe.pv.b, hooks);
    if (!c.ok()) return c.error();
    plan.q = std::move(*a);
    plan.k = std::move(*b);
    plan.v = std::move(*c);
  }
  plan.o.assign(static_cast<size_t>(p.TotalQ() * p.heads_q * p.head_dim_v), 0.0f);
  plan.lse.assign(static_cast<size_t>(Tensor::NumElements(p.LseShape())), -kInf);
  if (options.sink != nullptr) plan.sink = InputFloats(*options.sink, DType::kF32);
  struct Item {
    int64_t b, h, m0;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q_len = SequenceOf(p, b).q_len;
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t m0 = 0; m0 < q_len; m0 += options.fwd_block_m) {
        items.push_back({b, h, m0});
      }
    }
  }
  if (Status s = RunItems(static_cast<int64_t>(items.size()), options.threads,
                          [&](int64_t i) {
                            const Item& it = items[static_cast<size_t>(i)];
                            return ForwardRowBlock(plan, it.b, it.h, it.m0);
                          });
      !s) {
    return s.error();
  }
  ForwardResult out;
  out.o = MakeOutput(p.OShape(), plan.o, plan.out_format);
  out.lse = MakeOutput(p.LseShape(), plan.lse, Format::kF32);
  return out;
}

}  // namespace attest
