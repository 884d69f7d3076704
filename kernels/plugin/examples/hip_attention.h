// The example HIP plugin's attention forward (fp16 in, f32 accumulation, RDNA3 wave32 WMMA):
// every per-lane step of the kernel, written once and compiled both for the GPU
// (hip_attention_device.hip, clang++-19 for gfx1100 / gfx1151) and for the host, where
// hip_attention_emulate.h runs the same steps lane by lane with a CPU model of the WMMA
// instruction. Semantics are docs/design.md's (flash_attn_func layout, bottom-right or top-left
// causal, sliding window on the same diagonal, GQA head h -> h / (Hq / Hkv), empty rows
// o = 0 and lse = -inf); the algorithm is FlashAttention-2's forward (Dao, 2023, Algorithm 1)
// with one 16-row query tile per wave and 16-key tiles.
//
// One block = one wave of 32 lanes = 16 query rows of one (batch, head). Per key tile:
//   1. S = Q Kᵀ: D/16 WMMAs (A = Q rows, B = K rows as columns), scaled to log2 units and
//      masked, written to LDS;                                               barrier
//   2. lanes 0..15 each own a row: running max m, P = exp2(S - m) rounded to f16 into LDS,
//      running f32 sum l, rescale factor alpha = exp2(m_old - m_new);        barrier
//   3. O = alpha O + P V: Dv/16 WMMAs (A = P rows from LDS, B = V columns).
// Then l and the lse per row, and O / l stored as f16.
#pragma once

#if !defined(__HIP_DEVICE_COMPILE__)
#include <cmath>
#endif
#include <stdint.h>

#include "kernels/plugin/examples/hip_wmma.h"

namespace attest::hip_example {

using wmma::Float8;
using wmma::Half16;
using wmma::kTile;

// Kernel arguments, identical on host (g++) and device (clang amdgcn): 8-byte fields first.
// Strides are in elements; q, k, v, o are [B, S, H, D] and lse is [B, H, Sq].
struct AttentionParams {
  const _Float16* q;
  const _Float16* k;
  const _Float16* v;
  _Float16* o;
  float* lse;
  int64_t q_stride[4];
  int64_t k_stride[4];
  int64_t v_stride[4];
  int64_t o_stride[4];
  int64_t lse_stride[3];
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int64_t window_left;   // -1 = unbounded
  int64_t window_right;  // -1 = unbounded; causal is folded in here as (.., 0)
  int64_t diag_offset;   // Sk - Sq (bottom-right) or 0 (top-left)
  float scale_log2;      // scale * log2(e): scores are kept in log2 units (exp2 is native)
  int32_t reserved;
};

// LDS of one block.
struct TileShared {
  float s[kTile][kTile];     // scaled, masked scores of the current key tile
  _Float16 p[kTile][kTile];  // probabilities rounded to f16: the A operand of P V
  float m[kTile];            // running row maximum (log2 units; -inf before any key)
  float l[kTile];            // running row sum of the f32 probabilities
  float alpha[kTile];        // this tile's rescale factor exp2(m_old - m_new)
  float inv_l[kTile];        // 1 / l, or 0 for an empty row
};

template <int kD, int kDv>
struct LaneRegs {
  static_assert(kD % kTile == 0 && kDv % kTile == 0, "head dims are multiples of 16");
  Half16 q[kD / kTile];    // A fragments of this block's 16 query rows
  Float8 o[kDv / kTile];   // accumulators of O, 16 columns each
};

struct BlockIndex {
  int64_t b, h, hkv, q0;
};

ATTEST_HD inline float NegInf() { return -__builtin_huge_valf(); }

ATTEST_HD inline float Exp2(float x) {
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_exp2f(x);  // v_exp_f32; exp2(-inf) = 0
#else
  return std::exp2(x);
#endif
}

ATTEST_HD inline float Log2(float x) {
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_logf(x);  // v_log_f32 is log2
#else
  return std::log2(x);
#endif
}

// Grid: x = query tile, y = query head, z = batch.
ATTEST_HD inline BlockIndex MakeBlockIndex(const AttentionParams& p, int64_t x, int64_t y,
                                           int64_t z) {
  BlockIndex blk;
  blk.b = z;
  blk.h = y;
  blk.hkv = y / (p.heads_q / p.heads_kv);
  blk.q0 = x * kTile;
  return blk;
}

// docs/design.md "Masks" (reference/problem/mask.cc MaskView::InBand for causal and windows).
ATTEST_HD inline bool Visible(const AttentionParams& p, int64_t i, int64_t j) {
  if (i < 0 || i >= p.seqlen_q || j < 0 || j >= p.seqlen_k) return false;
  const int64_t diag = i + p.diag_offset;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  return true;
}

// The key tiles that can hold a key visible to one of the block's rows: [*lo, *hi), *lo a
// multiple of 16, empty when no row sees anything. Tiles outside are skipped; inside, every
// element is still masked with Visible, so the bounds only have to be conservative.
ATTEST_HD inline void KeyTiles(const AttentionParams& p, int64_t q0, int64_t* lo, int64_t* hi) {
  const int64_t last = q0 + kTile - 1 < p.seqlen_q - 1 ? q0 + kTile - 1 : p.seqlen_q - 1;
  int64_t a = 0, b = p.seqlen_k;
  if (p.window_left >= 0) {
    a = q0 + p.diag_offset - p.window_left;
    if (a < 0) a = 0;
  }
  if (p.window_right >= 0) {
    b = last + p.diag_offset + p.window_right + 1;
    if (b > p.seqlen_k) b = p.seqlen_k;
  }
  *lo = a / kTile * kTile;
  *hi = b > a ? b : *lo;
}

template <int kD, int kDv>
ATTEST_HD inline void InitLane(int lane, LaneRegs<kD, kDv>& regs, const AttentionParams& p,
                               const BlockIndex& blk, TileShared& sh) {
  if (lane < kTile) {
    sh.m[lane] = NegInf();
    sh.l[lane] = 0.0f;
  }
  // A fragments of Q: row ARow(lane), columns kk * 16 + e; rows past Sq are zeros.
  const int64_t i = blk.q0 + wmma::ARow(lane);
  ATTEST_UNROLL
  for (int kk = 0; kk < kD / kTile; ++kk) {
    ATTEST_UNROLL
    for (int e = 0; e < kTile; ++e) {
      regs.q[kk][e] = i < p.seqlen_q
                          ? p.q[blk.b * p.q_stride[0] + i * p.q_stride[1] +
                                blk.h * p.q_stride[2] + (kk * kTile + e) * p.q_stride[3]]
                          : static_cast<_Float16>(0.0f);
    }
  }
  ATTEST_UNROLL
  for (int n = 0; n < kDv / kTile; ++n) {
    ATTEST_UNROLL
    for (int r = 0; r < wmma::kAccPerLane; ++r) regs.o[n][r] = 0.0f;
  }
}

// B fragment of Kᵀ for head-dim chunk kk: column BCol(lane) is key j0 + BCol(lane), element
// e is head-dim index kk * 16 + e. Keys past Sk are zeros (and masked in StoreScores).
ATTEST_HD inline Half16 KFragment(int lane, int kk, const AttentionParams& p,
                                  const BlockIndex& blk, int64_t j0) {
  Half16 frag;
  const int64_t j = j0 + wmma::BCol(lane);
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) {
    frag[e] = j < p.seqlen_k ? p.k[blk.b * p.k_stride[0] + j * p.k_stride[1] +
                                   blk.hkv * p.k_stride[2] + (kk * kTile + e) * p.k_stride[3]]
                             : static_cast<_Float16>(0.0f);
  }
  return frag;
}

// Step 1's end: the accumulator of S, scaled to log2 units and masked, into LDS.
ATTEST_HD inline void StoreScores(int lane, const Float8& acc, const AttentionParams& p,
                                  const BlockIndex& blk, int64_t j0, TileShared& sh) {
  ATTEST_UNROLL
  for (int r = 0; r < wmma::kAccPerLane; ++r) {
    const int row = wmma::CRow(lane, r), col = wmma::CCol(lane);
    sh.s[row][col] =
        Visible(p, blk.q0 + row, j0 + col) ? acc[r] * p.scale_log2 : NegInf();
  }
}

// Step 2: lane `row` < 16 updates its row's running max and sum and writes P (f16) and alpha.
ATTEST_HD inline void SoftmaxRow(int lane, TileShared& sh) {
  if (lane >= kTile) return;
  const int row = lane;
  float tile_max = NegInf();
  ATTEST_UNROLL
  for (int j = 0; j < kTile; ++j) tile_max = sh.s[row][j] > tile_max ? sh.s[row][j] : tile_max;
  const float m_old = sh.m[row];
  const float m_new = tile_max > m_old ? tile_max : m_old;
  if (m_new == NegInf()) {
    // Nothing visible yet: O and l stay zero; alpha = 1 keeps them so.
    ATTEST_UNROLL
    for (int j = 0; j < kTile; ++j) sh.p[row][j] = static_cast<_Float16>(0.0f);
    sh.alpha[row] = 1.0f;
    return;
  }
  float sum = 0.0f;
  ATTEST_UNROLL
  for (int j = 0; j < kTile; ++j) {
    const float pj = Exp2(sh.s[row][j] - m_new);  // masked: exp2(-inf) = 0
    sum += pj;
    sh.p[row][j] = static_cast<_Float16>(pj);
  }
  const float alpha = Exp2(m_old - m_new);  // m_old = -inf: 0
  sh.alpha[row] = alpha;
  sh.l[row] = sh.l[row] * alpha + sum;
  sh.m[row] = m_new;
}

// Step 3's start: rescale this lane's accumulators by their rows' alpha.
template <int kD, int kDv>
ATTEST_HD inline void RescaleO(int lane, LaneRegs<kD, kDv>& regs, const TileShared& sh) {
  ATTEST_UNROLL
  for (int n = 0; n < kDv / kTile; ++n) {
    ATTEST_UNROLL
    for (int r = 0; r < wmma::kAccPerLane; ++r) regs.o[n][r] *= sh.alpha[wmma::CRow(lane, r)];
  }
}

// A fragment of P: row ARow(lane) of the tile's probabilities, element e is key j0 + e.
ATTEST_HD inline Half16 PFragment(int lane, const TileShared& sh) {
  Half16 frag;
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) frag[e] = sh.p[wmma::ARow(lane)][e];
  return frag;
}

// B fragment of V for output chunk n: column BCol(lane) is output column n * 16 + BCol(lane),
// element e is key j0 + e (zeros past Sk, where P is zero too).
ATTEST_HD inline Half16 VFragment(int lane, int n, const AttentionParams& p,
                                  const BlockIndex& blk, int64_t j0) {
  Half16 frag;
  const int64_t col = n * kTile + wmma::BCol(lane);
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) {
    const int64_t j = j0 + e;
    frag[e] = j < p.seqlen_k ? p.v[blk.b * p.v_stride[0] + j * p.v_stride[1] +
                                   blk.hkv * p.v_stride[2] + col * p.v_stride[3]]
                             : static_cast<_Float16>(0.0f);
  }
  return frag;
}

// After the last tile: lane `row` < 16 writes 1 / l to LDS and its row's lse (natural log).
ATTEST_HD inline void FinalizeRow(int lane, const AttentionParams& p, const BlockIndex& blk,
                                  TileShared& sh) {
  if (lane >= kTile) return;
  const int row = lane;
  const float l = sh.l[row];
  sh.inv_l[row] = l > 0.0f ? 1.0f / l : 0.0f;  // empty row: o = 0
  const int64_t i = blk.q0 + row;
  if (i < p.seqlen_q) {
    // lse = ln(sum_j e^{scale s_j}) = ln 2 (m + log2 l) with m, l in log2 units.
    const float ln2 = 0.693147180559945309f;
    p.lse[blk.b * p.lse_stride[0] + blk.h * p.lse_stride[1] + i * p.lse_stride[2]] =
        l > 0.0f ? (sh.m[row] + Log2(l)) * ln2 : NegInf();
  }
}

template <int kD, int kDv>
ATTEST_HD inline void StoreO(int lane, const LaneRegs<kD, kDv>& regs, const AttentionParams& p,
                             const BlockIndex& blk, const TileShared& sh) {
  ATTEST_UNROLL
  for (int n = 0; n < kDv / kTile; ++n) {
    ATTEST_UNROLL
    for (int r = 0; r < wmma::kAccPerLane; ++r) {
      const int row = wmma::CRow(lane, r);
      const int64_t i = blk.q0 + row;
      if (i >= p.seqlen_q) continue;
      const int64_t col = n * kTile + wmma::CCol(lane);
      p.o[blk.b * p.o_stride[0] + i * p.o_stride[1] + blk.h * p.o_stride[2] +
          col * p.o_stride[3]] = static_cast<_Float16>(regs.o[n][r] * sh.inv_l[row]);
    }
  }
}

}  // namespace attest::hip_example
