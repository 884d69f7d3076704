// The example HIP kernel run on the host: the steps of hip_attention.h executed lane by lane
// for one wave, in the order of the device driver (hip_attention_device.hip ForwardBlock),
// with EmulateWmmaF32F16 standing in for the WMMA instruction. Barriers are the points
// between the per-lane loops, so every lane's LDS writes are done before any lane reads.
// This is how the kernel's index math and algorithm are tested without an AMD GPU.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/plugin/examples/hip_attention.h"
#include "kernels/plugin/examples/hip_attention_bwd.h"
#include "kernels/plugin/examples/hip_wmma_emulate.h"

namespace attest::hip_example {

// One block (grid coordinates x, y, z); false with `why` if a WMMA got unreplicated inputs.
template <int kD, int kDv>
bool EmulateForwardBlock(const AttentionParams& p, int64_t x, int64_t y, int64_t z,
                         std::string* why) {
  constexpr int kWave = wmma::kWave;
  TileShared sh;
  auto regs = std::make_unique<std::array<LaneRegs<kD, kDv>, kWave>>();
  const BlockIndex blk = MakeBlockIndex(p, x, y, z);
  for (int lane = 0; lane < kWave; ++lane) InitLane(lane, (*regs)[lane], p, blk, sh);
  int64_t lo = 0, hi = 0;
  KeyTiles(p, blk.q0, &lo, &hi);
  wmma::WaveA a, b;
  wmma::WaveAcc acc;
  for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
    for (int lane = 0; lane < kWave; ++lane) {
      for (int r = 0; r < wmma::kAccPerLane; ++r) acc[lane][r] = 0.0f;
    }
    for (int kk = 0; kk < kD / kTile; ++kk) {
      for (int lane = 0; lane < kWave; ++lane) {
        a[lane] = (*regs)[lane].q[kk];
        b[lane] = KFragment(lane, kk, p, blk, j0);
      }
      if (!wmma::EmulateWmmaF32F16(a, b, acc, why)) return false;
    }
    for (int lane = 0; lane < kWave; ++lane) StoreScores(lane, acc[lane], p, blk, j0, sh);
    for (int lane = 0; lane < kWave; ++lane) SoftmaxRow(lane, sh);
    for (int lane = 0; lane < kWave; ++lane) {
      RescaleO(lane, (*regs)[lane], sh);
      a[lane] = PFragment(lane, sh);
    }
    for (int n = 0; n < kDv / kTile; ++n) {
      for (int lane = 0; lane < kWave; ++lane) {
        b[lane] = VFragment(lane, n, p, blk, j0);
        acc[lane] = (*regs)[lane].o[n];
      }
      if (!wmma::EmulateWmmaF32F16(a, b, acc, why)) return false;
      for (int lane = 0; lane < kWave; ++lane) (*regs)[lane].o[n] = acc[lane];
    }
  }
  for (int lane = 0; lane < kWave; ++lane) FinalizeRow(lane, p, blk, sh);
  for (int lane = 0; lane < kWave; ++lane) StoreO(lane, (*regs)[lane], p, blk, sh);
  return true;
}

// The whole grid (x = ceil(Sq / 16), y = Hq, z = B), as the plugin launches it.
template <int kD, int kDv>
bool EmulateForward(const AttentionParams& p, std::string* why) {
  const int64_t tiles = (p.seqlen_q + kTile - 1) / kTile;
  for (int64_t z = 0; z < p.batch; ++z) {
    for (int64_t y = 0; y < p.heads_q; ++y) {
      for (int64_t x = 0; x < tiles; ++x) {
        if (!EmulateForwardBlock<kD, kDv>(p, x, y, z, why)) return false;
      }
    }
  }
  return true;
}

// Backward, dQ block (x, y, z): the steps of BackwardDqBlock (hip_attention_device.hip).
template <int kD, int kDv>
bool EmulateBackwardDqBlock(const BackwardParams& p, int64_t x, int64_t y, int64_t z,
                            std::string* why) {
  constexpr int kWave = wmma::kWave;
  BwdShared sh;
  const BlockIndex blk = MakeBlockIndex(p.fwd, x, y, z);
  const View q = QView(p, blk.b, blk.h), k = KView(p, blk.b, blk.hkv),
             v = VView(p, blk.b, blk.hkv), dout = DoView(p, blk.b, blk.h);
  struct Lane {
    Half16 qa[kD / kTile], da[kDv / kTile];
    Float8 dq[kD / kTile];
  };
  auto lanes = std::make_unique<std::array<Lane, kWave>>();
  for (int lane = 0; lane < kWave; ++lane) {
    Lane& l = (*lanes)[lane];
    for (int kk = 0; kk < kD / kTile; ++kk) {
      l.qa[kk] = RowsAsA(lane, q, blk.q0, kk * kTile);
      l.dq[kk] = Float8{};
    }
    for (int cc = 0; cc < kDv / kTile; ++cc) l.da[cc] = RowsAsA(lane, dout, blk.q0, cc * kTile);
    LoadRowLse(lane, p, blk.b, blk.h, blk.q0, sh);
  }
  wmma::WaveA a, bb;
  wmma::WaveAcc s, dp, acc;
  {
    const View o = OView(p, blk.b, blk.h);
    acc.fill(Float8{});
    for (int cc = 0; cc < kDv / kTile; ++cc) {
      for (int lane = 0; lane < kWave; ++lane) {
        a[lane] = (*lanes)[lane].da[cc];
        bb[lane] = RowsAsB(lane, o, blk.q0, cc * kTile);
      }
      if (!wmma::EmulateWmmaF32F16(a, bb, acc, why)) return false;
    }
    for (int lane = 0; lane < kWave; ++lane) StoreDelta(lane, acc[lane], sh);
  }
  int64_t lo = 0, hi = 0;
  KeyTiles(p.fwd, blk.q0, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
    s.fill(Float8{});
    dp.fill(Float8{});
    for (int kk = 0; kk < kD / kTile; ++kk) {
      for (int lane = 0; lane < kWave; ++lane) {
        a[lane] = (*lanes)[lane].qa[kk];
        bb[lane] = RowsAsB(lane, k, j0, kk * kTile);
      }
      if (!wmma::EmulateWmmaF32F16(a, bb, s, why)) return false;
    }
    for (int cc = 0; cc < kDv / kTile; ++cc) {
      for (int lane = 0; lane < kWave; ++lane) {
        a[lane] = (*lanes)[lane].da[cc];
        bb[lane] = RowsAsB(lane, v, j0, cc * kTile);
      }
      if (!wmma::EmulateWmmaF32F16(a, bb, dp, why)) return false;
    }
    for (int lane = 0; lane < kWave; ++lane) StoreDs(lane, s[lane], dp[lane], p, blk.q0, j0, sh);
    for (int lane = 0; lane < kWave; ++lane) a[lane] = TileAsA(lane, sh.ds);
    for (int n = 0; n < kD / kTile; ++n) {
      for (int lane = 0; lane < kWave; ++lane) {
        bb[lane] = FeaturesAsB(lane, k, j0, n * kTile);
        acc[lane] = (*lanes)[lane].dq[n];
      }
      if (!wmma::EmulateWmmaF32F16(a, bb, acc, why)) return false;
      for (int lane = 0; lane < kWave; ++lane) (*lanes)[lane].dq[n] = acc[lane];
    }
  }
  for (int lane = 0; lane < kWave; ++lane) {
    StoreRows<kD / kTile>(lane, (*lanes)[lane].dq, p.scale, p.dq, p.dq_stride, blk.b, blk.h,
                          blk.q0, p.fwd.seqlen_q);
  }
  return true;
}

// Backward, dK/dV block (x = key tile, y = kv head, z = batch): the steps of
// BackwardDkDvBlock.
template <int kD, int kDv>
bool EmulateBackwardDkDvBlock(const BackwardParams& p, int64_t x, int64_t y, int64_t z,
                              std::string* why) {
  constexpr int kWave = wmma::kWave;
  BwdShared sh;
  const int64_t j0 = x * kTile, hkv = y, b = z;
  const View k = KView(p, b, hkv), v = VView(p, b, hkv);
  struct Lane {
    Half16 ka[kD / kTile], va[kDv / kTile];
    Float8 dk[kD / kTile], dv[kDv / kTile];      // totals
    Float8 dk_h[kD / kTile], dv_h[kDv / kTile];  // one query head's share
    Float8 dk_p[kD / kTile], dv_p[kDv / kTile];  // one mirrored pair's share
  };
  auto lanes = std::make_unique<std::array<Lane, kWave>>();
  for (int lane = 0; lane < kWave; ++lane) {
    Lane& l = (*lanes)[lane];
    for (int kk = 0; kk < kD / kTile; ++kk) {
      l.ka[kk] = RowsAsA(lane, k, j0, kk * kTile);
      l.dk[kk] = Float8{};
    }
    for (int cc = 0; cc < kDv / kTile; ++cc) {
      l.va[cc] = RowsAsA(lane, v, j0, cc * kTile);
      l.dv[cc] = Float8{};
    }
  }
  int64_t lo = 0, hi = 0;
  QueryTiles(p.fwd, j0, &lo, &hi);
  const int64_t ratio = p.fwd.heads_q / p.fwd.heads_kv;
  wmma::WaveA a, a2, bb;
  wmma::WaveAcc st, dpt, acc;
  // Mirrored pairs of query heads, as in the device driver.
  for (int64_t pair = 0; pair < (ratio + 1) / 2; ++pair) {
    const int64_t members = pair == ratio - 1 - pair ? 1 : 2;
    for (int64_t member = 0; member < members; ++member) {
      const int64_t h = hkv * ratio + (member == 0 ? pair : ratio - 1 - pair);
      const View q = QView(p, b, h), dout = DoView(p, b, h), o = OView(p, b, h);
      for (int lane = 0; lane < kWave; ++lane) {
        Lane& l = (*lanes)[lane];
        for (int n = 0; n < kD / kTile; ++n) l.dk_h[n] = Float8{};
        for (int n = 0; n < kDv / kTile; ++n) l.dv_h[n] = Float8{};
      }
      for (int64_t i0 = lo; i0 < hi; i0 += kTile) {
        acc.fill(Float8{});
        for (int cc = 0; cc < kDv / kTile; ++cc) {
          for (int lane = 0; lane < kWave; ++lane) {
            a[lane] = RowsAsA(lane, o, i0, cc * kTile);
            bb[lane] = RowsAsB(lane, dout, i0, cc * kTile);
          }
          if (!wmma::EmulateWmmaF32F16(a, bb, acc, why)) return false;
        }
        for (int lane = 0; lane < kWave; ++lane) {
          LoadRowLse(lane, p, b, h, i0, sh);
          StoreDelta(lane, acc[lane], sh);
        }
        st.fill(Float8{});
        dpt.fill(Float8{});
        for (int kk = 0; kk < kD / kTile; ++kk) {
          for (int lane = 0; lane < kWave; ++lane) {
            a[lane] = (*lanes)[lane].ka[kk];
            bb[lane] = RowsAsB(lane, q, i0, kk * kTile);
          }
          if (!wmma::EmulateWmmaF32F16(a, bb, st, why)) return false;
        }
        for (int cc = 0; cc < kDv / kTile; ++cc) {
          for (int lane = 0; lane < kWave; ++lane) {
            a[lane] = (*lanes)[lane].va[cc];
            bb[lane] = RowsAsB(lane, dout, i0, cc * kTile);
          }
          if (!wmma::EmulateWmmaF32F16(a, bb, dpt, why)) return false;
        }
        for (int lane = 0; lane < kWave; ++lane) {
          StorePtDst(lane, st[lane], dpt[lane], p, j0, i0, sh);
        }
        for (int lane = 0; lane < kWave; ++lane) {
          a[lane] = TileAsA(lane, sh.p);
          a2[lane] = TileAsA(lane, sh.ds);
        }
        for (int n = 0; n < kDv / kTile; ++n) {
          for (int lane = 0; lane < kWave; ++lane) {
            bb[lane] = FeaturesAsB(lane, dout, i0, n * kTile);
            acc[lane] = (*lanes)[lane].dv_h[n];
          }
          if (!wmma::EmulateWmmaF32F16(a, bb, acc, why)) return false;
          for (int lane = 0; lane < kWave; ++lane) (*lanes)[lane].dv_h[n] = acc[lane];
        }
        for (int n = 0; n < kD / kTile; ++n) {
          for (int lane = 0; lane < kWave; ++lane) {
            bb[lane] = FeaturesAsB(lane, q, i0, n * kTile);
            acc[lane] = (*lanes)[lane].dk_h[n];
          }
          if (!wmma::EmulateWmmaF32F16(a2, bb, acc, why)) return false;
          for (int lane = 0; lane < kWave; ++lane) (*lanes)[lane].dk_h[n] = acc[lane];
        }
      }
      for (int lane = 0; lane < kWave; ++lane) {
        Lane& l = (*lanes)[lane];
        for (int n = 0; n < kD / kTile; ++n) {
          for (int r = 0; r < wmma::kAccPerLane; ++r) {
            l.dk_p[n][r] = member == 0 ? l.dk_h[n][r] : l.dk_p[n][r] + l.dk_h[n][r];
          }
        }
        for (int n = 0; n < kDv / kTile; ++n) {
          for (int r = 0; r < wmma::kAccPerLane; ++r) {
            l.dv_p[n][r] = member == 0 ? l.dv_h[n][r] : l.dv_p[n][r] + l.dv_h[n][r];
          }
        }
      }
    }
    for (int lane = 0; lane < kWave; ++lane) {
      Lane& l = (*lanes)[lane];
      for (int n = 0; n < kD / kTile; ++n) {
        for (int r = 0; r < wmma::kAccPerLane; ++r) l.dk[n][r] += l.dk_p[n][r];
      }
      for (int n = 0; n < kDv / kTile; ++n) {
        for (int r = 0; r < wmma::kAccPerLane; ++r) l.dv[n][r] += l.dv_p[n][r];
      }
    }
  }
  for (int lane = 0; lane < kWave; ++lane) {
    StoreRows<kD / kTile>(lane, (*lanes)[lane].dk, p.scale, p.dk, p.dk_stride, b, hkv, j0,
                          p.fwd.seqlen_k);
    StoreRows<kDv / kTile>(lane, (*lanes)[lane].dv, 1.0f, p.dv, p.dv_stride, b, hkv, j0,
                           p.fwd.seqlen_k);
  }
  return true;
}

// Both backward grids, as the plugin launches them.
template <int kD, int kDv>
bool EmulateBackward(const BackwardParams& p, std::string* why) {
  const int64_t q_tiles = (p.fwd.seqlen_q + kTile - 1) / kTile;
  const int64_t k_tiles = (p.fwd.seqlen_k + kTile - 1) / kTile;
  for (int64_t z = 0; z < p.fwd.batch; ++z) {
    for (int64_t y = 0; y < p.fwd.heads_q; ++y) {
      for (int64_t x = 0; x < q_tiles; ++x) {
        if (!EmulateBackwardDqBlock<kD, kDv>(p, x, y, z, why)) return false;
      }
    }
    for (int64_t y = 0; y < p.fwd.heads_kv; ++y) {
      for (int64_t x = 0; x < k_tiles; ++x) {
        if (!EmulateBackwardDkDvBlock<kD, kDv>(p, x, y, z, why)) return false;
      }
    }
  }
  return true;
}

}  // namespace attest::hip_example
