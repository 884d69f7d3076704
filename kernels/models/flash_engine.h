// The recipe-driven tiled CPU numerics engine: FlashAttention-2's forward and backward
// (Dao, "FlashAttention-2", arXiv 2307.08691, Algorithms 1 and 2; flash-attention
// csrc/flash_attn/src/flash_fwd_kernel.h, flash_bwd_kernel.h, softmax.h, mask.h) run on the
// CPU in fp32 with configurable tiles, with every operand represented as a Recipe
// (reference/recipes/recipe.h) says. The CPU models of kernels/models/ are this engine plus a
// recipe, tile sizes and a backward variant; docs/kernels.md lists each rounding point.
//
// Arithmetic: float, evaluated in a fixed order (no reassociation; the engine is compiled with
// -ffp-contract=off) so that results are bitwise reproducible on any thread count. Where the
// GPU fuses a multiply-add in the softmax (FA2's scale_apply_exp2: exp2f(s·scale_log2 −
// max_scaled) is one FFMA) the engine computes the fused result exactly (FmaF32). GEMM
// products of bf16/f16 operands are exact in fp32, so only the accumulation order matters,
// and it is tile order: keys in ascending tiles for O and dQ, queries for dK and dV as the
// modelled kernel walks them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "reference/problem/problem.h"
#include "reference/recipes/recipe.h"
#include "reference/tensor.h"

namespace attest {

// How the backward walks the tiles.
enum class BackwardVariant : uint8_t {
  // FlashAttention-2 (flash_bwd_kernel.h compute_dq_dk_dv_1colblock): key tiles outer (in
  // ascending order), query tiles inner from the last to the first; dK, dV accumulated over
  // the query tiles of one key tile; dQ accumulated in fp32 across key tiles in ascending
  // order (the deterministic order of FA2's atomics); GQA dk/dv per query head rounded to the
  // input dtype, then summed over the group and rounded again (flash_api.cpp mha_bwd:
  // dk_expanded in the input dtype, at::sum_out over the group).
  kFlash2,
  // The RDNA3 fused backward (no atomics): pass 1 walks, for each query tile, every key tile
  // in ascending order and accumulates dQ in registers; pass 2 walks, for each key tile,
  // every query tile in ascending order and accumulates dK and dV. dP = dO·Vᵀ is produced by
  // an fp16-output GEMM (rounded to fp16) and dS = P∘(dP − D) is formed and rounded in fp16.
  kFusedNoAtomics,
};

// The rows of a query tile's online softmax (flash_fwd_kernel.h: acc_o, row_max, row_sum):
// fp32 O accumulator [rows, Dv], row max in score units, row sum of P.
struct SoftmaxRows {
  std::vector<float> acc, row_max, row_sum;
  SoftmaxRows(int64_t rows, int64_t dv);
};

// Hook points of the engine. A seeded bug whose deviation lives inside the tiled loop (the
// mutant catalogue, kernels/mutants/mutants.h) substitutes one step here; every other
// deviation is a recipe edit or a wrapper around the parent kernel, so the correct models never
// test a fault. Each hook is a coarse point (per operand, per tile or per row, never per element
// of a GEMM), and each default is the correct step: the engine runs exactly these when
// EngineOptions::hooks is null, as every correct model does.
class EngineHooks {
 public:
  virtual ~EngineHooks() = default;

  // An input operand (Q, K, V, dO) represented as its recipe's scheme says, for schemes other
  // than kNone: reference/recipes/recipe.h QuantizeOperand over `shape` blocked along `axis`.
  virtual Expected<std::vector<float>> QuantizeInput(std::span<const float> values,
                                                     const Shape& shape, int64_t axis,
                                                     const OperandScheme& scheme) const;

  // GQA: the kv head that query head h reads (h / (Hq/Hkv)), and the r-th query head of kv head
  // g's group (g · Hq/Hkv + r; the backward sums a group's dK, dV in r order).
  virtual int64_t KvHead(const Problem& p, int64_t h) const;
  virtual int64_t GroupHead(const Problem& p, int64_t g, int64_t r) const;

  // Softcap of n raw scores x = q·k in place, before the cap multiplies back (folded into the
  // exp2's scale): flash::apply_softcap, x ← tanh(x · softmax_scale / cap). `tanh_out` (null in
  // the forward) receives the tanh values for the backward's derivative.
  virtual void Softcap(float softmax_scale, float cap, float* s, float* tanh_out,
                       int64_t n) const;

  // Forward online softmax (softmax.h softmax_rescale_o): the row max a row keeps after a tile,
  // given the previous one and the max over both; scale_log2 converts score units to log2.
  virtual float RowMax(float previous, float candidate, float scale_log2) const;

  // Forward online softmax: the fp32 O accumulator of a row (dv values) multiplied by
  // `rescale` = exp2((old max − new max) · scale_log2) when its max grows (FA2 Algorithm 1,
  // line 10; softmax.h softmax_rescale_o's acc_o *= scores_scale).
  virtual void RescaleAcc(float* acc, int64_t dv, float rescale) const;
  // Forward: the visibility of a tile with `visible` visible pairs, as the forward's mask step
  // leaves it (correct: unchanged; the pair of BackwardTileMask).
  virtual void ForwardTileMask(int64_t visible, std::vector<uint8_t>& vis) const;

  // Forward split-KV (flash-decoding): a split count forced on every problem (correct: 1,
  // none forced: the problem's Problem::num_splits, 0 meaning one).
  virtual int KvSplits() const;
  // The end (exclusive) of a split's key range that is not the last, given the correct one
  // (a tile multiple) and the sequence's key count (correct: `end`); the next split starts at
  // the correct end whatever this returns.
  virtual int64_t KvSplitEnd(int64_t end, int64_t k_len) const;
  // Row i of the splits' states combined into o (Dv values rounded by `out_round`) and its lse
  // (flash_fwd_kernel.h combine_attn_seqk_parallel, in fp32): lse_s = max_s · scale + log l_s
  // (−inf for a split that saw no key), m = max(max_s lse_s, sink),
  // lse = m + log(Σ_s exp(lse_s − m) + exp(sink − m)), o = Σ_s exp(lse_s − lse) · acc_s / l_s.
  // `sink` is the head's learnable sink (−inf: none), one term of the denominator with no
  // value, entering once (docs/semantics.md "Learnable sink"); every split empty: o = 0 and
  // lse = sink.
  virtual void CombineKvSplits(std::span<const SoftmaxRows* const> parts, int64_t i, int64_t dv,
                               float scale_softmax, float sink, const OperandScheme& out_round,
                               float* o, float* lse) const;

  // Forward: the lse of a row with a positive sum, lse = max · scale + log(sum) as one FMA
  // (softmax.h normalize_softmax_lse).
  virtual float RowLse(float row_max, float row_sum, float scale_softmax) const;

  // Backward: the lse in log2 units, as P's recomputation subtracts it (lse · log2 e).
  virtual float LseLog2(float lse) const;
  // Backward: the visibility of a tile with `visible` visible pairs (vis: 1 where visible),
  // as the backward's mask step leaves it (correct: unchanged).
  virtual void BackwardTileMask(int64_t visible, std::vector<uint8_t>& vis) const;
  // Backward: one row of P recomputed in place from its n scores, P = exp2(s · scale_log2 −
  // lse_log2), 0 where masked and in rows with a non-finite lse (empty rows).
  virtual void RecomputeP(float* s, const uint8_t* vis, int64_t n, float lse, float lse_log2,
                          float scale_log2) const;
  // Backward under softcap: dS ← dS · (1 − tanh²) for n entries of a tile.
  virtual void SoftcapDerivative(float* ds, const float* tanh, int64_t n) const;
  // Backward: the key tile (of `key_tiles`) that the walk accumulating dQ starts at, going up
  // and wrapping around (correct: 0, the deterministic ascending order).
  virtual int64_t DqFirstKeyTile(int64_t key_tiles) const;
  // Backward: how many of a sequence's `key_tiles` key tiles the outer loop visits (correct:
  // all of them); the tiles left out keep dK = dV = 0 and add nothing to dQ.
  virtual int64_t BackwardKeyTiles(int64_t key_tiles) const;
  // Backward: the fp32 dK and dV accumulators of a key tile (n values each call) after a query
  // tile added into them, as the kernel stores them between tiles (correct: unchanged, the
  // accumulator stays in fp32 registers).
  virtual void StoreBackwardAccumulator(float* acc, int64_t n) const;
  // Paged KV and seqused (flash_engine_paged.cc): the pool row of key j of sequence b
  // (correct: reference/problem/paged.h KeyRow) and how many keys sequence b has in the
  // forward or the backward (correct: UsedKLen in both).
  virtual int64_t PagedKeyRow(const Problem& p, int64_t b, int64_t j) const;
  virtual int64_t UsedKeys(const Problem& p, int64_t b, bool backward) const;
};

struct EngineOptions {
  int64_t fwd_block_m = 128;  // FA2 hdim128 forward on sm80: Flash_fwd_kernel_traits<128,128,64>
  int64_t fwd_block_n = 64;
  int64_t bwd_block_m = 64;  // FA2 hdim128 backward on sm80: Flash_bwd_kernel_traits<128,64,128>
  int64_t bwd_block_n = 128;
  BackwardVariant backward = BackwardVariant::kFlash2;
  int threads = 0;  // 0: hardware_concurrency(); results do not depend on it
  // Null: the correct algorithm. Else the hooks a mutant substitutes (not owned; must outlive
  // the call).
  const EngineHooks* hooks = nullptr;
  // The learnable sink [Hq] (f64 holding float32 values) of a problem with Problem::sink (not
  // owned); required exactly then. The forward folds exp(sink_h) into each finished row's sum
  // in fp32 (after the online softmax, as FlashAttention-4's learnable_sink enters at the
  // row's end), the backward returns BackwardResult::dsink in fp32.
  const Tensor* sink = nullptr;
  // The learnable relative bias [Hq, Sq + Sk - 1] (f64 holding float32 values) of a problem
  // with Problem::rel_bias (not owned); required exactly then. The forward adds
  // bias / scale_softmax in fp32 to each visible score after softcap and ALiBi (the ALiBi
  // slope's units, flash_fwd_kernel.h); the backward returns BackwardResult::drel_bias, the
  // diagonal sums of dS accumulated in fp32 (what a fused kernel's fp32 accumulators or
  // atomics hold) per (sequence, head) in the tile walk's order, then over the batch, stored
  // as F32.
  const Tensor* rel_bias = nullptr;
};

// The format the backward rounds dP = dO·Vᵀ to before dP − D, or nullopt (kept in fp32):
// the recipe's `dp` when it names one, else fp16 for kFusedNoAtomics (its fp16-output WMMA),
// else nullopt. The engine rounds exactly here, and kernels report it (Kernel::
// BackwardDpFormat) so that checks can bound it.
std::optional<Format> BackwardDpFormat(const Recipe& recipe, const EngineOptions& options);


// The fused multiply-add a·b + c rounded once to float, computed without hardware FMA (the
// product of two floats is exact in double; the sum is formed with round-to-odd so that the
// final rounding to float is correct). Exposed for its test.
float FmaF32(float a, float b, float c);

// Forward: o in the recipe's output format (the input dtype: BF16/F16 codes), lse F32
// [B, Hq, Sq] (packed [Hq, total_q]). Empty rows: o = 0, lse = -inf (DESIGN's convention;
// FlashAttention-2 itself writes +inf there, see docs/kernels.md). Inputs: any float dtype
// holding the problem's dtype values; they are rounded to the problem's dtype on entry,
// because that is all a kernel of that dtype can see.
KernelAnswer<ForwardResult> FlashForward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                         const Tensor& k, const Tensor& v,
                                         const EngineOptions& options = {});

// Backward of the forward that produced (o, lse): dq, dk, dv in the input dtype.
KernelAnswer<BackwardResult> FlashBackward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& o,
                                           const Tensor& lse, const Tensor& dout,
                                           const EngineOptions& options = {});

// Why the engine cannot run `p` under `recipe` (dtype outside the recipe, a feature the
// engine does not model, invalid tiles), or "" when it can.
std::string EngineUnsupportedReason(const Problem& p, const Recipe& recipe,
                                    const EngineOptions& options);

}  // namespace attest
