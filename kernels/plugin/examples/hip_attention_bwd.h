// The example HIP plugin's attention backward (fp16 in, f32 accumulation, RDNA3 wave32 WMMA):
// per-lane steps shared by the GPU drivers (hip_attention_device.hip) and the CPU drivers
// (hip_attention_emulate.h), as for the forward (hip_attention.h). FlashAttention-2's
// backward (Dao, 2023, Algorithm 2) split into two kernels so that nothing needs atomics and
// every result is deterministic:
//   dK/dV: one block per 16 keys of one (batch, kv head); loops over the query heads of its
//     GQA group and their query tiles. Pᵀ = exp2(K Qᵀ scale_log2 − lse₂), dPᵀ = V dOᵀ,
//     dSᵀ = Pᵀ ∘ (dPᵀ − Δ); dV += Pᵀ dO, dK += dSᵀ Q (times scale at the end). The group's
//     heads are summed in mirrored pairs (g, r − 1 − g), so reversing them is bitwise neutral.
//   dQ: one block per 16 query rows of one (batch, head); loops over key tiles.
//     P = exp2(Q Kᵀ scale_log2 − lse₂), dP = dO Vᵀ, dS = P ∘ (dP − Δ); dQ += dS K (× scale).
// Δ_i = Σ_c dO_ic O_ic from the forward's f16 o (docs/design.md: D = rowsum(dO∘O)), by WMMA as
// dP is (see StoreDelta); P is
// recomputed from the forward's lse; P and dS are rounded to f16 as WMMA operands, dP stays
// f32. Rows with lse = −inf (empty) have P = 0, so dq = 0 there, and keys no query sees get
// dk = dv = 0 (docs/design.md "Empty rows").
#pragma once

#include "kernels/plugin/examples/hip_attention.h"

namespace attest::hip_example {

struct BackwardParams {
  AttentionParams fwd;  // q, k, v, o (the forward's output, read only), lse, sizes, mask
  const _Float16* dout;
  _Float16* dq;
  _Float16* dk;
  _Float16* dv;
  int64_t do_stride[4];
  int64_t dq_stride[4];
  int64_t dk_stride[4];
  int64_t dv_stride[4];
  float scale;  // the plain score scale (dS carries it into dQ and dK)
  int32_t reserved;
};

// One [B, S, H, C] f16 tensor seen from one (batch, head).
struct View {
  const _Float16* p;
  const int64_t* stride;
  int64_t b, h, rows;
  ATTEST_HD _Float16 At(int64_t row, int64_t col) const {
    return row < rows ? p[b * stride[0] + row * stride[1] + h * stride[2] + col * stride[3]]
                      : static_cast<_Float16>(0.0f);
  }
};

// A operand: row r0 + ARow(lane) of the view, element e is feature c0 + e.
ATTEST_HD inline Half16 RowsAsA(int lane, const View& x, int64_t r0, int64_t c0) {
  Half16 f;
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) f[e] = x.At(r0 + wmma::ARow(lane), c0 + e);
  return f;
}
// B operand holding Xᵀ: column n is row r0 + n of the view, element e is feature c0 + e.
ATTEST_HD inline Half16 RowsAsB(int lane, const View& x, int64_t r0, int64_t c0) {
  Half16 f;
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) f[e] = x.At(r0 + wmma::BCol(lane), c0 + e);
  return f;
}
// B operand holding X: column n is feature c0 + n, element e is row r0 + e.
ATTEST_HD inline Half16 FeaturesAsB(int lane, const View& x, int64_t r0, int64_t c0) {
  Half16 f;
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) f[e] = x.At(r0 + e, c0 + wmma::BCol(lane));
  return f;
}
// A operand from a 16x16 f16 tile in LDS: row ARow(lane).
ATTEST_HD inline Half16 TileAsA(int lane, const _Float16 (&t)[kTile][kTile]) {
  Half16 f;
  ATTEST_UNROLL
  for (int e = 0; e < kTile; ++e) f[e] = t[wmma::ARow(lane)][e];
  return f;
}

ATTEST_HD inline View QView(const BackwardParams& p, int64_t b, int64_t h) {
  return {p.fwd.q, p.fwd.q_stride, b, h, p.fwd.seqlen_q};
}
ATTEST_HD inline View KView(const BackwardParams& p, int64_t b, int64_t hkv) {
  return {p.fwd.k, p.fwd.k_stride, b, hkv, p.fwd.seqlen_k};
}
ATTEST_HD inline View VView(const BackwardParams& p, int64_t b, int64_t hkv) {
  return {p.fwd.v, p.fwd.v_stride, b, hkv, p.fwd.seqlen_k};
}
ATTEST_HD inline View DoView(const BackwardParams& p, int64_t b, int64_t h) {
  return {p.dout, p.do_stride, b, h, p.fwd.seqlen_q};
}
ATTEST_HD inline View OView(const BackwardParams& p, int64_t b, int64_t h) {
  return {p.fwd.o, p.fwd.o_stride, b, h, p.fwd.seqlen_q};
}

// LDS of a backward block: per-row statistics of the current query tile and two f16 tiles.
struct BwdShared {
  float lse2[kTile];   // lse · log2(e) of each query row; −inf for empty rows and rows ≥ Sq
  float delta[kTile];  // Δ of each query row
  _Float16 p[kTile][kTile];   // P (dQ kernel: unused) or Pᵀ (dK/dV kernel)
  _Float16 ds[kTile][kTile];  // dS (dQ kernel) or dSᵀ (dK/dV kernel)
};

// Lane `lane` < 16 loads query row i0 + lane's lse (log2 units; −inf for empty rows and
// rows past Sq).
ATTEST_HD inline void LoadRowLse(int lane, const BackwardParams& p, int64_t b, int64_t h,
                                 int64_t i0, BwdShared& sh) {
  if (lane >= kTile) return;
  const int64_t i = i0 + lane;
  const float log2e = 1.44269504088896341f;
  if (i >= p.fwd.seqlen_q) {
    sh.lse2[lane] = NegInf();
    return;
  }
  const float lse = p.fwd.lse[b * p.fwd.lse_stride[0] + h * p.fwd.lse_stride[1] +
                              i * p.fwd.lse_stride[2]];
  sh.lse2[lane] = lse == NegInf() ? NegInf() : lse * log2e;
}

// Δ is the diagonal of a 16x16 WMMA product of dO and O rows (dO Oᵀ in the dQ kernel, O dOᵀ
// in the dK/dV kernel), computed with the same instruction, operand sides and chunking as dP
// (dO Vᵀ) or dPᵀ (V dOᵀ). Where P is one-hot, O equals that key's V and dP − Δ is then
// exactly 0, as in exact arithmetic; a separately summed Δ leaves an f32 rounding there
// that dS turns into spurious gradient (attest's gate found it with Sk = 1).
ATTEST_HD inline void StoreDelta(int lane, const Float8& acc, BwdShared& sh) {
  ATTEST_UNROLL
  for (int r = 0; r < wmma::kAccPerLane; ++r) {
    if (wmma::CRow(lane, r) == wmma::CCol(lane)) sh.delta[wmma::CCol(lane)] = acc[r];
  }
}

// P = exp2(s · scale_log2 − lse₂) where (i, j) is visible and the row is not empty, else 0.
ATTEST_HD inline float Prob(const AttentionParams& p, float s, float lse2, int64_t i,
                            int64_t j) {
  if (!Visible(p, i, j) || lse2 == NegInf()) return 0.0f;
  return Exp2(s * p.scale_log2 - lse2);
}

// The query tiles that can hold a query seeing one of keys j0..j0+15: [*lo, *hi), *lo a
// multiple of 16 (query i sees key j iff i + off − left <= j <= i + off + right).
ATTEST_HD inline void QueryTiles(const AttentionParams& p, int64_t j0, int64_t* lo,
                                 int64_t* hi) {
  const int64_t last = j0 + kTile - 1 < p.seqlen_k - 1 ? j0 + kTile - 1 : p.seqlen_k - 1;
  int64_t a = 0, b = p.seqlen_q;
  if (p.window_right >= 0) {
    a = j0 - p.diag_offset - p.window_right;
    if (a < 0) a = 0;
  }
  if (p.window_left >= 0) {
    b = last - p.diag_offset + p.window_left + 1;
    if (b > p.seqlen_q) b = p.seqlen_q;
  }
  *lo = a / kTile * kTile;
  *hi = b > a ? b : *lo;
}

// dQ kernel, after S (acc_s) and dP (acc_dp) of key tile j0: dS into LDS.
ATTEST_HD inline void StoreDs(int lane, const Float8& acc_s, const Float8& acc_dp,
                              const BackwardParams& p, int64_t q0, int64_t j0, BwdShared& sh) {
  ATTEST_UNROLL
  for (int r = 0; r < wmma::kAccPerLane; ++r) {
    const int row = wmma::CRow(lane, r), col = wmma::CCol(lane);
    const float prob = Prob(p.fwd, acc_s[r], sh.lse2[row], q0 + row, j0 + col);
    sh.ds[row][col] = static_cast<_Float16>(prob * (acc_dp[r] - sh.delta[row]));
  }
}

// dK/dV kernel, after Sᵀ (acc_st) and dPᵀ (acc_dpt) of query tile i0: Pᵀ and dSᵀ into LDS.
ATTEST_HD inline void StorePtDst(int lane, const Float8& acc_st, const Float8& acc_dpt,
                                 const BackwardParams& p, int64_t j0, int64_t i0,
                                 BwdShared& sh) {
  ATTEST_UNROLL
  for (int r = 0; r < wmma::kAccPerLane; ++r) {
    const int row = wmma::CRow(lane, r), col = wmma::CCol(lane);  // row: key, col: query
    const float prob = Prob(p.fwd, acc_st[r], sh.lse2[col], i0 + col, j0 + row);
    sh.p[row][col] = static_cast<_Float16>(prob);
    sh.ds[row][col] = static_cast<_Float16>(prob * (acc_dpt[r] - sh.delta[col]));
  }
}

// Stores a [16 rows x n·16] accumulator (times `factor`) as f16 rows r0.. of `out`.
template <int kChunks>
ATTEST_HD inline void StoreRows(int lane, const Float8 (&acc)[kChunks], float factor,
                                _Float16* out, const int64_t* stride, int64_t b, int64_t h,
                                int64_t r0, int64_t rows) {
  ATTEST_UNROLL
  for (int n = 0; n < kChunks; ++n) {
    ATTEST_UNROLL
    for (int r = 0; r < wmma::kAccPerLane; ++r) {
      const int64_t row = r0 + wmma::CRow(lane, r);
      if (row >= rows) continue;
      const int64_t col = n * kTile + wmma::CCol(lane);
      out[b * stride[0] + row * stride[1] + h * stride[2] + col * stride[3]] =
          static_cast<_Float16>(acc[n][r] * factor);
    }
  }
}

}  // namespace attest::hip_example
