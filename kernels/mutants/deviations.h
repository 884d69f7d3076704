// The deviations of the mutant catalogue (mutants.h) that are not recipe edits or problem
// faults: wrappers that edit what the parent kernel returns or reads, and hooks that substitute
// one step inside the engine's tiled loop (kernels/models/flash_engine.h EngineHooks). Each is
// the bug as the real kernel has it, named after its class; the correct models never see them.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"
#include "kernels/models/flash_engine.h"
#include "reference/problem/problem.h"

namespace attest {

// ---- Wrappers: a deviation expressible on the parent's outputs or inputs ----------------------

// Edits the parent's forward outputs for problem `p`; `options` are the parent's engine options
// (tile sizes).
using ForwardEdit = void (*)(const Problem& p, const EngineOptions& options, ForwardResult& out);
// The o the backward reads to form D = rowsum(dO∘O), from the o it was given.
using BackwardOEdit = Tensor (*)(const Tensor& o);

// lse returned in the kernel's internal base 2: lse · log2(e), in fp32.
void LseInLog2Units(const Problem& p, const EngineOptions& options, ForwardResult& out);
// o stored with its d-columns 0 and 1 exchanged (every row keeps its norm).
void SwapOColumns01(const Problem& p, const EngineOptions& options, ForwardResult& out);
// The last query tile of every sequence, when partial, never written: its rows of o and lse keep
// the output buffer's poison bytes (kernels/kernel.h kOutputPoisonByte).
void SkipLastPartialQueryTile(const Problem& p, const EngineOptions& options, ForwardResult& out);
// No empty-row guard: a row with no visible key (lse = −inf, the engine's convention) normalised
// as 0 · (1 / 0), so its o is NaN.
void NanInEmptyRows(const Problem& p, const EngineOptions& options, ForwardResult& out);
// D formed from o rounded to E4M3 (saturating): another O than the one forward returned.
Tensor OAsE4m3(const Tensor& o);
// An input as a kernel that ignores strides reads it: its elements in row-major order from
// the first element's address, as if the tensor were contiguous (the same tensor when it is).
using InputEdit = Tensor (*)(const Tensor& t);
Tensor ReadAsContiguous(const Tensor& t);

// ---- Hooks: a deviation inside the tiled loop -------------------------------------------------

// Forward: a lazy online-softmax rescale that keeps the stale row max unless the new one exceeds
// it by more than 8 in log2 units, so P grows up to 2^8.
const EngineHooks& LazyRescaleHooks();
// Forward: the key tiles in two split-KV halves combined with weights l_s / Σ l instead of
// exp(lse_s − lse) (the lse itself combined right).
const EngineHooks& SplitKvBadCombineHooks();
// Split-KV at the problem's declared split count (cpu/flash2-splitkv-bf16's parent): a combine
// that never divides by Σ_s exp(lse_s − m); the sink folded into every split's partial sum; a
// split's key range one key too long (its boundary key read by two splits).
const EngineHooks& SplitKvUnnormalisedCombineHooks();
const EngineHooks& SplitKvSinkPerSplitHooks();
const EngineHooks& SplitKvBoundaryOffByOneHooks();
// Forward: lse = (max · scale) · scale + log(sum): the max scaled twice.
const EngineHooks& LseScaledTwiceHooks();
// Backward: the lse read as already in base 2 (the pair of LseInLog2Units).
const EngineHooks& LseLog2BackwardHooks();
// Forward and backward: softcap computed as t · tanh(t) for t = scale · q·k.
const EngineHooks& SoftcapSTanhSHooks();
// Backward: dS not multiplied by softcap's derivative 1 − tanh².
const EngineHooks& SoftcapNoDerivativeHooks();
// Forward and backward: query head h reads kv head h % Hkv (a group: heads r · Hkv + g).
const EngineHooks& GqaHeadModHooks();
// Backward: a tile that straddles the mask's bound computed as if fully visible.
const EngineHooks& DiagTileUnmaskedHooks();
// Forward: a tile that straddles the mask's bound computed as if fully visible.
const EngineHooks& ForwardDiagTileUnmaskedHooks();
// Forward: the O accumulator not rescaled when a row's max grows (the row sum is).
const EngineHooks& AccNotRescaledHooks();
// Backward: the outer loop over key tiles stops one tile early.
const EngineHooks& LastKeyTileSkippedHooks();
// Backward: P recomputed as exp2(s − lse) everywhere, without the guard for masked entries and
// empty rows (NaN there).
const EngineHooks& MaskedDsNanHooks();
// Input operands: the MX E8M0 scale exponent one too small (saturating elements).
const EngineHooks& MxScaleOffByOneHooks();
// Input operands: a block of amax 0 dequantised through 0/0 = NaN.
const EngineHooks& ZeroAmaxBlockNanHooks();
// Backward: the dK, dV accumulators stored with 9 significant bits between query tiles by
// truncation (round toward zero), read back as fp32 for the next tile.
const EngineHooks& TruncatedBackwardAccumulatorHooks();
// Paged KV: every page index read one page further into the pool.
const EngineHooks& PageOffByOneHooks();
// Paged KV: a sequence's last page read whole, past seqused_k (or its key length).
const EngineHooks& LastPageOverreadHooks();
// seqused_k honoured by the forward only: the backward runs over every key of the sequence.
const EngineHooks& SequsedKIgnoredInBackwardHooks();

// Backward: dQ's walk over the key tiles starts at tile `rotation` mod the tile count.
class DqRotationHooks : public EngineHooks {
 public:
  explicit DqRotationHooks(uint64_t rotation) : rotation_(rotation) {}
  int64_t DqFirstKeyTile(int64_t key_tiles) const override;

 private:
  uint64_t rotation_;
};

}  // namespace attest
