// The tiled FlashAttention-2-style engine (see flash_engine.h; arXiv 2307.08691 Algorithms 1
// and 2; flash-attention csrc/flash_attn/src/flash_fwd_kernel.h, flash_bwd_kernel.h,
// softmax.h, mask.h, alibi.h and csrc/flash_attn/flash_api.cpp for the scale parameters).
// This file: the pieces forward (flash_engine_forward.cc) and backward
// (flash_engine_backward.cc) share — GEMM, operands, scores, outputs — and the correct steps
// that EngineHooks defaults to.
#include "kernels/models/flash_engine.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "kernels/models/flash_engine_internal.h"
#include "reference/formats/format.h"
#include "reference/problem/mask.h"

namespace attest {
namespace engine_detail {

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

// `raw` represented as the GEMM operand `quant` says. Blocks along the sequence run over the
// whole sequence axis of the full tensor ([B, S, H, W] axis 1, or packed [total, H, W] axis
// 0), exactly like a kernel that quantises the operand before its tiled loop.
Expected<Operand> Prepare(const Problem& p, const Operand& raw, const OperandQuant& quant,
                          const EngineHooks& hooks) {
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
  Expected<std::vector<float>> q = hooks.QuantizeInput(raw.values, shape, axis, quant.scheme);
  if (!q.ok()) return q.error();
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
      if (quant.scheme.pre_scale == 1.0 && quant.scheme.overflow == Overflow::kDefault &&
          quant.scheme.rounding == Rounding::kNearestEven) {
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

ScoreParams MakeScoreParams(const Problem& p, const Tensor* rel_bias) {
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
  if (rel_bias != nullptr) {
    s.rel_bias = InputFloats(*rel_bias, DType::kF32);
    for (float& x : s.rel_bias) x /= s.scale_softmax;
    s.rel_width = p.RelBiasWidth();
    s.rel_center = p.seqlen_k - 1;
  }
  return s;
}



void TransformScores(const ScoreParams& sp, const EngineHooks& hooks, const MaskView& mask,
                     int64_t head, int64_t m0, int64_t mlen, int64_t n0, int64_t nlen,
                     const std::vector<uint8_t>& vis, std::vector<float>& s,
                     std::vector<float>* tanh_out) {
  // The softcap first, over the whole tile (elementwise, so the same values as applying it
  // element by element before the ALiBi term); the cap multiplies later, folded into
  // scale_softmax_log2.
  if (sp.softcap_in != 0) {
    hooks.Softcap(sp.grad_scale, sp.scale_softmax, s.data(),
                  tanh_out ? tanh_out->data() : nullptr, mlen * nlen);
  }
  const float slope = sp.alibi.empty() ? 0.0f : sp.alibi[static_cast<size_t>(head)];
  // The relative bias of pair (m0 + i, n0 + j): element base + i - j of the table.
  const bool bias = !sp.rel_bias.empty();
  const int64_t base = head * sp.rel_width + sp.rel_center + m0 - n0;
  for (int64_t i = 0; i < mlen; ++i) {
    for (int64_t j = 0; j < nlen; ++j) {
      const size_t e = static_cast<size_t>(i * nlen + j);
      float x = s[e];
      if (slope != 0) {
        // alibi.h: s -= slope · |i + Sk − Sq − j| (one FFMA on the GPU).
        x = FmaF32(-slope, static_cast<float>(mask.AlibiDistance(m0 + i, n0 + j)), x);
      }
      if (bias && vis[e]) x += sp.rel_bias[static_cast<size_t>(base + i - j)];  // last
      s[e] = vis[e] ? x : -kInf;
    }
  }
}

int64_t LseIndex(const Problem& p, int64_t b, int64_t h, int64_t i) {
  if (p.varlen()) return h * p.TotalQ() + SequenceOf(p, b).q_begin + i;
  return (b * p.heads_q + h) * p.seqlen_q + i;
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

const EngineHooks& HooksOf(const EngineOptions& options) {
  static const EngineHooks kCorrect;
  return options.hooks ? *options.hooks : kCorrect;
}

}  // namespace engine_detail

SoftmaxRows::SoftmaxRows(int64_t rows, int64_t dv)
    : acc(static_cast<size_t>(rows * dv), 0.0f),
      row_max(static_cast<size_t>(rows), -engine_detail::kInf),
      row_sum(static_cast<size_t>(rows), 0.0f) {}

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
  if (p.sink && options.sink == nullptr) {
    return "learnable sink: the engine needs its tensor (Kernel::ForwardSink / BackwardSink)";
  }
  if (!p.sink && options.sink != nullptr) return "a sink tensor for a problem without a sink";
  if (options.sink != nullptr && options.sink->shape() != p.SinkShape()) {
    return "sink: shape " + options.sink->Describe() + " is not [heads_q]";
  }
  if (p.rel_bias && options.rel_bias == nullptr) {
    return "learnable relative bias: the engine needs its tensor (Kernel::ForwardRelBias / "
           "BackwardRelBias)";
  }
  if (!p.rel_bias && options.rel_bias != nullptr) {
    return "a rel_bias tensor for a problem without a relative bias";
  }
  if (options.rel_bias != nullptr && options.rel_bias->shape() != p.RelBiasShape()) {
    return "rel_bias: shape " + options.rel_bias->Describe() + " is not [heads_q, " +
           std::to_string(p.RelBiasWidth()) + "]";
  }
  if (p.rel_bias && (engine_detail::HooksOf(options).KvSplits() > 1 || p.num_splits > 1)) {
    return "learnable relative bias with a split-KV combine is not modelled";
  }
  return {};
}

// ---- The correct steps: EngineHooks' defaults ---------------------------------------------------

Expected<std::vector<float>> EngineHooks::QuantizeInput(std::span<const float> values,
                                                        const Shape& shape, int64_t axis,
                                                        const OperandScheme& scheme) const {
  return QuantizeOperand(values, shape, axis, scheme);
}

int64_t EngineHooks::KvHead(const Problem& p, int64_t h) const { return p.KvHead(h); }

int64_t EngineHooks::GroupHead(const Problem& p, int64_t g, int64_t r) const {
  return g * p.gqa_ratio() + r;
}

void EngineHooks::Softcap(float softmax_scale, float cap, float* s, float* tanh_out,
                          int64_t n) const {
  // flash::apply_softcap: tanh(x · softmax_scale / cap), the factor rounded once to float as
  // flash_api.cpp set_params_fprop computes it.
  const float in = softmax_scale / cap;
  for (int64_t e = 0; e < n; ++e) {
    s[e] = std::tanh(s[e] * in);
    if (tanh_out) tanh_out[e] = s[e];
  }
}

float EngineHooks::RowMax(float previous, float candidate, float scale_log2) const {
  (void)previous;
  (void)scale_log2;
  return candidate;
}

int EngineHooks::KvSplits() const { return 1; }

int64_t EngineHooks::KvSplitEnd(int64_t end, int64_t k_len) const {
  (void)k_len;
  return end;
}

void EngineHooks::CombineKvSplits(std::span<const SoftmaxRows* const> parts, int64_t i,
                                  int64_t dv, float scale_softmax, float sink,
                                  const OperandScheme& out_round, float* o, float* lse) const {
  // flash_fwd_kernel.h combine_attn_seqk_parallel: lse = log Σ_s exp(lse_s) (the largest
  // subtracted first), o = Σ_s exp(lse_s − lse) · o_s; the sink joins the sum once.
  constexpr float kNone = -engine_detail::kInf;
  std::vector<float> part(parts.size(), kNone);
  float lmax = sink;
  for (size_t s = 0; s < parts.size(); ++s) {
    const float sum = parts[s]->row_sum[static_cast<size_t>(i)];
    if (sum == 0 || sum != sum) continue;
    part[s] = FmaF32(parts[s]->row_max[static_cast<size_t>(i)], scale_softmax, std::log(sum));
    lmax = std::max(lmax, part[s]);
  }
  if (lmax == kNone) {
    std::fill(o, o + dv, 0.0f);
    *lse = kNone;
    return;
  }
  float total = 0.0f;
  for (float l : part) {
    if (l != kNone) total += std::exp(l - lmax);
  }
  if (sink != kNone) total += std::exp(sink - lmax);
  *lse = lmax + std::log(total);
  for (int64_t c = 0; c < dv; ++c) {
    float x = 0.0f;
    for (size_t s = 0; s < parts.size(); ++s) {
      if (part[s] == kNone) continue;
      const SoftmaxRows& r = *parts[s];
      x += std::exp(part[s] - *lse) *
           (r.acc[static_cast<size_t>(i * dv + c)] / r.row_sum[static_cast<size_t>(i)]);
    }
    o[c] = RoundElement(x, out_round);
  }
}

float EngineHooks::RowLse(float row_max, float row_sum, float scale_softmax) const {
  return FmaF32(row_max, scale_softmax, std::log(row_sum));
}

float EngineHooks::LseLog2(float lse) const {
  return lse * static_cast<float>(std::numbers::log2e);
}

void EngineHooks::BackwardTileMask(int64_t visible, std::vector<uint8_t>& vis) const {
  (void)visible;
  (void)vis;
}

void EngineHooks::RecomputeP(float* s, const uint8_t* vis, int64_t n, float lse, float lse_log2,
                             float scale_log2) const {
  // flash_bwd_kernel.h scale_apply_exp2 with max = lse; rows with a non-finite lse (-inf, or
  // +inf as FA2 writes) are empty: P = 0, as at masked positions.
  for (int64_t j = 0; j < n; ++j) {
    s[j] = (!std::isfinite(lse) || !vis[j]) ? 0.0f
                                            : std::exp2(FmaF32(s[j], scale_log2, -lse_log2));
  }
}

void EngineHooks::SoftcapDerivative(float* ds, const float* tanh, int64_t n) const {
  for (int64_t e = 0; e < n; ++e) ds[e] *= 1.0f - tanh[e] * tanh[e];
}

void EngineHooks::RescaleAcc(float* acc, int64_t dv, float rescale) const {
  for (int64_t c = 0; c < dv; ++c) acc[c] *= rescale;
}

void EngineHooks::ForwardTileMask(int64_t visible, std::vector<uint8_t>& vis) const {
  (void)visible;
  (void)vis;
}

int64_t EngineHooks::BackwardKeyTiles(int64_t key_tiles) const { return key_tiles; }

void EngineHooks::StoreBackwardAccumulator(float* acc, int64_t n) const {
  (void)acc;
  (void)n;
}

int64_t EngineHooks::DqFirstKeyTile(int64_t key_tiles) const {
  (void)key_tiles;
  return 0;
}

}  // namespace attest
