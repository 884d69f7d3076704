// The mutant catalogue's wrappers and engine hooks (see deviations.h; each bug's source is in
// its catalogue row, kernels/mutants/mutants.cc). Compiled with -ffp-contract=off like the
// engine (kernels/CMakeLists.txt): the hooks compute inside the engine's arithmetic.
#include "kernels/mutants/deviations.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include "reference/formats/format.h"
#include "reference/formats/mx.h"
#include "reference/formats/quantize.h"
#include "reference/problem/paged.h"
#include "reference/recipes/recipe.h"

namespace attest {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- Layout helpers -----------------------------------------------------------------------------

// A contiguous tensor with t's values (t itself when it already is one).
Tensor Contiguous(const Tensor& t) { return t.contiguous() ? t : t.Clone(); }

// Calls fn(o_row, lse_index) for every (sequence, head, query) of `p`: o_row indexes the
// [tokens · Hq] rows of o (padded [B, Sq, H, Dv] and packed [total, H, Dv] alike), lse_index
// the lse layout ([B, Hq, Sq], or packed [Hq, total]).
template <class Fn>
void ForEachQueryRow(const Problem& p, Fn&& fn) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = SequenceOf(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t lse_index = p.varlen() ? h * p.TotalQ() + seq.q_begin + i
                                             : (b * p.heads_q + h) * p.seqlen_q + i;
        fn((seq.q_begin + i) * p.heads_q + h, lse_index, b, i);
      }
    }
  }
}

// ---- Block-scaled operands ----------------------------------------------------------------------

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

}  // namespace

// ---- Wrappers -----------------------------------------------------------------------------------

void LseInLog2Units(const Problem& p, const EngineOptions& options, ForwardResult& out) {
  (void)p;
  (void)options;
  // The kernel's internal base-2 lse returned without converting back to base e (in fp32, as
  // the kernel's epilogue would have computed the conversion).
  const float log2e = static_cast<float>(std::numbers::log2e);
  if (out.lse.dtype() == DType::kF32) {
    out.lse = Contiguous(out.lse).Clone();
    for (float& x : out.lse.span<float>()) x *= log2e;
    return;
  }
  Tensor wide = ToF64(out.lse).Clone();
  for (double& x : wide.span<double>()) x = static_cast<float>(x) * log2e;
  Expected<Tensor> back = FromF64(wide, out.lse.dtype());
  out.lse = back.ok() ? std::move(*back) : wide;
}

void SwapOColumns01(const Problem& p, const EngineOptions& options, ForwardResult& out) {
  (void)options;
  if (p.head_dim_v < 2) return;
  out.o = Contiguous(out.o).Clone();
  const int64_t size = SizeOf(out.o.dtype()), rows = out.o.numel() / p.head_dim_v;
  std::byte* base = out.o.bytes();
  for (int64_t r = 0; r < rows; ++r) {
    std::byte* row = base + r * p.head_dim_v * size;
    std::swap_ranges(row, row + size, row + size);
  }
}

void SkipLastPartialQueryTile(const Problem& p, const EngineOptions& options,
                              ForwardResult& out) {
  const int64_t bm = options.fwd_block_m;
  out.o = Contiguous(out.o).Clone();
  out.lse = Contiguous(out.lse).Clone();
  const int64_t o_row = p.head_dim_v * SizeOf(out.o.dtype()), lse_size = SizeOf(out.lse.dtype());
  ForEachQueryRow(p, [&](int64_t row, int64_t lse_index, int64_t b, int64_t i) {
    (void)b;
    const int64_t q_len = SequenceOf(p, b).q_len;
    if (q_len % bm == 0 || i < q_len / bm * bm) return;  // not in a partial last tile
    std::memset(out.o.bytes() + row * o_row, kOutputPoisonByte, static_cast<size_t>(o_row));
    std::memset(out.lse.bytes() + lse_index * lse_size, kOutputPoisonByte,
                static_cast<size_t>(lse_size));
  });
}

void NanInEmptyRows(const Problem& p, const EngineOptions& options, ForwardResult& out) {
  (void)options;
  const Tensor lse = ToF64(out.lse);
  Tensor o = ToF64(out.o).Clone();
  std::span<const double> l = lse.span<const double>();
  std::span<double> ov = o.span<double>();
  const int64_t dv = p.head_dim_v;
  // 0 · (1 / 0): the empty row's zero accumulator times the unguarded reciprocal, evaluated at
  // run time so that the NaN is the one the hardware produces (x86-64: the negative default
  // NaN), as in the kernel.
  volatile float zero = 0.0f;
  const float nan = zero * (1.0f / zero);
  ForEachQueryRow(p, [&](int64_t row, int64_t lse_index, int64_t, int64_t) {
    if (l[static_cast<size_t>(lse_index)] != -std::numeric_limits<double>::infinity()) return;
    for (int64_t c = 0; c < dv; ++c) ov[static_cast<size_t>(row * dv + c)] = nan;
  });
  Expected<Tensor> back = FromF64(o, out.o.dtype());
  out.o = back.ok() ? std::move(*back) : o;
}

Tensor OAsE4m3(const Tensor& o) {
  EncodeOptions saturate;
  saturate.overflow = Overflow::kSaturate;
  Tensor wide = ToF64(o).Clone();
  for (double& x : wide.span<double>()) x = RoundTo(x, Format::kE4M3FN, saturate);
  // E4M3 values are exact in every dtype o comes in (bf16, f16, f32).
  Expected<Tensor> back = FromF64(wide, o.dtype());
  return back.ok() ? std::move(*back) : wide;
}

// ---- Hooks --------------------------------------------------------------------------------------

namespace {

// flash-attention #2577: a lazy rescale (threshold 8 in log2 units).
class LazyRescale : public EngineHooks {
 public:
  float RowMax(float previous, float candidate, float scale_log2) const override {
    constexpr float kThresholdLog2 = 8.0f;
    if (previous != -kInf && (candidate - previous) * scale_log2 <= kThresholdLog2) {
      return previous;
    }
    return candidate;
  }
};

// The lse of each split that saw a key (−inf elsewhere), as the correct combine forms it.
std::vector<float> SplitLses(std::span<const SoftmaxRows* const> parts, int64_t i,
                             float scale_softmax) {
  std::vector<float> out(parts.size(), -kInf);
  for (size_t s = 0; s < parts.size(); ++s) {
    const float sum = parts[s]->row_sum[static_cast<size_t>(i)];
    if (sum == 0 || sum != sum) continue;
    out[s] = FmaF32(parts[s]->row_max[static_cast<size_t>(i)], scale_softmax, std::log(sum));
  }
  return out;
}

// lse = log(Σ_s exp(lse_s) + exp(sink)), the largest subtracted first; -inf when all are.
float CombinedLse(const std::vector<float>& lses, float sink) {
  float m = sink;
  for (float l : lses) m = std::max(m, l);
  if (m == -kInf) return m;
  float total = sink == -kInf ? 0.0f : std::exp(sink - m);
  for (float l : lses) total += l == -kInf ? 0.0f : std::exp(l - m);
  return m + std::log(total);
}

// o = Σ_s w_s · acc_s / l_s over the splits that saw a key, rounded by `out_round`.
void WeightedPartials(std::span<const SoftmaxRows* const> parts, const std::vector<float>& w,
                      int64_t i, int64_t dv, const OperandScheme& out_round, float* o) {
  for (int64_t c = 0; c < dv; ++c) {
    float x = 0.0f;
    for (size_t s = 0; s < parts.size(); ++s) {
      if (w[s] == 0.0f) continue;
      const SoftmaxRows& r = *parts[s];
      x += w[s] * (r.acc[static_cast<size_t>(i * dv + c)] / r.row_sum[static_cast<size_t>(i)]);
    }
    o[c] = RoundElement(x, out_round);
  }
}

// flash-attention #1647 class: the partial results o_s = acc_s / l_s combined with weights
// l_s / Σ l instead of exp(lse_s − lse); the partial maxima are never reconciled.
class SplitKvBadCombine : public EngineHooks {
 public:
  int KvSplits() const override { return 2; }
  void CombineKvSplits(std::span<const SoftmaxRows* const> parts, int64_t i, int64_t dv,
                       float scale_softmax, float sink, const OperandScheme& out_round, float* o,
                       float* lse) const override {
    const std::vector<float> lses = SplitLses(parts, i, scale_softmax);
    *lse = CombinedLse(lses, sink);
    float total = 0.0f;
    for (size_t s = 0; s < parts.size(); ++s) {
      if (lses[s] != -kInf) total += parts[s]->row_sum[static_cast<size_t>(i)];
    }
    std::vector<float> w(parts.size(), 0.0f);
    for (size_t s = 0; s < parts.size(); ++s) {
      if (lses[s] != -kInf) w[s] = parts[s]->row_sum[static_cast<size_t>(i)] / total;
    }
    WeightedPartials(parts, w, i, dv, out_round, o);
  }
};

// A split-KV combine that weights each partial by exp(lse_s − m) (m the largest lse_s) and never
// divides by Σ_s exp(lse_s − m): o is right only where one split holds all the weight.
class SplitKvUnnormalisedCombine : public EngineHooks {
 public:
  void CombineKvSplits(std::span<const SoftmaxRows* const> parts, int64_t i, int64_t dv,
                       float scale_softmax, float sink, const OperandScheme& out_round, float* o,
                       float* lse) const override {
    const std::vector<float> lses = SplitLses(parts, i, scale_softmax);
    *lse = CombinedLse(lses, sink);
    float m = sink;
    for (float l : lses) m = std::max(m, l);
    std::vector<float> w(parts.size(), 0.0f);
    for (size_t s = 0; s < parts.size(); ++s) {
      if (lses[s] != -kInf) w[s] = std::exp(lses[s] - m);
    }
    WeightedPartials(parts, w, i, dv, out_round, o);
  }
};

// ROCm #12227 class: the learnable sink folded into every split's partial sum before the
// combine, so that the combined denominator counts exp(sink) once per split that saw a key.
class SplitKvSinkPerSplit : public EngineHooks {
 public:
  void CombineKvSplits(std::span<const SoftmaxRows* const> parts, int64_t i, int64_t dv,
                       float scale_softmax, float sink, const OperandScheme& out_round, float* o,
                       float* lse) const override {
    std::vector<float> lses = SplitLses(parts, i, scale_softmax);
    bool any = false;
    for (float& l : lses) {
      if (l == -kInf || sink == -kInf) continue;
      const float m = std::max(l, sink);
      l = m + std::log(std::exp(l - m) + std::exp(sink - m));
      any = true;
    }
    *lse = CombinedLse(lses, any ? -kInf : sink);
    std::vector<float> w(parts.size(), 0.0f);
    for (size_t s = 0; s < parts.size(); ++s) {
      if (lses[s] == -kInf) continue;
      // The partial o_s = acc_s / l_s carries the sink too: scaled by l_s / (l_s + e^sink).
      const float sum = parts[s]->row_sum[static_cast<size_t>(i)];
      const float own = FmaF32(parts[s]->row_max[static_cast<size_t>(i)], scale_softmax,
                               std::log(sum));
      w[s] = std::exp(own - *lse);
    }
    WeightedPartials(parts, w, i, dv, out_round, o);
  }
};

// A split's key range ends one key past its boundary: the first key of the next split is
// also read by this one (counted twice).
class SplitKvBoundaryOffByOne : public EngineHooks {
 public:
  int64_t KvSplitEnd(int64_t end, int64_t k_len) const override {
    return std::min(end + 1, k_len);
  }
};

// pytorch #181645 class: the max, already scaled, is scaled again.
class LseScaledTwice : public EngineHooks {
 public:
  float RowLse(float row_max, float row_sum, float scale_softmax) const override {
    return FmaF32(row_max * scale_softmax, scale_softmax, std::log(row_sum));
  }
};

// The backward of a kernel whose forward returns lse in base 2: it reads it as base 2.
class LseLog2Backward : public EngineHooks {
 public:
  float LseLog2(float lse) const override { return lse; }
};

// flash-attention PR #2402: the score t = scale · q·k becomes t · tanh(t), divided by the cap
// that the exp2's scale multiplies in later.
class SoftcapSTanhS : public EngineHooks {
 public:
  void Softcap(float softmax_scale, float cap, float* s, float* tanh_out,
               int64_t n) const override {
    for (int64_t e = 0; e < n; ++e) {
      const float t = s[e] * softmax_scale;
      const float th = std::tanh(t);
      s[e] = t * th / cap;
      if (tanh_out) tanh_out[e] = th;
    }
  }
};

// flash-attention PR #2402: tanh' left out of dS.
class SoftcapNoDerivative : public EngineHooks {
 public:
  void SoftcapDerivative(float*, const float*, int64_t) const override {}
};

// TransformerEngine #3216 class: h % Hkv instead of h / (Hq / Hkv).
class GqaHeadMod : public EngineHooks {
 public:
  int64_t KvHead(const Problem& p, int64_t h) const override { return h % p.heads_kv; }
  int64_t GroupHead(const Problem& p, int64_t g, int64_t r) const override {
    return r * p.heads_kv + g;
  }
};

// flash-attention #443 class: the backward's mask step skipped for the tile that straddles the
// bound.
class DiagTileUnmasked : public EngineHooks {
 public:
  void BackwardTileMask(int64_t visible, std::vector<uint8_t>& vis) const override {
    if (visible < static_cast<int64_t>(vis.size())) std::fill(vis.begin(), vis.end(), 1);
  }
};

// The forward's pair of DiagTileUnmasked: the diagonal tile run by the stage without a mask.
class ForwardDiagTileUnmasked : public EngineHooks {
 public:
  void ForwardTileMask(int64_t visible, std::vector<uint8_t>& vis) const override {
    if (visible < static_cast<int64_t>(vis.size())) std::fill(vis.begin(), vis.end(), 1);
  }
};

// acc_o *= alpha forgotten: the row sum is rescaled, the accumulator is not.
class AccNotRescaled : public EngineHooks {
 public:
  void RescaleAcc(float* acc, int64_t dv, float rescale) const override {
    (void)acc;
    (void)dv;
    (void)rescale;
  }
};

// for start_n in range(0, N - BLOCK_N, BLOCK_N): one key tile short.
class LastKeyTileSkipped : public EngineHooks {
 public:
  int64_t BackwardKeyTiles(int64_t key_tiles) const override {
    return std::max<int64_t>(0, key_tiles - 1);
  }
};

// An accumulator buffer of 9 significant bits (one more than bf16: a packed 16-bit word that
// spends a bit of the exponent on precision) written by truncating the fp32 word between query
// tiles: every store drops the magnitude by up to half a bf16 ulp, always toward zero.
class TruncatedBackwardAccumulator : public EngineHooks {
 public:
  void StoreBackwardAccumulator(float* acc, int64_t n) const override {
    for (int64_t i = 0; i < n; ++i) {
      acc[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(acc[i]) & 0xFFFF8000u);
    }
  }
};

// facebookexperimental/triton PR #3395 class: no guard for masked entries and empty rows,
// exp2(−inf − (−inf)) = NaN in an empty row, then fed onwards.
class MaskedDsNan : public EngineHooks {
 public:
  void RecomputeP(float* s, const uint8_t* vis, int64_t n, float lse, float lse_log2,
                  float scale_log2) const override {
    (void)vis;
    (void)lse;
    for (int64_t j = 0; j < n; ++j) s[j] = std::exp2(FmaF32(s[j], scale_log2, -lse_log2));
  }
};

// vllm PR #43557: the MX scale exponent off by one.
class MxScaleOffByOne : public EngineHooks {
 public:
  Expected<std::vector<float>> QuantizeInput(std::span<const float> values, const Shape& shape,
                                             int64_t axis,
                                             const OperandScheme& scheme) const override {
    const Scheme* row = scheme.kind == OperandKind::kBlock ? FindScheme(scheme.block) : nullptr;
    if (row && row->kind == SchemeKind::kMx) {
      return MxWithScaleOffset(values, shape, axis, scheme, -1);
    }
    return QuantizeOperand(values, shape, axis, scheme);
  }
};

// ROCm/aiter #4289: a zero block scale dequantised through 0/0.
class ZeroAmaxBlockNan : public EngineHooks {
 public:
  Expected<std::vector<float>> QuantizeInput(std::span<const float> values, const Shape& shape,
                                             int64_t axis,
                                             const OperandScheme& scheme) const override {
    Expected<std::vector<float>> q = QuantizeOperand(values, shape, axis, scheme);
    if (q.ok() && scheme.kind == OperandKind::kBlock) {
      ZeroAmaxBlocksToNan(*q, values, shape, axis, scheme);
    }
    return q;
  }
};

}  // namespace

const EngineHooks& LazyRescaleHooks() {
  static const LazyRescale h;
  return h;
}
const EngineHooks& SplitKvBadCombineHooks() {
  static const SplitKvBadCombine h;
  return h;
}
const EngineHooks& SplitKvUnnormalisedCombineHooks() {
  static const SplitKvUnnormalisedCombine h;
  return h;
}
const EngineHooks& SplitKvSinkPerSplitHooks() {
  static const SplitKvSinkPerSplit h;
  return h;
}
const EngineHooks& SplitKvBoundaryOffByOneHooks() {
  static const SplitKvBoundaryOffByOne h;
  return h;
}
const EngineHooks& LseScaledTwiceHooks() {
  static const LseScaledTwice h;
  return h;
}
const EngineHooks& LseLog2BackwardHooks() {
  static const LseLog2Backward h;
  return h;
}
const EngineHooks& SoftcapSTanhSHooks() {
  static const SoftcapSTanhS h;
  return h;
}
const EngineHooks& SoftcapNoDerivativeHooks() {
  static const SoftcapNoDerivative h;
  return h;
}
const EngineHooks& GqaHeadModHooks() {
  static const GqaHeadMod h;
  return h;
}
const EngineHooks& DiagTileUnmaskedHooks() {
  static const DiagTileUnmasked h;
  return h;
}
const EngineHooks& ForwardDiagTileUnmaskedHooks() {
  static const ForwardDiagTileUnmasked h;
  return h;
}
const EngineHooks& AccNotRescaledHooks() {
  static const AccNotRescaled h;
  return h;
}
const EngineHooks& LastKeyTileSkippedHooks() {
  static const LastKeyTileSkipped h;
  return h;
}
const EngineHooks& MaskedDsNanHooks() {
  static const MaskedDsNan h;
  return h;
}
const EngineHooks& MxScaleOffByOneHooks() {
  static const MxScaleOffByOne h;
  return h;
}
const EngineHooks& ZeroAmaxBlockNanHooks() {
  static const ZeroAmaxBlockNan h;
  return h;
}
const EngineHooks& TruncatedBackwardAccumulatorHooks() {
  static const TruncatedBackwardAccumulator h;
  return h;
}

// Paged-KV address arithmetic (vLLM's and FlashAttention's block_table: physical page =
// table[b][j / page_size]) off by one page: the kernel reads the pool's next page, another
// sequence's keys or a page no sequence owns.
class PageOffByOne : public EngineHooks {
 public:
  int64_t PagedKeyRow(const Problem& p, int64_t b, int64_t j) const override {
    if (!p.paged()) return KeyRow(p, b, j);
    const auto& row = (*p.page_table)[static_cast<size_t>(b)];
    const int64_t page = row[static_cast<size_t>(j / p.page_size)];
    return (page + 1) % p.num_pages * p.page_size + j % p.page_size;
  }
};

// The key loop bounded by whole pages: the last page's slots past seqused_k are read as keys.
class LastPageOverread : public EngineHooks {
 public:
  int64_t UsedKeys(const Problem& p, int64_t b, bool backward) const override {
    (void)backward;
    const int64_t used = UsedKLen(p, b);
    if (!p.paged()) return used;
    const int64_t whole = (used + p.page_size - 1) / p.page_size * p.page_size;
    return std::min(whole, PagesPerSeq(p) * p.page_size);
  }
};

// The backward's key count taken from the sequence's length, not seqused_k.
class SequsedKIgnoredInBackward : public EngineHooks {
 public:
  int64_t UsedKeys(const Problem& p, int64_t b, bool backward) const override {
    return backward ? SequenceOf(p, b).k_len : UsedKLen(p, b);
  }
};

const EngineHooks& PageOffByOneHooks() {
  static const PageOffByOne h;
  return h;
}
const EngineHooks& LastPageOverreadHooks() {
  static const LastPageOverread h;
  return h;
}
const EngineHooks& SequsedKIgnoredInBackwardHooks() {
  static const SequsedKIgnoredInBackward h;
  return h;
}

Tensor ReadAsContiguous(const Tensor& t) {
  if (!t.defined() || t.contiguous()) return t;
  return Tensor::View(t.dtype(), t.shape(), Tensor::ContiguousStrides(t.shape()), t.bytes());
}

int64_t DqRotationHooks::DqFirstKeyTile(int64_t key_tiles) const {
  // flash-attention #2244 class: the walk starts at another key tile, so dQ's fp32 chain adds
  // the tiles in another order (dK, dV are per key tile).
  return static_cast<int64_t>(rotation_ % static_cast<uint64_t>(key_tiles));
}

}  // namespace attest
