// The tiled FlashAttention-2-style engine (see flash_engine.h; arXiv 2307.08691 Algorithms 1
// and 2; flash-attention csrc/flash_attn/src/flash_fwd_kernel.h, flash_bwd_kernel.h,
// softmax.h, mask.h, alibi.h and csrc/flash_attn/flash_api.cpp for the scale parameters).
#include "kernels/models/flash_engine.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <mutex>
#include <numbers>
#include <thread>
#include <vector>

#include "reference/formats/format.h"
#include "reference/formats/mx.h"
#include "reference/problem/mask.h"

namespace attest {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- Small dense kernels --------------------------------------------------------------------

// C[i, j] += Σ_p A(i, p) · B[p, j] for p ascending (one sequential fp32 chain per element),
// with A(i, p) = A[i·a_row + p·a_col]. The inner loop runs over j, so it vectorises without
// reassociating any sum; the AVX2 clone computes the same bits as the baseline (separate
// multiply and add in both, -ffp-contract=off).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
void GemmAcc(float* __restrict c, int64_t ldc, const float* __restrict a, int64_t a_row,
             int64_t a_col, const float* __restrict b, int64_t ldb, int64_t m, int64_t n,
             int64_t kdim) {
  for (int64_t i = 0; i < m; ++i) {
    float* __restrict ci = c + i * ldc;
    const float* ai = a + i * a_row;
    int64_t p = 0;
    // Four steps of the chain per pass over the row (the same additions in the same order,
    // one load/store of C instead of four).
    for (; p + 4 <= kdim; p += 4) {
      const float a0 = ai[p * a_col], a1 = ai[(p + 1) * a_col];
      const float a2 = ai[(p + 2) * a_col], a3 = ai[(p + 3) * a_col];
      const float* __restrict b0 = b + p * ldb;
      const float* __restrict b1 = b0 + ldb;
      const float* __restrict b2 = b1 + ldb;
      const float* __restrict b3 = b2 + ldb;
      for (int64_t j = 0; j < n; ++j) {
        float x = ci[j];
        x += a0 * b0[j];
        x += a1 * b1[j];
        x += a2 * b2[j];
        x += a3 * b3[j];
        ci[j] = x;
      }
    }
    for (; p < kdim; ++p) {
      const float av = ai[p * a_col];
      const float* __restrict bp = b + p * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

// Calls fn(item) for item in [0, n) on `threads` workers. Items write disjoint outputs, so
// the result does not depend on the number of workers or on the schedule.
template <class Fn>
void ParallelFor(int64_t n, int threads, Fn&& fn) {
  int64_t t = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  t = std::min(t, n);
  if (t <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < t; ++w) {
    pool.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

// ---- Operands ---------------------------------------------------------------------------------

// A [tokens, heads, width] fp32 operand (padded [B, S, H, W] has the same memory order).
struct Operand {
  std::vector<float> values;
  int64_t heads = 0;
  int64_t width = 0;
  const float* Row(int64_t token, int64_t head) const {
    return values.data() + (token * heads + head) * width;
  }
};

// The tensor's values rounded to the problem's dtype, as floats. Values that are floats take
// the fast rounding (one rounding either way); others go through RoundTo from double.
std::vector<float> InputFloats(const Tensor& t, DType dtype) {
  const Format f = FormatOf(dtype).value_or(Format::kF32);
  const Tensor wide = t.dtype() == DType::kF64 && t.contiguous() ? t : ToF64(t);
  std::span<const double> d = wide.span<const double>();
  std::vector<float> out(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    const float x = static_cast<float>(d[i]);
    out[i] =
        static_cast<double>(x) == d[i] ? RoundElement(x, f) : static_cast<float>(RoundTo(d[i], f));
  }
  return out;
}

std::vector<float> Floats(const Tensor& t) {
  const Tensor wide = ToF64(t);
  std::span<const double> d = wide.span<const double>();
  return std::vector<float>(d.begin(), d.end());
}

// ---- Seeded faults on block-scaled operands (EngineFaults; mutant catalogue) --------------------

// Calls fn(first_element, stride, count) for every block of a row-major tensor of `shape` cut
// into 1-D blocks of `block` elements along `axis` (block 0: the whole tensor is one block).
template <class Fn>
void ForEachAxisBlock(const Shape& shape, int64_t axis, int64_t block, Fn&& fn) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t len = shape[static_cast<size_t>(axis)];
  if (block <= 0) {
    fn(int64_t{0}, int64_t{1}, outer * len * inner);
    return;
  }
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      for (int64_t a0 = 0; a0 < len; a0 += block) {
        fn((o * len + a0) * inner + in, inner, std::min(block, len - a0));
      }
    }
  }
}

// The block length of `scheme` along its axis (the registry row's, unless the options set one).
int64_t SchemeBlock(const OperandScheme& scheme) {
  const Scheme* row = FindScheme(scheme.block);
  return scheme.block_options.block_size.value_or(row ? row->block_cols : 0);
}

// MX with the E8M0 scale exponent moved by `offset` (vllm PR #43557: an MXFP4 scale from
// exponent(amax / 6) off by one): elements x · 2^(127 − scale') rounded and saturated as
// QuantizeMx does, so that offset 0 reproduces it.
std::vector<float> MxWithScaleOffset(std::span<const float> values, const Shape& shape,
                                     int64_t axis, const OperandScheme& scheme, int offset) {
  const Scheme* row = FindScheme(scheme.block);
  const Format element = row ? row->element : Format::kE4M3FN;
  const ScaleMode mode =
      scheme.block_options.scale_mode.value_or(row ? row->default_scale_mode : ScaleMode::kFloor);
  EncodeOptions saturate;
  saturate.overflow = Overflow::kSaturate;
  std::vector<float> out(values.begin(), values.end());
  ForEachAxisBlock(shape, axis, SchemeBlock(scheme), [&](int64_t e0, int64_t stride, int64_t n) {
    float amax = 0;
    for (int64_t t = 0; t < n; ++t) amax = std::max(amax, std::fabs(values[e0 + t * stride]));
    int code = MxScaleCode(amax, element, mode);
    if (code != 0xFF) code = std::clamp(code + offset, 0, 0xFE);
    const double factor = std::ldexp(1.0, 127 - code);
    for (int64_t t = 0; t < n; ++t) {
      const size_t i = static_cast<size_t>(e0 + t * stride);
      out[i] = static_cast<float>(RoundTo(values[i] * factor, element, saturate) / factor);
    }
  });
  return out;
}

// A block whose amax is 0 dequantised through scale = amax / max and x / scale: 0/0 = NaN
// (ROCm/aiter #4289, a per-channel V scale of 0).
void ZeroAmaxBlocksToNan(std::vector<float>& q, std::span<const float> values, const Shape& shape,
                         int64_t axis, const OperandScheme& scheme) {
  ForEachAxisBlock(shape, axis, SchemeBlock(scheme), [&](int64_t e0, int64_t stride, int64_t n) {
    float amax = 0;
    for (int64_t t = 0; t < n; ++t) amax = std::max(amax, std::fabs(values[e0 + t * stride]));
    if (amax != 0) return;
    for (int64_t t = 0; t < n; ++t) {
      q[static_cast<size_t>(e0 + t * stride)] = std::numeric_limits<float>::quiet_NaN();
    }
  });
}

// `raw` represented as the GEMM operand `quant` says. Blocks along the sequence run over the
// whole sequence axis of the full tensor ([B, S, H, W] axis 1, or packed [total, H, W] axis
// 0), exactly like a kernel that quantises the operand before its tiled loop.
Expected<Operand> Prepare(const Problem& p, const Operand& raw, const OperandQuant& quant,
                          const EngineFaults& faults) {
  if (quant.scheme.kind == OperandKind::kNone) return raw;
  Shape shape;
  int64_t axis = 0;
  if (p.varlen()) {
    shape = {static_cast<int64_t>(raw.values.size()) / (raw.heads * raw.width), raw.heads,
             raw.width};
    axis = quant.axis == QuantAxis::kSequence ? 0 : 2;
  } else {
    shape = {p.batch, static_cast<int64_t>(raw.values.size()) / (p.batch * raw.heads * raw.width),
             raw.heads, raw.width};
    axis = quant.axis == QuantAxis::kSequence ? 1 : 3;
  }
  const bool mx = quant.scheme.kind == OperandKind::kBlock && FindScheme(quant.scheme.block) &&
                  FindScheme(quant.scheme.block)->kind == SchemeKind::kMx;
  if (mx && faults.mx_scale_offset != 0) {
    return Operand{MxWithScaleOffset(raw.values, shape, axis, quant.scheme, faults.mx_scale_offset),
                   raw.heads, raw.width};
  }
  Expected<std::vector<float>> q = QuantizeOperand(raw.values, shape, axis, quant.scheme);
  if (!q.ok()) return q.error();
  if (faults.zero_amax_block_nan && quant.scheme.kind == OperandKind::kBlock) {
    ZeroAmaxBlocksToNan(*q, raw.values, shape, axis, quant.scheme);
  }
  return Operand{std::move(*q), raw.heads, raw.width};
}

// An intermediate tile (P or dS, [rows, cols] row-major) represented as `quant` says. Such a
// tile exists only inside the kernel, so its blocks are per tile: along the keys (axis 1) for
// a GEMM that contracts over keys, along the queries (axis 0) for one that contracts over
// queries (`contract_rows`).
Status RoundTile(std::vector<float>& tile, int64_t rows, int64_t cols, const OperandQuant& quant,
                 bool contract_rows) {
  switch (quant.scheme.kind) {
    case OperandKind::kNone:
      return Status::Ok();
    case OperandKind::kElement:
      if (quant.scheme.pre_scale == 1.0 && quant.scheme.overflow == Overflow::kDefault) {
        const Format f = quant.scheme.element;
        for (int64_t i = 0; i < rows * cols; ++i) tile[i] = RoundElement(tile[i], f);
      } else {
        for (int64_t i = 0; i < rows * cols; ++i) tile[i] = RoundElement(tile[i], quant.scheme);
      }
      return Status::Ok();
    case OperandKind::kBlock: {
      const int64_t axis = quant.axis == QuantAxis::kHeadDim ? 1 : (contract_rows ? 0 : 1);
      Expected<std::vector<float>> q =
          QuantizeOperand(std::span<const float>(tile.data(), static_cast<size_t>(rows * cols)),
                          {rows, cols}, axis, quant.scheme);
      if (!q.ok()) return q.error();
      std::copy(q->begin(), q->end(), tile.begin());
      return Status::Ok();
    }
  }
  return Status::Ok();
}

// Copies rows [r0, r0 + n) of one head into a contiguous [n, width] tile.
void GatherRows(const Operand& op, int64_t token0, int64_t head, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* src = op.Row(token0 + r, head);
    std::copy(src, src + op.width, out + r * op.width);
  }
}

// The same rows transposed: out[w, r] ([width, n]).
void GatherRowsTransposed(const Operand& op, int64_t token0, int64_t head, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* src = op.Row(token0 + r, head);
    for (int64_t w = 0; w < op.width; ++w) out[w * n + r] = src[w];
  }
}

// ---- Softmax parameters (flash_api.cpp set_params_fprop) --------------------------------------

struct ScoreParams {
  float scale_softmax = 1;   // multiplies the row max in lse; softcap: the cap
  float scale_log2 = 1;      // scale_softmax · log2(e), rounded once to float
  float softcap_in = 0;      // softcap: softmax_scale / cap (the tanh argument's factor)
  float grad_scale = 1;      // the softmax scale, applied to dQ and dK at the end
  std::vector<float> alibi;  // per query head: slope / scale_softmax (flash_fwd_kernel.h)
  bool s_tanh_s = false;     // fault: softcap as s · tanh(s)
};

ScoreParams MakeScoreParams(const Problem& p) {
  ScoreParams s;
  const float softmax_scale = static_cast<float>(p.EffectiveScale());
  s.grad_scale = softmax_scale;
  if (p.softcap > 0) {
    const float cap = static_cast<float>(p.softcap);
    s.softcap_in = softmax_scale / cap;
    s.scale_softmax = cap;
    s.scale_log2 = static_cast<float>(static_cast<double>(cap) * std::numbers::log2e);
  } else {
    s.scale_softmax = softmax_scale;
    s.scale_log2 = static_cast<float>(static_cast<double>(softmax_scale) * std::numbers::log2e);
  }
  if (p.alibi_slopes) {
    for (double slope : *p.alibi_slopes) {
      s.alibi.push_back(static_cast<float>(slope) / s.scale_softmax);
    }
  }
  return s;
}

// The kv head query head h reads, and the r-th query head of kv head g's group: h / ratio and
// g · ratio + r, or under the gqa_head_mod fault h % Hkv and r · Hkv + g.
int64_t KvHeadOf(const Problem& p, const EngineFaults& f, int64_t h) {
  return f.gqa_head_mod ? h % p.heads_kv : p.KvHead(h);
}
int64_t GroupHead(const Problem& p, const EngineFaults& f, int64_t g, int64_t r) {
  return f.gqa_head_mod ? r * p.heads_kv + g : g * p.gqa_ratio() + r;
}

// Visibility of a [m0, m0 + mlen) × [n0, n0 + nlen) tile; returns the visible count.
int64_t TileMask(const MaskView& mask, int64_t m0, int64_t mlen, int64_t n0, int64_t nlen,
                 std::vector<uint8_t>& vis) {
  vis.assign(static_cast<size_t>(mlen * nlen), 0);
  int64_t count = 0;
  for (int64_t i = 0; i < mlen; ++i) {
    const auto [lo, hi] = mask.KeyBounds(m0 + i);
    const int64_t jlo = std::max(lo, n0), jhi = std::min(hi, n0 + nlen);
    for (int64_t j = jlo; j < jhi; ++j) {
      if (mask.interval_only() || mask.Visible(m0 + i, j)) {
        vis[static_cast<size_t>(i * nlen + j - n0)] = 1;
        ++count;
      }
    }
  }
  return count;
}

// Scores of a tile in place: raw q·k → softcap → ALiBi → mask (-inf). `tanh_out` receives
// tanh values for the softcap derivative (backward).
void TransformScores(const ScoreParams& sp, const MaskView& mask, int64_t head, int64_t m0,
                     int64_t mlen, int64_t n0, int64_t nlen, const std::vector<uint8_t>& vis,
                     std::vector<float>& s, std::vector<float>* tanh_out) {
  const bool softcap = sp.softcap_in != 0;
  const float slope = sp.alibi.empty() ? 0.0f : sp.alibi[static_cast<size_t>(head)];
  for (int64_t i = 0; i < mlen; ++i) {
    for (int64_t j = 0; j < nlen; ++j) {
      const size_t e = static_cast<size_t>(i * nlen + j);
      float x = s[e];
      if (softcap && sp.s_tanh_s) {
        // Fault (flash-attention PR #2402): the score t = scale · q·k becomes t · tanh(t),
        // divided by the cap that scale_softmax_log2 multiplies in later.
        const float t = x * sp.grad_scale;
        const float th = std::tanh(t);
        x = t * th / sp.scale_softmax;
        if (tanh_out) (*tanh_out)[e] = th;
      } else if (softcap) {
        // flash::apply_softcap: tanh(x · softmax_scale / cap); the cap multiplies later,
        // folded into scale_softmax_log2.
        x = std::tanh(x * sp.softcap_in);
        if (tanh_out) (*tanh_out)[e] = x;
      }
      if (slope != 0) {
        // alibi.h: s -= slope · |i + Sk − Sq − j| (one FFMA on the GPU).
        x = FmaF32(-slope, static_cast<float>(mask.AlibiDistance(m0 + i, n0 + j)), x);
      }
      s[e] = vis[e] ? x : -kInf;
    }
  }
}

// ---- Forward ----------------------------------------------------------------------------------

struct ForwardPlan {
  const Problem* p;
  const Recipe* recipe;
  const EngineOptions* opt;
  ScoreParams sp;
  Operand q, k, v;  // as the recipe represents them for Q·Kᵀ (q, k) and P·V (v)
  Format out_format;
  std::vector<float> o;    // [total_q, Hq, Dv], rounded to out_format
  std::vector<float> lse;  // lse layout
};

int64_t LseIndex(const Problem& p, int64_t b, int64_t h, int64_t i) {
  if (p.varlen()) return h * p.TotalQ() + SequenceOf(p, b).q_begin + i;
  return (b * p.heads_q + h) * p.seqlen_q + i;
}

// Online-softmax state of a query tile: fp32 O accumulator, row max and row sum.
struct RowState {
  std::vector<float> acc, row_max, row_sum;
  RowState(int64_t mlen, int64_t dv)
      : acc(static_cast<size_t>(mlen * dv), 0.0f),
        row_max(static_cast<size_t>(mlen), -kInf),
        row_sum(static_cast<size_t>(mlen), 0.0f) {}
};

// One query tile of one head (flash_fwd_kernel.h compute_attn_1rowblock).
Status ForwardRowBlock(ForwardPlan& plan, int64_t b, int64_t h, int64_t m0) {
  const Problem& p = *plan.p;
  const EngineFaults& faults = plan.opt->faults;
  const MaskView mask(p, b);
  const Sequence& seq = mask.sequence();
  const int64_t bm = plan.opt->fwd_block_m, bn = plan.opt->fwd_block_n;
  const int64_t mlen = std::min(bm, seq.q_len - m0);
  const int64_t d = p.head_dim, dv = p.head_dim_v, hk = KvHeadOf(p, faults, h);

  std::vector<float> qt(static_cast<size_t>(mlen * d));
  GatherRows(plan.q, seq.q_begin + m0, h, mlen, qt.data());
  std::vector<float> kt(static_cast<size_t>(d * bn)), vt(static_cast<size_t>(bn * dv));
  std::vector<float> s(static_cast<size_t>(mlen * bn));
  std::vector<uint8_t> vis;

  // Key tiles that can hold a visible key for some row of this tile (n_block_min/max):
  // nb from `top` down to `bottom` (empty when top < bottom).
  int64_t lo = seq.k_len, hi = 0;
  for (int64_t i = m0; i < m0 + mlen; ++i) {
    const auto [l, r] = mask.KeyBounds(i);
    if (l < r) lo = std::min(lo, l), hi = std::max(hi, r);
  }
  const int64_t top = hi > lo ? (hi - 1) / bn : -1;
  const int64_t bottom = hi > lo ? lo / bn : 0;

  // flash_fwd_kernel.h iterates the key blocks in reverse order (last block first).
  auto run_tiles = [&](int64_t nb_top, int64_t nb_bottom, RowState& st) -> Status {
    for (int64_t nb = nb_top; nb >= nb_bottom; --nb) {
      const int64_t n0 = nb * bn, nlen = std::min(bn, seq.k_len - n0);
      if (TileMask(mask, m0, mlen, n0, nlen, vis) == 0) continue;  // skipped exactly, no effect
      GatherRowsTransposed(plan.k, seq.k_begin + n0, hk, nlen, kt.data());
      GatherRows(plan.v, seq.k_begin + n0, hk, nlen, vt.data());
      std::fill(s.begin(), s.begin() + mlen * nlen, 0.0f);
      GemmAcc(s.data(), nlen, qt.data(), d, 1, kt.data(), nlen, mlen, nlen, d);
      TransformScores(plan.sp, mask, h, m0, mlen, n0, nlen, vis, s, nullptr);
      // softmax.h softmax_rescale_o: new max, rescale row_sum and acc_o, then exp2 with the
      // scale folded in: p = exp2(s · scale_log2 − max · scale_log2).
      for (int64_t i = 0; i < mlen; ++i) {
        float* si = s.data() + i * nlen;
        float m_new = st.row_max[i];
        for (int64_t j = 0; j < nlen; ++j) m_new = std::max(m_new, si[j]);
        if (faults.rescale_threshold_log2 > 0 && st.row_max[i] != -kInf &&
            (m_new - st.row_max[i]) * plan.sp.scale_log2 <= faults.rescale_threshold_log2) {
          // Fault (flash-attention #2577): a lazy rescale keeps the stale max unless the
          // new one exceeds it by more than the threshold, so P grows up to 2^threshold.
          m_new = st.row_max[i];
        }
        const float m_cur = m_new == -kInf ? 0.0f : m_new;  // Check_inf
        const float rescale = std::exp2((st.row_max[i] - m_cur) * plan.sp.scale_log2);
        st.row_max[i] = m_new;
        st.row_sum[i] *= rescale;
        for (int64_t c = 0; c < dv; ++c) st.acc[i * dv + c] *= rescale;
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

  RowState st(mlen, dv);
  // Fault split_kv_bad_combine: the keys in two splits (upper and lower half of the tiles),
  // each with its own softmax state, as flash-decoding's split-KV path computes them.
  const bool split = faults.split_kv_bad_combine && top > bottom;
  const int64_t mid = split ? bottom + (top - bottom + 1) / 2 : bottom;
  if (Status r = run_tiles(top, mid, st); !r) return r;
  RowState st2(split ? mlen : 0, dv);
  if (split) {
    if (Status r = run_tiles(mid - 1, bottom, st2); !r) return r;
  }

  // softmax.h normalize_softmax_lse: o = acc · (1 / sum); lse = max · scale + log(sum).
  const float log2e = static_cast<float>(std::numbers::log2e);
  for (int64_t i = 0; i < mlen; ++i) {
    const float sum = st.row_sum[i];
    const bool empty = sum == 0 || sum != sum;
    const float inv = empty ? 1.0f : 1.0f / sum;
    float* out = plan.o.data() + ((seq.q_begin + m0 + i) * p.heads_q + h) * dv;
    float& lse = plan.lse[static_cast<size_t>(LseIndex(p, b, h, m0 + i))];
    // Fault store_swap_columns: d-columns 0 and 1 exchanged on the store (the row keeps its
    // norm; flash-attention PR #2553: norm-only comparisons missed such a permutation).
    auto col = [&](int64_t c) {
      return !faults.store_swap_columns || dv < 2 || c > 1 ? c : 1 - c;
    };
    if (split) {
      // Fault: the partial results o_s = acc_s / l_s are combined with weights l_s / Σ l
      // instead of exp(lse_s − lse): the partial maxima are never reconciled (the combine
      // step of flash-attention #1647-class split-KV bugs). The lse itself is combined right.
      const float sum2 = st2.row_sum[i];
      const bool empty1 = empty, empty2 = sum2 == 0 || sum2 != sum2;
      if (empty1 && empty2) {
        for (int64_t c = 0; c < dv; ++c) out[col(c)] = 0.0f;
        lse = -kInf;
        continue;
      }
      const float lse1 =
          empty1 ? -kInf : FmaF32(st.row_max[i], plan.sp.scale_softmax, std::log(sum));
      const float lse2 =
          empty2 ? -kInf : FmaF32(st2.row_max[i], plan.sp.scale_softmax, std::log(sum2));
      const float lmax = std::max(lse1, lse2);
      lse = lmax + std::log(std::exp(lse1 - lmax) + std::exp(lse2 - lmax));
      const float w1 = empty1 ? 0.0f : sum / (sum + (empty2 ? 0.0f : sum2));
      const float w2 = empty2 ? 0.0f : sum2 / ((empty1 ? 0.0f : sum) + sum2);
      for (int64_t c = 0; c < dv; ++c) {
        const float o1 = empty1 ? 0.0f : st.acc[i * dv + c] / sum;
        const float o2 = empty2 ? 0.0f : st2.acc[i * dv + c] / sum2;
        out[col(c)] = RoundElement(w1 * o1 + w2 * o2, plan.out_format);
      }
      continue;
    }
    if (empty && faults.empty_row_nan) {
      // Fault: no empty-row guard; 0 · (1 / 0) = NaN, lse = −inf · scale + log(0).
      const float bad_inv = 1.0f / sum;
      for (int64_t c = 0; c < dv; ++c) {
        out[col(c)] = RoundElement(st.acc[i * dv + c] * bad_inv, plan.out_format);
      }
      lse = st.row_max[i] * plan.sp.scale_softmax + std::log(sum);
      continue;
    }
    for (int64_t c = 0; c < dv; ++c) {
      out[col(c)] = empty ? 0.0f : RoundElement(st.acc[i * dv + c] * inv, plan.out_format);
    }
    if (empty) {
      lse = -kInf;
    } else if (faults.lse_scaled_twice) {
      // Fault (pytorch #181645 class): the max, already scaled, is scaled again.
      lse = FmaF32(st.row_max[i] * plan.sp.scale_softmax, plan.sp.scale_softmax, std::log(sum));
    } else {
      lse = FmaF32(st.row_max[i], plan.sp.scale_softmax, std::log(sum));
      // Fault: the kernel's internal base-2 lse returned without converting back to base e.
      if (faults.lse_log2) lse *= log2e;
    }
  }
  return Status::Ok();
}

// ---- Backward ---------------------------------------------------------------------------------

struct BackwardPlan {
  const Problem* p;
  const Recipe* recipe;
  const EngineOptions* opt;
  ScoreParams sp;
  Format grad_format;
  bool fused;
  std::optional<Format> dp_format;  // BackwardDpFormat(recipe, options)
  // Operands per GEMM, as the recipe represents them.
  Operand q_qk, k_qk, do_dov, v_dov, do_pdo, k_dsk, q_dsq;
  std::vector<float> lse;    // lse layout
  std::vector<float> delta;  // [total_q, Hq]
  std::vector<float> dq, dk, dv;
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
  const EngineFaults& faults = plan.opt->faults;
  const int64_t d = p.head_dim, dv = p.head_dim_v, hk = KvHeadOf(p, faults, h);
  const int64_t visible = TileMask(mask, m0, mlen, n0, nlen, w.vis);
  *any = visible > 0;
  if (!*any) return Status::Ok();
  if (faults.bwd_diag_tile_unmasked && visible < mlen * nlen) {
    // Fault (flash-attention #443 class): the tile that straddles the bound is computed as
    // if it were fully visible (the backward's mask step skipped for it).
    std::fill(w.vis.begin(), w.vis.end(), uint8_t{1});
  }
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
  TransformScores(plan.sp, mask, h, m0, mlen, n0, nlen, w.vis, w.s, &w.t);
  // P recomputed from lse (flash_bwd_kernel.h: scale_apply_exp2 with max = lse, scaled by
  // log2(e)); rows with a non-finite lse (-inf, or +inf as FA2 writes) are empty: P = 0.
  const float log2e = static_cast<float>(std::numbers::log2e);
  for (int64_t i = 0; i < mlen; ++i) {
    const float lse = plan.lse[static_cast<size_t>(LseIndex(p, b, h, m0 + i))];
    // Fault lse_log2: the lse is already in base 2 (the forward returned it so).
    const float lse_scaled = faults.lse_log2 ? lse : lse * log2e;
    for (int64_t j = 0; j < nlen; ++j) {
      const size_t e = static_cast<size_t>(i * nlen + j);
      if (faults.masked_ds_nan) {
        // Fault (facebookexperimental/triton PR #3395 class): no guard for masked entries
        // and empty rows: exp2(−inf − (−inf)) = NaN in an empty row, then fed onwards.
        w.s[e] = std::exp2(FmaF32(w.s[e], plan.sp.scale_log2, -lse_scaled));
        continue;
      }
      w.s[e] = (!std::isfinite(lse) || !w.vis[e])
                   ? 0.0f
                   : std::exp2(FmaF32(w.s[e], plan.sp.scale_log2, -lse_scaled));
    }
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
  const bool softcap = plan.sp.softcap_in != 0;
  for (int64_t i = 0; i < mlen; ++i) {
    const float di = plan.delta[static_cast<size_t>((seq.q_begin + m0 + i) * p.heads_q + h)];
    for (int64_t j = 0; j < nlen; ++j) {
      const size_t e = static_cast<size_t>(i * nlen + j);
      float x = w.s[e] * (w.dp[e] - di);
      // Fault softcap_no_bwd_derivative (flash-attention PR #2402): tanh' left out.
      if (softcap && !faults.softcap_no_bwd_derivative) x *= 1.0f - w.t[e] * w.t[e];
      w.ds[e] = x;
    }
  }
  return Status::Ok();
}

// dQ(rows of the query tile) += round(dS) · K, fp32, continuing the row's chain.
Status AccumulateDq(BackwardPlan& plan, const Sequence& seq, int64_t h, int64_t mlen, int64_t n0,
                    int64_t nlen, TileScratch& w, std::vector<float>& tile, float* dq_rows) {
  const int64_t d = plan.p->head_dim;
  tile.assign(w.ds.begin(), w.ds.end());
  if (Status st = RoundTile(tile, mlen, nlen, plan.recipe->dsk.a, false); !st) return st;
  w.kt.resize(static_cast<size_t>(nlen * d));  // reused as K rows [nlen, d]
  GatherRows(plan.k_dsk, seq.k_begin + n0, KvHeadOf(*plan.p, plan.opt->faults, h), nlen,
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

// [lo, hi) of queries that may see some key of [n0, n0 + nlen), and of keys for a query tile.
std::pair<int64_t, int64_t> QueryRange(const MaskView& mask, int64_t n0, int64_t nlen) {
  int64_t lo = mask.q_len(), hi = 0;
  for (int64_t j = n0; j < n0 + nlen; ++j) {
    const auto [l, r] = mask.QueryBounds(j);
    if (l < r) lo = std::min(lo, l), hi = std::max(hi, r);
  }
  return {lo, hi};
}
std::pair<int64_t, int64_t> KeyRange(const MaskView& mask, int64_t m0, int64_t mlen) {
  int64_t lo = mask.k_len(), hi = 0;
  for (int64_t i = m0; i < m0 + mlen; ++i) {
    const auto [l, r] = mask.KeyBounds(i);
    if (l < r) lo = std::min(lo, l), hi = std::max(hi, r);
  }
  return {lo, hi};
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
      const float x = RoundElement(dk_acc[j * d + c] * plan.sp.grad_scale, plan.grad_format);
      if (gqa)
        dk_sum[j * d + c] += x;
      else
        plan.dk[((seq.k_begin + n0 + j) * p.heads_kv + g) * d + c] = x;
    }
    for (int64_t c = 0; c < dv; ++c) {
      const float x = RoundElement(dv_acc[j * dv + c], plan.grad_format);
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
  TileScratch w;
  std::vector<float> tile;
  std::vector<float> dq_acc(static_cast<size_t>(ratio * seq.q_len * d), 0.0f);
  std::vector<float> dk_acc, dv_acc, dk_sum, dv_sum;
  bool any = false;

  if (plan.fused) {
    // Pass 1: each query tile walks every key tile in ascending order; dQ stays in registers.
    for (int64_t r = 0; r < ratio; ++r) {
      const int64_t h = GroupHead(p, plan.opt->faults, g, r);
      for (int64_t m0 = 0; m0 < seq.q_len; m0 += bm) {
        const int64_t mlen = std::min(bm, seq.q_len - m0);
        const auto [klo, khi] = KeyRange(mask, m0, mlen);
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
  // Fault dq_order_rotation (flash-attention #2244 class): the walk starts at another key
  // tile, so dQ's fp32 chain adds the tiles in another order (dK, dV are per key tile).
  const int64_t key_tiles = (seq.k_len + bn - 1) / bn;
  for (int64_t t = 0; t < key_tiles; ++t) {
    const int64_t rot = static_cast<int64_t>(plan.opt->faults.dq_order_rotation %
                                             static_cast<uint64_t>(key_tiles));
    const int64_t n0 = ((t + rot) % key_tiles) * bn;
    const int64_t nlen = std::min(bn, seq.k_len - n0);
    dk_sum.assign(static_cast<size_t>(nlen * d), 0.0f);
    dv_sum.assign(static_cast<size_t>(nlen * dv), 0.0f);
    const auto [qlo, qhi] = QueryRange(mask, n0, nlen);
    for (int64_t r = 0; r < ratio; ++r) {
      const int64_t h = GroupHead(p, plan.opt->faults, g, r);
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
      // flash_api.cpp mha_bwd: at::sum_out over the group of the input-dtype dk_expanded.
      for (int64_t j = 0; j < nlen; ++j) {
        float* dkr = plan.dk.data() + ((seq.k_begin + n0 + j) * p.heads_kv + g) * d;
        float* dvr = plan.dv.data() + ((seq.k_begin + n0 + j) * p.heads_kv + g) * dv;
        for (int64_t c = 0; c < d; ++c) dkr[c] = RoundElement(dk_sum[j * d + c], plan.grad_format);
        for (int64_t c = 0; c < dv; ++c)
          dvr[c] = RoundElement(dv_sum[j * dv + c], plan.grad_format);
      }
    }
  }
  // dQ = round(acc · scale) (flash_bwd_convert_dq: dq_accum times scale_softmax).
  for (int64_t r = 0; r < ratio; ++r) {
    const int64_t h = GroupHead(p, plan.opt->faults, g, r);
    for (int64_t i = 0; i < seq.q_len; ++i) {
      float* out = plan.dq.data() + ((seq.q_begin + i) * p.heads_q + h) * d;
      const float* acc = dq_acc.data() + (r * seq.q_len + i) * d;
      for (int64_t c = 0; c < d; ++c)
        out[c] = RoundElement(acc[c] * plan.sp.grad_scale, plan.grad_format);
    }
  }
  return Status::Ok();
}

// Runs fn(item) -> Status on the workers; the first failing item's error (in item order).
template <class Fn>
Status RunItems(int64_t n, int threads, Fn&& fn) {
  std::vector<Status> status(static_cast<size_t>(n));
  ParallelFor(n, threads, [&](int64_t i) { status[static_cast<size_t>(i)] = fn(i); });
  for (Status& s : status) {
    if (!s) return s;
  }
  return Status::Ok();
}

// The f16 code of a float that is an f16 value (IEEE binary16: 5 exponent bits, bias 15).
uint16_t F16Code(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(x);
  if (std::isnan(x)) return sign | 0x7E00u;
  if (std::isinf(x)) return sign | 0x7C00u;
  if (a < 0x1p-14f) return sign | static_cast<uint16_t>(a * 0x1p24f);  // subnormal or zero
  const uint32_t e = ((u >> 23) & 0xFFu) - 112u;                       // rebias 127 -> 15
  return sign | static_cast<uint16_t>((e << 10) | ((u >> 13) & 0x3FFu));
}

// A tensor of `shape` holding `values` (already rounded to `format`) in `format`: codes for
// bf16/f16 (exact: truncating an already rounded value), f32, else f64 (exact).
Tensor MakeOutput(const Shape& shape, const std::vector<float>& values, Format format) {
  if (format == Format::kF32) {
    Tensor t = Tensor::Zeros(DType::kF32, shape);
    std::copy(values.begin(), values.end(), t.data<float>());
    return t;
  }
  if (format == Format::kBF16 || format == Format::kF16) {
    Tensor t = Tensor::Zeros(format == Format::kBF16 ? DType::kBF16 : DType::kF16, shape);
    uint16_t* c = t.data<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(values[i]);
      if (format == Format::kF16) {
        c[i] = F16Code(values[i]);
      } else if (std::isnan(values[i])) {
        c[i] = static_cast<uint16_t>((u >> 16) | 0x7FC0u);  // quiet, whatever the payload
      } else {
        c[i] = static_cast<uint16_t>(u >> 16);
      }
    }
    return t;
  }
  Tensor wide = Tensor::FromF64(shape, std::vector<double>(values.begin(), values.end()));
  if (std::optional<DType> dt = DTypeOf(format)) {
    Expected<Tensor> codes = FromF64(wide, *dt);
    if (codes.ok()) return std::move(*codes);
  }
  return wide;
}

Format InputFormat(const Problem& p) { return FormatOf(p.dtype).value_or(Format::kF32); }

}  // namespace

float FmaF32(float a, float b, float c) {
  // 1. The product of two floats has at most 48 significant bits: exact in double.
  const double prod = static_cast<double>(a) * static_cast<double>(b);
  // 2. The sum, rounded to nearest, and its exact error (Knuth's TwoSum).
  const double cd = static_cast<double>(c);
  double sum = prod + cd;
  if (!std::isfinite(sum)) return static_cast<float>(sum);
  const double bv = sum - prod;
  const double err = (prod - (sum - bv)) + (cd - bv);
  // 3. Round to odd: an inexact sum with an even last bit moves one ulp towards the exact
  //    value. Round-to-odd at 53 bits then round-to-nearest at 24 bits is one correct
  //    rounding (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums", 2008).
  if (err != 0) {
    const uint64_t u = std::bit_cast<uint64_t>(sum);
    if ((u & 1u) == 0) sum = std::bit_cast<double>((err > 0) == (sum > 0) ? u + 1 : u - 1);
  }
  return static_cast<float>(sum);
}

std::optional<Format> BackwardDpFormat(const Recipe& recipe, const EngineOptions& options) {
  if (recipe.dp) return recipe.dp;
  if (options.backward == BackwardVariant::kFusedNoAtomics) return Format::kF16;
  return std::nullopt;
}

std::string EngineUnsupportedReason(const Problem& p, const Recipe& recipe,
                                    const EngineOptions& options) {
  if (!recipe.input_dtypes.empty() &&
      std::find(recipe.input_dtypes.begin(), recipe.input_dtypes.end(), p.dtype) ==
          recipe.input_dtypes.end()) {
    return "recipe " + std::string(recipe.name) + " is not defined for " +
           std::string(Name(p.dtype)) + " inputs";
  }
  if (options.fwd_block_m < 1 || options.fwd_block_n < 1 || options.bwd_block_m < 1 ||
      options.bwd_block_n < 1) {
    return "tile sizes must be positive";
  }
  if (Status s = ValidateRecipe(recipe); !s) return s.error().message;
  return {};
}

KernelAnswer<ForwardResult> FlashForward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                         const Tensor& k, const Tensor& v,
                                         const EngineOptions& options) {
  if (Status s = Validate(p); !s) return s.error();
  if (Status s = ValidateInputShapes(p, q, k, v); !s) return s.error();
  if (std::string why = EngineUnsupportedReason(p, recipe, options); !why.empty()) {
    return Unsupported{why};
  }
  ForwardPlan plan;
  plan.p = &p;
  plan.recipe = &recipe;
  plan.opt = &options;
  plan.sp = MakeScoreParams(p);
  plan.sp.s_tanh_s = options.faults.softcap_s_tanh_s;
  plan.out_format = recipe.output.value_or(InputFormat(p));
  const Operand raw_q{InputFloats(q, p.dtype), p.heads_q, p.head_dim};
  const Operand raw_k{InputFloats(k, p.dtype), p.heads_kv, p.head_dim};
  const Operand raw_v{InputFloats(v, p.dtype), p.heads_kv, p.head_dim_v};
  {
    Expected<Operand> a = Prepare(p, raw_q, recipe.qk.a, options.faults);
    if (!a.ok()) return a.error();
    Expected<Operand> b = Prepare(p, raw_k, recipe.qk.b, options.faults);
    if (!b.ok()) return b.error();
    Expected<Operand> c = Prepare(p, raw_v, recipe.pv.b, options.faults);
    if (!c.ok()) return c.error();
    plan.q = std::move(*a);
    plan.k = std::move(*b);
    plan.v = std::move(*c);
  }
  // Fault skip_last_partial_tile: outputs start as a harness poisons them (all-ones bytes,
  // kernels/kernel.h kOutputPoisonByte; MakeOutput keeps the pattern in bf16 and f32), and the
  // last query tile of a sequence is never run when it is partial (a tile-count rounding bug).
  const bool skip_last = options.faults.skip_last_partial_tile;
  const float fill = OutputPoisonF32();
  plan.o.assign(static_cast<size_t>(p.TotalQ() * p.heads_q * p.head_dim_v),
                skip_last ? fill : 0.0f);
  plan.lse.assign(static_cast<size_t>(Tensor::NumElements(p.LseShape())),
                  skip_last ? fill : -kInf);
  struct Item {
    int64_t b, h, m0;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q_len = SequenceOf(p, b).q_len;
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t m0 = 0; m0 < q_len; m0 += options.fwd_block_m) {
        if (skip_last && m0 + options.fwd_block_m > q_len) continue;
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
  plan.sp = MakeScoreParams(p);
  plan.sp.s_tanh_s = options.faults.softcap_s_tanh_s;
  plan.grad_format = recipe.gradients.value_or(InputFormat(p));
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
    Expected<Operand> prepared = Prepare(p, *role.raw, *role.quant, options.faults);
    if (!prepared.ok()) return prepared.error();
    *role.out = std::move(*prepared);
  }
  plan.lse = Floats(lse);
  // D = rowsum(dO ∘ O) in fp32 from the stored O (flash_bwd_preprocess_kernel.h dot_do_o).
  {
    std::vector<float> of = Floats(o);
    if (options.faults.delta_o_format) {
      // Fault: D from another O than the one forward returned (here its low-precision copy).
      EncodeOptions saturate;
      saturate.overflow = Overflow::kSaturate;
      for (float& x : of) {
        x = static_cast<float>(RoundTo(x, *options.faults.delta_o_format, saturate));
      }
    }
    const int64_t rows = p.TotalQ() * p.heads_q, dv = p.head_dim_v;
    plan.delta.assign(static_cast<size_t>(rows), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t c = 0; c < dv; ++c) acc += raw_do.values[r * dv + c] * of[r * dv + c];
      plan.delta[static_cast<size_t>(r)] = acc;
    }
  }
  plan.dq.assign(raw_q.values.size(), 0.0f);
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
  return out;
}

}  // namespace attest
