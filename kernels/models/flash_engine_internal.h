// What the engine's translation units share (flash_engine.cc: operands, scores, outputs and the
// default hooks; flash_engine_forward.cc; flash_engine_backward.cc). Not an interface: only
// the engine includes it. Every file of the engine is compiled with -ffp-contract=off
// (kernels/CMakeLists.txt), so splitting it changes no bit (flash_engine.h "Arithmetic").
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/models/flash_engine.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"

namespace attest::engine_detail {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// C[i, j] += Σ_p A(i, p) · B[p, j] for p ascending (one sequential fp32 chain per element),
// with A(i, p) = A[i·a_row + p·a_col]. Defined in flash_engine.cc, where GCC on x86-64 clones
// it for AVX2 (the same bits: flash_engine.cc says why); callers here see the plain symbol.
void GemmAcc(float* __restrict c, int64_t ldc, const float* __restrict a, int64_t a_row,
             int64_t a_col, const float* __restrict b, int64_t ldb, int64_t m, int64_t n,
             int64_t kdim);

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

// A [tokens, heads, width] fp32 operand (padded [B, S, H, W] has the same memory order).
struct Operand {
  std::vector<float> values;
  int64_t heads = 0;
  int64_t width = 0;
  const float* Row(int64_t token, int64_t head) const {
    return values.data() + (token * heads + head) * width;
  }
};

// The tensor's values rounded to the problem's dtype, as floats.
std::vector<float> InputFloats(const Tensor& t, DType dtype);
// The tensor's values as floats (exact for the f32 and narrower tensors the engine reads).
std::vector<float> Floats(const Tensor& t);
// `raw` represented as the GEMM operand `quant` says (through hooks.QuantizeInput).
Expected<Operand> Prepare(const Problem& p, const Operand& raw, const OperandQuant& quant,
                          const EngineHooks& hooks);
// An intermediate tile (P or dS, [rows, cols] row-major) represented as `quant` says; its
// blocks run along the queries (axis 0) when the GEMM contracts over them (`contract_rows`).
Status RoundTile(std::vector<float>& tile, int64_t rows, int64_t cols, const OperandQuant& quant,
                 bool contract_rows);
// Copies rows [token0, token0 + n) of one head into a contiguous [n, width] tile, or its
// transpose [width, n].
void GatherRows(const Operand& op, int64_t token0, int64_t head, int64_t n, float* out);
void GatherRowsTransposed(const Operand& op, int64_t token0, int64_t head, int64_t n, float* out);

// Softmax parameters (flash_api.cpp set_params_fprop).
struct ScoreParams {
  float scale_softmax = 1;   // multiplies the row max in lse; softcap: the cap
  float scale_log2 = 1;      // scale_softmax · log2(e), rounded once to float
  float softcap_in = 0;      // softcap: softmax_scale / cap (the tanh argument's factor)
  float grad_scale = 1;      // the softmax scale, applied to dQ and dK at the end
  std::vector<float> alibi;  // per query head: slope / scale_softmax (flash_fwd_kernel.h)
  // EngineOptions::rel_bias as float32 / scale_softmax, [Hq, width]; empty without it.
  std::vector<float> rel_bias;
  int64_t rel_width = 0, rel_center = 0;  // width, and the column of i - j = 0 (Sk - 1)
};
// `rel_bias`: EngineOptions::rel_bias (null without one).
ScoreParams MakeScoreParams(const Problem& p, const Tensor* rel_bias = nullptr);

// Scores of a tile in place: raw q·k → softcap (hooks.Softcap) → ALiBi → mask (-inf), the
// visibility `vis` from reference/problem/tile_walk.h TileVisibility; the arithmetic is the
// kernel's (fp32, one FFMA for ALiBi), the order of the rules mask.h's.
// `tanh_out` receives tanh values for the softcap derivative (backward).
void TransformScores(const ScoreParams& sp, const EngineHooks& hooks, const MaskView& mask,
                     int64_t head, int64_t m0, int64_t mlen, int64_t n0, int64_t nlen,
                     const std::vector<uint8_t>& vis, std::vector<float>& s,
                     std::vector<float>* tanh_out);

// The flat index of row i of head h of sequence b in the lse layout.
int64_t LseIndex(const Problem& p, int64_t b, int64_t h, int64_t i);
// A tensor of `shape` holding `values` (already rounded to `format`) in `format`.
Tensor MakeOutput(const Shape& shape, const std::vector<float>& values, Format format);
Format InputFormat(const Problem& p);

// The hooks a run uses: the options' own, or the correct defaults.
const EngineHooks& HooksOf(const EngineOptions& options);

// FlashForward / FlashBackward on a paged or seqused problem (flash_engine_paged.cc).
KernelAnswer<ForwardResult> PagedForward(const Problem& p, const Recipe& recipe, const Tensor& q,
                                         const Tensor& k, const Tensor& v,
                                         const EngineOptions& options);
KernelAnswer<BackwardResult> PagedBackward(const Problem& p, const Recipe& recipe,
                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& o, const Tensor& lse,
                                           const Tensor& dout, const EngineOptions& options);

}  // namespace attest::engine_detail
