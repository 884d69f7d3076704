// Device code of the example HIP plugin: the WMMA attention forward (hip_attention.h) and
// backward (hip_attention_bwd.h) as kernels, one set per (head_dim, head_dim_v). Compiled with clang++-19 -x hip --cuda-device-only
// -nogpulib -nogpuinc for gfx1100 (RDNA3) and gfx1151 (RDNA3.5) into one offload bundle that
// the plugin's host part loads with hipModuleLoadData (the runtime picks the device's ISA).
// -nogpuinc: no HIP headers are needed; the few attributes and builtins used are clang's own.
#include "kernels/plugin/examples/hip_attention.h"
#include "kernels/plugin/examples/hip_attention_bwd.h"

namespace attest::hip_example {

// __syncthreads(): LDS writes before the barrier are visible to every lane after it.
__attribute__((device)) inline void Barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// The driver: the same sequence of steps as EmulateForwardBlock (hip_attention_emulate.h),
// with each lane running its own part and the WMMA builtin doing the wave-wide product.
template <int kD, int kDv>
__attribute__((device)) void ForwardBlock(const AttentionParams& p) {
  __attribute__((shared)) TileShared sh;
  const int lane = static_cast<int>(__builtin_amdgcn_workitem_id_x());
  const BlockIndex blk = MakeBlockIndex(p, __builtin_amdgcn_workgroup_id_x(),
                                        __builtin_amdgcn_workgroup_id_y(),
                                        __builtin_amdgcn_workgroup_id_z());
  LaneRegs<kD, kDv> regs;
  InitLane(lane, regs, p, blk, sh);
  Barrier();
  int64_t lo = 0, hi = 0;
  KeyTiles(p, blk.q0, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
    Float8 acc = {};
    ATTEST_UNROLL
    for (int kk = 0; kk < kD / kTile; ++kk) {
      acc = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(regs.q[kk],
                                                       KFragment(lane, kk, p, blk, j0), acc);
    }
    StoreScores(lane, acc, p, blk, j0, sh);
    Barrier();
    SoftmaxRow(lane, sh);
    Barrier();
    RescaleO(lane, regs, sh);
    const Half16 pa = PFragment(lane, sh);
    ATTEST_UNROLL
    for (int n = 0; n < kDv / kTile; ++n) {
      regs.o[n] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(pa, VFragment(lane, n, p, blk, j0),
                                                             regs.o[n]);
    }
  }
  Barrier();
  FinalizeRow(lane, p, blk, sh);
  Barrier();
  StoreO(lane, regs, p, blk, sh);
}

// Backward, dQ: one block per 16 query rows (grid x = query tile, y = head, z = batch); the
// steps of EmulateBackwardDqBlock.
template <int kD, int kDv>
__attribute__((device)) void BackwardDqBlock(const BackwardParams& p) {
  __attribute__((shared)) BwdShared sh;
  const int lane = static_cast<int>(__builtin_amdgcn_workitem_id_x());
  const BlockIndex blk = MakeBlockIndex(p.fwd, __builtin_amdgcn_workgroup_id_x(),
                                        __builtin_amdgcn_workgroup_id_y(),
                                        __builtin_amdgcn_workgroup_id_z());
  const View q = QView(p, blk.b, blk.h), k = KView(p, blk.b, blk.hkv),
             v = VView(p, blk.b, blk.hkv), dout = DoView(p, blk.b, blk.h);
  Half16 qa[kD / kTile], da[kDv / kTile];
  Float8 dq[kD / kTile];
  ATTEST_UNROLL
  for (int kk = 0; kk < kD / kTile; ++kk) {
    qa[kk] = RowsAsA(lane, q, blk.q0, kk * kTile);
    dq[kk] = Float8{};
  }
  const View o = OView(p, blk.b, blk.h);
  Float8 delta = {};
  ATTEST_UNROLL
  for (int cc = 0; cc < kDv / kTile; ++cc) {
    da[cc] = RowsAsA(lane, dout, blk.q0, cc * kTile);
    delta = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(da[cc], RowsAsB(lane, o, blk.q0, cc * kTile),
                                                       delta);
  }
  LoadRowLse(lane, p, blk.b, blk.h, blk.q0, sh);
  StoreDelta(lane, delta, sh);
  Barrier();
  int64_t lo = 0, hi = 0;
  KeyTiles(p.fwd, blk.q0, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
    Float8 s = {}, dp = {};
    ATTEST_UNROLL
    for (int kk = 0; kk < kD / kTile; ++kk) {
      s = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(qa[kk], RowsAsB(lane, k, j0, kk * kTile), s);
    }
    ATTEST_UNROLL
    for (int cc = 0; cc < kDv / kTile; ++cc) {
      dp = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(da[cc], RowsAsB(lane, v, j0, cc * kTile),
                                                      dp);
    }
    StoreDs(lane, s, dp, p, blk.q0, j0, sh);
    Barrier();
    const Half16 dsa = TileAsA(lane, sh.ds);
    ATTEST_UNROLL
    for (int n = 0; n < kD / kTile; ++n) {
      dq[n] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(
          dsa, FeaturesAsB(lane, k, j0, n * kTile), dq[n]);
    }
    Barrier();
  }
  StoreRows<kD / kTile>(lane, dq, p.scale, p.dq, p.dq_stride, blk.b, blk.h, blk.q0,
                        p.fwd.seqlen_q);
}

// Backward, dK and dV: one block per 16 keys (grid x = key tile, y = kv head, z = batch),
// looping over the query heads of the GQA group; the steps of EmulateBackwardDkDvBlock.
template <int kD, int kDv>
__attribute__((device)) void BackwardDkDvBlock(const BackwardParams& p) {
  __attribute__((shared)) BwdShared sh;
  const int lane = static_cast<int>(__builtin_amdgcn_workitem_id_x());
  const int64_t j0 = static_cast<int64_t>(__builtin_amdgcn_workgroup_id_x()) * kTile;
  const int64_t hkv = __builtin_amdgcn_workgroup_id_y();
  const int64_t b = __builtin_amdgcn_workgroup_id_z();
  const View k = KView(p, b, hkv), v = VView(p, b, hkv);
  Half16 ka[kD / kTile], va[kDv / kTile];
  Float8 dk[kD / kTile], dv[kDv / kTile];
  ATTEST_UNROLL
  for (int kk = 0; kk < kD / kTile; ++kk) {
    ka[kk] = RowsAsA(lane, k, j0, kk * kTile);
    dk[kk] = Float8{};
  }
  ATTEST_UNROLL
  for (int cc = 0; cc < kDv / kTile; ++cc) {
    va[cc] = RowsAsA(lane, v, j0, cc * kTile);
    dv[cc] = Float8{};
  }
  int64_t lo = 0, hi = 0;
  QueryTiles(p.fwd, j0, &lo, &hi);
  const int64_t ratio = p.fwd.heads_q / p.fwd.heads_kv;
  // The group's query heads are summed in mirrored pairs (g, ratio - 1 - g): each head's
  // share on its own, the pair as one addition, the pairs in order. Reversing the heads of a
  // group then changes nothing, bit for bit (a + b = b + a), for any group size.
  for (int64_t pair = 0; pair < (ratio + 1) / 2; ++pair) {
    Float8 dk_p[kD / kTile], dv_p[kDv / kTile];
    const int64_t members = pair == ratio - 1 - pair ? 1 : 2;
    for (int64_t member = 0; member < members; ++member) {
      const int64_t h = hkv * ratio + (member == 0 ? pair : ratio - 1 - pair);
      const View q = QView(p, b, h), dout = DoView(p, b, h), o = OView(p, b, h);
      Float8 dk_h[kD / kTile], dv_h[kDv / kTile];
      ATTEST_UNROLL
      for (int n = 0; n < kD / kTile; ++n) dk_h[n] = Float8{};
      ATTEST_UNROLL
      for (int n = 0; n < kDv / kTile; ++n) dv_h[n] = Float8{};
      for (int64_t i0 = lo; i0 < hi; i0 += kTile) {
        Float8 delta = {};
        ATTEST_UNROLL
        for (int cc = 0; cc < kDv / kTile; ++cc) {
          delta = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(
              RowsAsA(lane, o, i0, cc * kTile), RowsAsB(lane, dout, i0, cc * kTile), delta);
        }
        LoadRowLse(lane, p, b, h, i0, sh);
        StoreDelta(lane, delta, sh);
        Barrier();
        Float8 st = {}, dpt = {};
        ATTEST_UNROLL
        for (int kk = 0; kk < kD / kTile; ++kk) {
          st = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(ka[kk],
                                                          RowsAsB(lane, q, i0, kk * kTile), st);
        }
        ATTEST_UNROLL
        for (int cc = 0; cc < kDv / kTile; ++cc) {
          dpt = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(
              va[cc], RowsAsB(lane, dout, i0, cc * kTile), dpt);
        }
        StorePtDst(lane, st, dpt, p, j0, i0, sh);
        Barrier();
        const Half16 pa = TileAsA(lane, sh.p), dsa = TileAsA(lane, sh.ds);
        ATTEST_UNROLL
        for (int n = 0; n < kDv / kTile; ++n) {
          dv_h[n] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(
              pa, FeaturesAsB(lane, dout, i0, n * kTile), dv_h[n]);
        }
        ATTEST_UNROLL
        for (int n = 0; n < kD / kTile; ++n) {
          dk_h[n] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(
              dsa, FeaturesAsB(lane, q, i0, n * kTile), dk_h[n]);
        }
        Barrier();
      }
      ATTEST_UNROLL
      for (int n = 0; n < kD / kTile; ++n) dk_p[n] = member == 0 ? dk_h[n] : dk_p[n] + dk_h[n];
      ATTEST_UNROLL
      for (int n = 0; n < kDv / kTile; ++n) dv_p[n] = member == 0 ? dv_h[n] : dv_p[n] + dv_h[n];
    }
    ATTEST_UNROLL
    for (int n = 0; n < kD / kTile; ++n) dk[n] += dk_p[n];
    ATTEST_UNROLL
    for (int n = 0; n < kDv / kTile; ++n) dv[n] += dv_p[n];
  }
  StoreRows<kD / kTile>(lane, dk, p.scale, p.dk, p.dk_stride, b, hkv, j0, p.fwd.seqlen_k);
  StoreRows<kDv / kTile>(lane, dv, 1.0f, p.dv, p.dv_stride, b, hkv, j0, p.fwd.seqlen_k);
}

}  // namespace attest::hip_example

// One wave (32 lanes) per block; the launch uses blockDim = (32, 1, 1).
#define ATTEST_HIP_KERNEL(D, DV)                                                       \
  extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(32, 32))) \
  void attest_hip_wmma_fwd_d##D##_dv##DV(attest::hip_example::AttentionParams p) {     \
    attest::hip_example::ForwardBlock<D, DV>(p);                                       \
  }

#define ATTEST_HIP_BWD_KERNELS(D, DV)                                                      \
  extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(32, 32)))  \
  void attest_hip_wmma_bwd_dq_d##D##_dv##DV(attest::hip_example::BackwardParams p) {       \
    attest::hip_example::BackwardDqBlock<D, DV>(p);                                        \
  }                                                                                        \
  extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(32, 32)))  \
  void attest_hip_wmma_bwd_dkdv_d##D##_dv##DV(attest::hip_example::BackwardParams p) {     \
    attest::hip_example::BackwardDkDvBlock<D, DV>(p);                                      \
  }

ATTEST_HIP_KERNEL(64, 64)
ATTEST_HIP_KERNEL(64, 128)
ATTEST_HIP_KERNEL(128, 64)
ATTEST_HIP_KERNEL(128, 128)
ATTEST_HIP_BWD_KERNELS(64, 64)
ATTEST_HIP_BWD_KERNELS(64, 128)
ATTEST_HIP_BWD_KERNELS(128, 64)
ATTEST_HIP_BWD_KERNELS(128, 128)
