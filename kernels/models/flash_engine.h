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
#include <string>

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

// Seeded faults for the mutant catalogue (kernels/mutants/mutants.h): each one a small,
// realistic deviation from the correct algorithm, named after the real bug class it
// reproduces. Every fault is off by default, and with all of them off the engine computes
// bitwise what it computed before the hooks existed (docs/kernels.md "Mutants" says how that
// was checked).
struct EngineFaults {
  // Forward.
  bool empty_row_nan = false;          // no empty-row guard: o = 0 · (1/0) = NaN
  bool lse_log2 = false;               // lse returned in log2 units (the kernel's internal base)
  bool lse_scaled_twice = false;       // lse = m · scale² + log(l): the max scaled twice
  bool split_kv_bad_combine = false;   // two KV splits combined with weights l_i / Σl (no
                                       // exp(m_i − m) rescale)
  float rescale_threshold_log2 = 0;    // > 0: the row max is only updated when it grows by more
                                       // than this (log2 units), so P reaches 2^threshold
  bool store_swap_columns = false;     // o stored with d-columns 0 and 1 swapped (norm kept)
  bool skip_last_partial_tile = false; // the last partial query tile is never written
  // Scores (forward and backward).
  bool softcap_s_tanh_s = false;       // softcap computed as s · tanh(s)
  bool gqa_head_mod = false;           // query head h reads kv head h % Hkv
  // Backward.
  bool softcap_no_bwd_derivative = false;  // dS not multiplied by 1 − tanh²
  bool bwd_diag_tile_unmasked = false;     // partially masked tiles computed without the mask
  bool masked_ds_nan = false;              // P = exp2(s − lse) everywhere: NaN in empty rows
  std::optional<Format> delta_o_format;    // D from O rounded to this format (saturating)
  uint64_t dq_order_rotation = 0;          // dQ's key tiles walked starting at this tile
  // Block-scaled input operands (forward and backward).
  int mx_scale_offset = 0;                 // MX E8M0 scale exponent off by this much
  bool zero_amax_block_nan = false;        // a block of amax 0 dequantises to 0/0 = NaN

  bool operator==(const EngineFaults&) const = default;
};

struct EngineOptions {
  int64_t fwd_block_m = 128;  // FA2 hdim128 forward on sm80: Flash_fwd_kernel_traits<128,128,64>
  int64_t fwd_block_n = 64;
  int64_t bwd_block_m = 64;  // FA2 hdim128 backward on sm80: Flash_bwd_kernel_traits<128,64,128>
  int64_t bwd_block_n = 128;
  BackwardVariant backward = BackwardVariant::kFlash2;
  int threads = 0;  // 0: hardware_concurrency(); results do not depend on it
  EngineFaults faults;  // all off: the correct algorithm
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
