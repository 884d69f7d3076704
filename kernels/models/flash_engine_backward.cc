// The engine's backward (flash_engine.h FlashBackward): FlashAttention-2's Algorithm 2 as
// flash-attention csrc/flash_attn/src/flash_bwd_kernel.h and flash_bwd_preprocess_kernel.h run
// it (BackwardVariant::kFlash2), or the RDNA3 fused walk (kFusedNoAtomics), one (sequence, kv
// head) per work item.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/models/flash_engine.h"
#include "kernels/models/flash_engine_internal.h"
#include "reference/formats/format.h"
#include "reference/problem/mask.h"
#include "reference/problem/paged.h"

namespace attest {
namespace engine_detail {
namespace {

struct BackwardPlan {
  const Problem* p;
  const Recipe* recipe;
  const EngineOptions* opt;
  ScoreParams sp;
  Format grad_format;                   // the format MakeOutput stores dq, dk, dv in
  std::array<OperandScheme, 3> grad_round;  // dq, dk, dv (recipe.h GradientRoundingOf)
  bool fused;
  std::optional<Format> dp_format;  // BackwardDpFormat(recipe, options)
  // Operands per GEMM, as the recipe represents them.
  Operand q_qk, k_qk, do_dov, v_dov, do_pdo, k_dsk, q_dsq;
  std::vector<float> lse;    // lse layout
  std::vector<float> delta;  // [total_q, Hq]
  std::vector<float> dq, dk, dv;
  std::vector<float> drel;  // [B, Hq, W] fp32 diagonal sums per (sequence, head) (rel_bias)
};

// P, dP and dS of one (query tile, key tile) pair of one head. Returns false when the tile
// holds no visible pair.
struct TileScratch {
  std::vector<float> qt, kt, vt, dot, s, t, dp, ds;
  std::vector<uint8_t> vis;
};

Status ComputeTile(BackwardPlan& plan, const MaskView& mask, int64_t b, int64_t h, int64_t m0,
                   int64_t mlen, int64_t n0, int64_t nlen, TileScratch& w, bool* any) {
  const Problem& p = *plan.p;
  const Sequence& seq = mask.sequence();
  const EngineHooks& hooks = HooksOf(*plan.opt);
  const int64_t d = p.head_dim, dv = p.head_dim_v, hk = hooks.KvHead(p, h);
  const int64_t visible = TileVisibility(mask, m0, mlen, n0, nlen, w.vis);
  *any = visible > 0;
  if (!*any) return Status::Ok();
  hooks.BackwardTileMask(visible, w.vis);
  const size_t area = static_cast<size_t>(mlen * nlen);
  w.qt.resize(static_cast<size_t>(mlen * d));
  w.kt.resize(static_cast<size_t>(d * nlen));
  w.vt.resize(static_cast<size_t>(dv * nlen));
  w.dot.resize(static_cast<size_t>(mlen * dv));
  w.s.assign(area, 0.0f);
  w.t.assign(area, 0.0f);
  w.dp.assign(area, 0.0f);
  w.ds.resize(area);
  GatherRows(plan.q_qk, seq.q_begin + m0, h, mlen, w.qt.data());
  GatherRowsTransposed(plan.k_qk, seq.k_begin + n0, hk, nlen, w.kt.data());
  GemmAcc(w.s.data(), nlen, w.qt.data(), d, 1, w.kt.data(), nlen, mlen, nlen, d);
  TransformScores(plan.sp, hooks, mask, h, m0, mlen, n0, nlen, w.vis, w.s, &w.t);
  // P recomputed from lse (flash_bwd_kernel.h: scale_apply_exp2 with max = lse, scaled by
  // log2(e)).
  for (int64_t i = 0; i < mlen; ++i) {
    const float lse = plan.lse[static_cast<size_t>(LseIndex(p, b, h, m0 + i))];
    hooks.RecomputeP(w.s.data() + i * nlen, w.vis.data() + i * nlen, nlen, lse,
                     hooks.LseLog2(lse), plan.sp.scale_log2);
  }
  // dP = dO · Vᵀ.
  GatherRows(plan.do_dov, seq.q_begin + m0, h, mlen, w.dot.data());
  GatherRowsTransposed(plan.v_dov, seq.k_begin + n0, hk, nlen, w.vt.data());
  GemmAcc(w.dp.data(), nlen, w.dot.data(), dv, 1, w.vt.data(), nlen, mlen, nlen, dv);
  // dP's own rounding point (BackwardDpFormat): the fused RDNA3 path produces dP with an
  // fp16-output WMMA.
  if (plan.dp_format) {
    for (float& x : w.dp) x = RoundElement(x, *plan.dp_format);
  }
  // dS = P ∘ (dP − D) (flash_bwd_kernel.h pointwise), times tanh' under softcap.
  for (int64_t i = 0; i < mlen; ++i) {
    const float di = plan.delta[static_cast<size_t>((seq.q_begin + m0 + i) * p.heads_q + h)];
    for (int64_t j = 0; j < nlen; ++j) {
      const size_t e = static_cast<size_t>(i * nlen + j);
      w.ds[e] = w.s[e] * (w.dp[e] - di);
    }
  }
  if (plan.sp.softcap_in != 0) hooks.SoftcapDerivative(w.ds.data(), w.t.data(), mlen * nlen);
  return Status::Ok();
}

// drel_bias's diagonal sums of (sequence b, head h) += dS before the softcap derivative,
// P (dP - D) recomputed in fp32 exactly as ComputeTile forms it, visible entries in row-major
// order (called once per tile, in the FA2 walk's pass).
void AccumulateRelBias(BackwardPlan& plan, int64_t b, int64_t h, int64_t m0, int64_t mlen,
                       int64_t n0, int64_t nlen, const TileScratch& w) {
  const Problem& p = *plan.p;
  const Sequence seq = SequenceOf(p, b);
  const int64_t width = plan.sp.rel_width;
  const int64_t base = (b * p.heads_q + h) * width + plan.sp.rel_center + m0 - n0;
  for (int64_t i = 0; i < mlen; ++i) {
    const float di = plan.delta[static_cast<size_t>((seq.q_begin + m0 + i) * p.heads_q + h)];
    for (int64_t j = 0; j < nlen; ++j) {
      const size_t e = static_cast<size_t>(i * nlen + j);
      if (w.vis[e]) plan.drel[static_cast<size_t>(base + i - j)] += w.s[e] * (w.dp[e] - di);
    }
  }
}

// dQ(rows of the query tile) += round(dS) · K, fp32, continuing the row's chain.
Status AccumulateDq(BackwardPlan& plan, const Sequence& seq, int64_t h, int64_t mlen, int64_t n0,
                    int64_t nlen, TileScratch& w, std::vector<float>& tile, float* dq_rows) {
  const int64_t d = plan.p->head_dim;
  tile.assign(w.ds.begin(), w.ds.end());
  if (Status st = RoundTile(tile, mlen, nlen, plan.recipe->dsk.a, false); !st) return st;
  w.kt.resize(static_cast<size_t>(nlen * d));  // reused as K rows [nlen, d]
  GatherRows(plan.k_dsk, seq.k_begin + n0, HooksOf(*plan.opt).KvHead(*plan.p, h), nlen,
             w.kt.data());
  GemmAcc(dq_rows, d, tile.data(), nlen, 1, w.kt.data(), d, mlen, d, nlen);
  return Status::Ok();
}

// dV(key tile) += round(P)ᵀ · dO and dK(key tile) += round(dS)ᵀ · Q.
Status AccumulateDkDv(BackwardPlan& plan, const Sequence& seq, int64_t h, int64_t m0, int64_t mlen,
                      int64_t nlen, TileScratch& w, std::vector<float>& tile, float* dk_acc,
                      float* dv_acc) {
  const int64_t d = plan.p->head_dim, dv = plan.p->head_dim_v;
  tile.assign(w.s.begin(), w.s.end());
  if (Status st = RoundTile(tile, mlen, nlen, plan.recipe->pdo.a, true); !st) return st;
  GatherRows(plan.do_pdo, seq.q_begin + m0, h, mlen, w.dot.data());
  GemmAcc(dv_acc, dv, tile.data(), 1, nlen, w.dot.data(), dv, nlen, dv, mlen);
  tile.assign(w.ds.begin(), w.ds.end());
  if (Status st = RoundTile(tile, mlen, nlen, plan.recipe->dsq.a, true); !st) return st;
  GatherRows(plan.q_dsq, seq.q_begin + m0, h, mlen, w.qt.data());
  GemmAcc(dk_acc, d, tile.data(), 1, nlen, w.qt.data(), d, nlen, d, mlen);
  return Status::Ok();
}

// Writes one head's finished dK/dV rows of a key tile: dk = round(acc · scale), dv =
// round(acc). With GQA the per-head results are also added (fp32, head order) into `sum`.
void FinishKeyTile(BackwardPlan& plan, const Sequence& seq, int64_t g, int64_t n0, int64_t nlen,
                   const std::vector<float>& dk_acc, const std::vector<float>& dv_acc, bool gqa,
                   std::vector<float>& dk_sum, std::vector<float>& dv_sum) {
  const Problem& p = *plan.p;
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  for (int64_t j = 0; j < nlen; ++j) {
    for (int64_t c = 0; c < d; ++c) {
      const float x = RoundElement(dk_acc[j * d + c] * plan.sp.grad_scale, plan.grad_round[1]);
      if (gqa)
        dk_sum[j * d + c] += x;
      else
        plan.dk[((seq.k_begin + n0 + j) * p.heads_kv + g) * d + c] = x;
    }
    for (int64_t c = 0; c < dv; ++c) {
      const float x = RoundElement(dv_acc[j * dv + c], plan.grad_round[2]);
      if (gqa)
        dv_sum[j * dv + c] += x;
      else
        plan.dv[((seq.k_begin + n0 + j) * p.heads_kv + g) * dv + c] = x;
    }
  }
}

// One (sequence, kv head) of the backward: every query head of the group.
Status BackwardGroup(BackwardPlan& plan, int64_t b, int64_t g) {
  const Problem& p = *plan.p;
  const MaskView mask(p, b);
  const Sequence& seq = mask.sequence();
  const int64_t ratio = p.gqa_ratio(), d = p.head_dim, dv = p.head_dim_v;
  const int64_t bm = plan.opt->bwd_block_m, bn = plan.opt->bwd_block_n;
  const bool gqa = ratio > 1;
  const EngineHooks& hooks = HooksOf(*plan.opt);
  TileScratch w;
  std::vector<float> tile;
  std::vector<float> dq_acc(static_cast<size_t>(ratio * seq.q_len * d), 0.0f);
  std::vector<float> dk_acc, dv_acc, dk_sum, dv_sum;
  bool any = false;

  if (plan.fused) {
    // Pass 1: each query tile walks every key tile in ascending order; dQ stays in registers.
    for (int64_t r = 0; r < ratio; ++r) {
      const int64_t h = hooks.GroupHead(p, g, r);
      for (int64_t m0 = 0; m0 < seq.q_len; m0 += bm) {
        const int64_t mlen = std::min(bm, seq.q_len - m0);
        const auto [klo, khi] = KeyRangeOf(mask, m0, mlen);
        for (int64_t n0 = khi > klo ? klo / bn * bn : seq.k_len; n0 < khi; n0 += bn) {
          const int64_t nlen = std::min(bn, seq.k_len - n0);
          if (Status st = ComputeTile(plan, mask, b, h, m0, mlen, n0, nlen, w, &any); !st)
            return st;
          if (!any) continue;
          float* rows = dq_acc.data() + (r * seq.q_len + m0) * d;
          if (Status st = AccumulateDq(plan, seq, h, mlen, n0, nlen, w, tile, rows); !st) return st;
        }
      }
    }
  }
  // FA2: key tiles outer (ascending). Fused pass 2: the same walk, query tiles ascending.
  // A hook may start the walk at another key tile: dQ's fp32 chain then adds the tiles in
  // another order (dK, dV are per key tile and do not change).
  const int64_t key_tiles = (seq.k_len + bn - 1) / bn;
  const int64_t first_tile = key_tiles > 0 ? hooks.DqFirstKeyTile(key_tiles) : 0;
  const int64_t visited = hooks.BackwardKeyTiles(key_tiles);
  for (int64_t t = 0; t < visited; ++t) {
    const int64_t n0 = ((t + first_tile) % key_tiles) * bn;
    const int64_t nlen = std::min(bn, seq.k_len - n0);
    dk_sum.assign(static_cast<size_t>(nlen * d), 0.0f);
    dv_sum.assign(static_cast<size_t>(nlen * dv), 0.0f);
    const auto [qlo, qhi] = QueryRangeOf(mask, n0, nlen);
    for (int64_t r = 0; r < ratio; ++r) {
      const int64_t h = hooks.GroupHead(p, g, r);
      dk_acc.assign(static_cast<size_t>(nlen * d), 0.0f);
      dv_acc.assign(static_cast<size_t>(nlen * dv), 0.0f);
      if (qhi > qlo) {
        const int64_t first = qlo / bm, last = (qhi - 1) / bm;
        const int64_t count = last - first + 1;
        for (int64_t t = 0; t < count; ++t) {
          // flash_bwd_kernel.h walks m_block from the last to the first.
          const int64_t mb = plan.fused ? first + t : last - t;
          const int64_t m0 = mb * bm, mlen = std::min(bm, seq.q_len - m0);
          if (Status st = ComputeTile(plan, mask, b, h, m0, mlen, n0, nlen, w, &any); !st)
            return st;
          if (!any) continue;
          if (Status st = AccumulateDkDv(plan, seq, h, m0, mlen, nlen, w, tile, dk_acc.data(),
                                         dv_acc.data());
              !st) {
            return st;
          }
          if (!plan.drel.empty()) AccumulateRelBias(plan, b, h, m0, mlen, n0, nlen, w);
          hooks.StoreBackwardAccumulator(dk_acc.data(), static_cast<int64_t>(dk_acc.size()));
          hooks.StoreBackwardAccumulator(dv_acc.data(), static_cast<int64_t>(dv_acc.size()));
          if (!plan.fused) {
            float* rows = dq_acc.data() + (r * seq.q_len + m0) * d;
            if (Status st = AccumulateDq(plan, seq, h, mlen, n0, nlen, w, tile, rows); !st) {
              return st;
            }
          }
        }
      }
      FinishKeyTile(plan, seq, g, n0, nlen, dk_acc, dv_acc, gqa, dk_sum, dv_sum);
    }
    if (gqa) {
      // flash_api.cpp mha_bwd: at::sum_out over the group of the input-dtype dk_expanded. The
      // sum is PyTorch's, rounded to nearest whatever direction the kernel's own stores of
      // dk_expanded round in (Recipe::gradient_rounding).
      OperandScheme sum_dk = plan.grad_round[1], sum_dv = plan.grad_round[2];
      sum_dk.rounding = sum_dv.rounding = Rounding::kNearestEven;
      for (int64_t j = 0; j < nlen; ++j) {
        float* dkr = plan.dk.data() + ((seq.k_begin + n0 + j) * p.heads_kv + g) * d;
        float* dvr = plan.dv.data() + ((seq.k_begin + n0 + j) * p.heads_kv + g) * dv;
        for (int64_t c = 0; c < d; ++c) dkr[c] = RoundElement(dk_sum[j * d + c], sum_dk);
        for (int64_t c = 0; c < dv; ++c) dvr[c] = RoundElement(dv_sum[j * dv + c], sum_dv);
      }
    }
  }
  // dQ = round(acc · scale) (flash_bwd_convert_dq: dq_accum times scale_softmax).
  for (int64_t r = 0; r < ratio; ++r) {
    const int64_t h = hooks.GroupHead(p, g, r);
    for (int64_t i = 0; i < seq.q_len; ++i) {
      float* out = plan.dq.data() + ((seq.q_begin + i) * p.heads_q + h) * d;
      const float* acc = dq_acc.data() + (r * seq.q_len + i) * d;
      for (int64_t c = 0; c < d; ++c)
        out[c] = RoundElement(acc[c] * plan.sp.grad_scale, plan.grad_round[0]);
    }
  }
  return Status::Ok();
}

}  // namespace
}  // namespace engine_detail

using engine_detail::BackwardGroup;
using engine_detail::BackwardPlan;
using engine_detail::Floats;
using engine_detail::HooksOf;
using engine_detail::InputFloats;
using engine_detail::InputFormat;
using engine_detail::MakeOutput;
using engine_detail::MakeScoreParams;

namespace {

// dsink_h = -sum_i exp(sink_h - lse_i) D_i in fp32 over the rows of head h (sequences and
// rows ascending), from the lse the backward was given and its D (docs/semantics.md
// "Learnable sink"); 0 for a sink of -inf. Stored as F32.
Tensor Dsink(const BackwardPlan& plan, const Tensor& sink_tensor) {
  const Problem& p = *plan.p;
  const std::vector<float> sink = engine_detail::InputFloats(sink_tensor, DType::kF32);
  std::vector<float> out(static_cast<size_t>(p.heads_q), 0.0f);
  for (int64_t h = 0; h < p.heads_q; ++h) {
    const float sv = sink[static_cast<size_t>(h)];
    if (!(sv > -engine_detail::kInf)) continue;
    float acc = 0.0f;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence seq = SequenceOf(p, b);
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const float lse = plan.lse[static_cast<size_t>(engine_detail::LseIndex(p, b, h, i))];
        const float d = plan.delta[static_cast<size_t>((seq.q_begin + i) * p.heads_q + h)];
        acc -= std::exp(sv - lse) * d;
      }
    }
    out[static_cast<size_t>(h)] = acc;
  }
  return MakeOutput(p.SinkShape(), out, Format::kF32);
}

}  // namespace
using engine_detail::Operand;
using engine_detail::Prepare;
using engine_detail::RunItems;

KernelAnswer<BackwardResult> FlashBackward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& o,
                                           const Tensor& lse, const Tensor& dout,
                                           const EngineOptions& options) {
  if (Status s = Validate(p); !s) return s.error();
  if (Status s = ValidateInputShapes(p, q, k, v, &dout); !s) return s.error();
  if (o.shape() != p.OShape())
    return Error{"o: shape " + o.Describe() + " does not match the problem"};
  if (lse.shape() != p.LseShape()) {
    return Error{"lse: shape " + lse.Describe() + " does not match the problem"};
  }
  if (HasLogicalView(p)) {
    return engine_detail::PagedBackward(p, recipe, q, k, v, o, lse, dout, options);
  }
  if (std::string why = EngineUnsupportedReason(p, recipe, options); !why.empty()) {
    return Unsupported{why};
  }
  if (recipe.delta == DeltaSource::kFp32O) {
    return Unsupported{"recipe " + std::string(recipe.name) +
                       ": D from the fp32 O needs the forward's accumulator, which the Kernel "
                       "interface does not carry"};
  }
  BackwardPlan plan;
  plan.p = &p;
  plan.recipe = &recipe;
  plan.opt = &options;
  plan.sp = MakeScoreParams(p, options.rel_bias);
  for (int i = 0; i < 3; ++i) {
    plan.grad_round[static_cast<size_t>(i)] = GradientRoundingOf(recipe, InputFormat(p), i);
  }
  // Scaled roundings' values are not the format's (E4M3 / 2^k): kept as fp32.
  plan.grad_format = recipe.gradient_scales == std::array<double, 3>{1.0, 1.0, 1.0}
                         ? recipe.gradients.value_or(InputFormat(p))
                         : Format::kF32;
  plan.fused = options.backward == BackwardVariant::kFusedNoAtomics;
  plan.dp_format = BackwardDpFormat(recipe, options);
  const Operand raw_q{InputFloats(q, p.dtype), p.heads_q, p.head_dim};
  const Operand raw_k{InputFloats(k, p.dtype), p.heads_kv, p.head_dim};
  const Operand raw_v{InputFloats(v, p.dtype), p.heads_kv, p.head_dim_v};
  const Operand raw_do{InputFloats(dout, p.dtype), p.heads_q, p.head_dim_v};
  struct Role {
    Operand* out;
    const Operand* raw;
    const OperandQuant* quant;
  };
  const Role roles[] = {
      {&plan.q_qk, &raw_q, &recipe.qk.a},     {&plan.k_qk, &raw_k, &recipe.qk.b},
      {&plan.do_dov, &raw_do, &recipe.dov.a}, {&plan.v_dov, &raw_v, &recipe.dov.b},
      {&plan.do_pdo, &raw_do, &recipe.pdo.b}, {&plan.k_dsk, &raw_k, &recipe.dsk.b},
      {&plan.q_dsq, &raw_q, &recipe.dsq.b},
  };
  for (const Role& role : roles) {
    Expected<Operand> prepared = Prepare(p, *role.raw, *role.quant, HooksOf(options));
    if (!prepared.ok()) return prepared.error();
    *role.out = std::move(*prepared);
  }
  plan.lse = Floats(lse);
  // D = rowsum(dO ∘ O) in fp32 from the stored O (flash_bwd_preprocess_kernel.h dot_do_o),
  // with dO as given or as dO·Vᵀ reads it (recipe.h DeltaDo).
  {
    const std::vector<float> of = Floats(o);
    const std::vector<float>& dof =
        recipe.delta_do == DeltaDo::kDovOperand ? plan.do_dov.values : raw_do.values;
    const int64_t rows = p.TotalQ() * p.heads_q, dv = p.head_dim_v;
    plan.delta.assign(static_cast<size_t>(rows), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t c = 0; c < dv; ++c) acc += dof[r * dv + c] * of[r * dv + c];
      plan.delta[static_cast<size_t>(r)] = acc;
    }
  }
  plan.dq.assign(raw_q.values.size(), 0.0f);
  if (options.rel_bias != nullptr) {
    plan.drel.assign(static_cast<size_t>(p.batch * p.heads_q * plan.sp.rel_width), 0.0f);
  }
  plan.dk.assign(raw_k.values.size(), 0.0f);
  plan.dv.assign(raw_v.values.size(), 0.0f);
  if (Status s =
          RunItems(p.batch * p.heads_kv, options.threads,
                   [&](int64_t i) { return BackwardGroup(plan, i / p.heads_kv, i % p.heads_kv); });
      !s) {
    return s.error();
  }
  BackwardResult out;
  out.dq = MakeOutput(p.QShape(), plan.dq, plan.grad_format);
  out.dk = MakeOutput(p.KShape(), plan.dk, plan.grad_format);
  out.dv = MakeOutput(p.VShape(), plan.dv, plan.grad_format);
  if (options.sink != nullptr) out.dsink = Dsink(plan, *options.sink);
  if (options.rel_bias != nullptr) {
    // Over the batch, ascending, in fp32.
    const int64_t n = p.heads_q * plan.sp.rel_width;
    std::vector<float> drel(static_cast<size_t>(n), 0.0f);
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t e = 0; e < n; ++e) drel[e] += plan.drel[static_cast<size_t>(b * n + e)];
    }
    out.drel_bias = MakeOutput(p.RelBiasShape(), drel, Format::kF32);
  }
  return out;
}

}  // namespace attest
