// The CUDA float64 oracle's row backward kernels: RowDqKernel (dQ, a pair of warps per 16 query
// rows), RowDkDvKernel (dK and dV, a pair of warps per 16 keys) and the dQ it may fuse in
// (FusedDq: FirstTurnKernel, the turns, ScaleKernel), with their shared memory.
// oracle_cuda_rows.cuh's header comment describes the row kernels and holds the helpers these
// use. Included by oracle_cuda.cu only, after oracle_cuda_rows.cuh.
#pragma once

namespace {

// Shared memory of RowDqKernel, in doubles: the Q and dO tiles, one K tile (with its norms), one
// V tile and the rows' key bounds. Every tile at row stride RowVStride (2 mod 8).
__host__ __device__ int64_t RowDqShared(int64_t d, int64_t dv, int tq) {
  return tq * (RowVStride(d) + RowVStride(dv)) +
         kRowTileKeys * (RowVStride(d) + RowVStride(dv)) + kRowTileKeys + 2 * tq;
}

// dQ with a warp per 16 query rows and half of each key tile (p.tq = 16 per pair of warps,
// p.tk = kRowTileKeys; d and dv multiples of 8, d <= 8 ND): for every key tile that some row of
// the tile may see, dP = dO V^T and S = Q K^T for the warp's 16 rows and 16 keys in registers,
// dS in their epilogue (ScoresBackwardMma's expressions), then dQ += dS K in registers (the
// product over the warp's 16 keys summed apart, then added). At the end the two warps of a pair
// add their accumulators: each dQ element is a chain of 16 per tile, one addition per tile and
// one between the pair (sum_len_k: 16 + tiles + 1, within DqKernel's tk + tiles). V streams
// while S, dS and dQ run; K while dP runs.
template <int ND>
__global__ void ATTEST_LAUNCH_BOUNDS(kThreads, 1)
    RowDqKernel(Dev p, const double* q, const double* k, const double* v, const double* dout,
                const double* lse, const double* delta, double* dq, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  constexpr int tk = kRowTileKeys, kHalf = tk / 2;
  const int64_t kv = h / (p.hq / p.hkv);
  const int tq = p.tq;
  const int64_t dd = p.d, dv = p.dv, sd = RowVStride(dd), sdv = RowVStride(dv);
  double* sq_tile = smem;
  double* sdo_tile = sq_tile + tq * sd;
  double* sk_tile = sdo_tile + tq * sdv;
  double* sv_tile = sk_tile + tk * sd;
  double* cn = sv_tile + tk * sdv;
  int64_t* lo = reinterpret_cast<int64_t*>(cn + tk);
  int64_t* hi = lo + tq;
  int64_t range[4];  // TileRowBounds
  const int warp = static_cast<int>(threadIdx.x / 32), lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = 16 * (warp >> 1), k0w = kHalf * (warp & 1);  // the warp's rows and keys
  const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadTile(q, p.hq, h, dd, sd, s.q_begin + i0, nq, tq, sq_tile);
  LoadTile(dout, p.hq, h, dv, sdv, s.q_begin + i0, nq, tq, sdo_tile);
  CopyCommit();
  // The lane's two rows (r0 + g + 8u): lse, delta and the q norm.
  double row_lse[2], row_delta[2], row_n[2];
  ATTEST_UNROLL
  for (int u = 0; u < 2; ++u) {
    const int r = r0 + g + 8 * u;
    row_lse[u] = r < nq ? lse[LseIndex(p, b, h, s, i0 + r)] : -INFINITY;
    row_delta[u] = r < nq ? delta[LseIndex(p, b, h, s, i0 + r)] : 0.0;
    row_n[u] = r < nq ? p.qn[(s.q_begin + i0 + r) * p.hq + h] : 0.0;
  }
  // acc[y][e]: dQ's element (row g + 8 (e >> 1), column 8 y + 2t + (e & 1)) of the warp's rows.
  double acc[ND][4];
  ATTEST_UNROLL
  for (int y = 0; y < ND; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) acc[y][e] = 0;
  }
  double mag = 0;  // the score magnitude statistic of this thread's entries
  int64_t visited = 0;
  TileRowBounds(p, s, i0, lo, hi, range);
  const int64_t end = range[1];
  int64_t j0 = NextKeyTile(p, s, lo, hi, range, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeysAt(p, s, kv, v, dv, sdv, j0, sv_tile, nullptr);
    LoadKeysAt(p, s, kv, k, dd, sd, j0, sk_tile, cn);
  }
  while (j0 < end) {
    const int64_t jn = NextKeyTile(p, s, lo, hi, range, j0 + tk, end);  // in every thread
    ++visited;
    double cs[2][4], cp[2][4];
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) cs[y][e] = cp[y][e] = 0;
    }
    CopyWait<1>();  // Q, dO and this tile's V (its K may still be on the way)
    __syncthreads();
    RowScores(sdo_tile + (r0 + g) * sdv, sdv, sv_tile + (k0w + g) * sdv, sdv, dv, t, cp);
    CopyWait<0>();  // this tile's K and its norms
    __syncthreads();
    RowScores(sq_tile + (r0 + g) * sd, sd, sk_tile + (k0w + g) * sd, sd, dd, t, cs);
    // dS in the scores' registers (ScoresBackwardMma's entry).
    const bool whole = WholeTile(p, s, i0, j0, range);
    const bool plain = PlainTile(p, whole, slope);
    if (plain) {
      mag = fmax(mag, PlainTileMag<2>(p, fmax(row_n[0], row_n[1]), cn + k0w, t, false));
    }
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int u = e >> 1, r = r0 + g + 8 * u, col = k0w + 8 * y + 2 * t + (e & 1);
        const int64_t j = j0 + col;
        double dsv = 0, th = 0, sc = -INFINITY;
        if (plain) {
          sc = p.scale * cs[y][e];
        } else if (whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i0 + r, j))) {
          sc = ScoreOf(p, s, i0 + r, j, slope, cs[y][e], row_n[u], cn[col], th, mag);
        }
        if (sc > -INFINITY) {
          const double pr = exp(sc - row_lse[u]);
          dsv = pr * (cp[y][e] - row_delta[u]);
          if (p.softcap > 0 && pr != 0.0) dsv *= 1.0 - th * th;
        }
        cs[y][e] = dsv;
      }
    }
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, v, dv, sdv, jn, sv_tile, nullptr);  // V is free
    // dQ += dS K over the warp's 16 keys (RowProductAdd over 2 key blocks): dS's accumulator is
    // the A operand, B reads the K rows 2t and 2t + 1.
    {
      double a[2][4];
      AccumulatorsAsA(cs, a);
      RowProductAdd(a, sk_tile + (k0w + 2 * t) * sd + g, sd, dd, acc);
    }
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, k, dd, sd, jn, sk_tile, cn);  // K is free
    j0 = jn;
  }
  CopyWait<0>();  // no copy outlives the block (Q and dO when no key tile ran)
  // The pair's sum: the second warp's accumulator through the Q tile (free now), then
  // dq = scale (first + second).
  __syncthreads();
  double* other = sq_tile + (warp >> 1) * 16 * dd;
  ATTEST_UNROLL
  for (int y = 0; y < ND; ++y) {
    if (8 * y < dd && (warp & 1) == 1) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) {
        other[(g + 8 * (e >> 1)) * dd + 8 * y + 2 * t + (e & 1)] = acc[y][e];
      }
    }
  }
  __syncthreads();
  if ((warp & 1) == 0) {
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      const int r = r0 + g + 8 * u;
      if (r >= nq) continue;
      double* out = dq + ((s.q_begin + i0 + r) * p.hq + h) * dd;
      ATTEST_UNROLL
      for (int y = 0; y < ND; ++y) {
        if (8 * y < dd) {
          ATTEST_UNROLL
          for (int x = 0; x < 2; ++x) {
            const int64_t col = 8 * y + 2 * t + x;
            out[col] = p.scale * (acc[y][2 * u + x] + other[(g + 8 * u) * dd + col]);
          }
        }
      }
    }
  }
  MaxDouble(&stats->score_abs_max, mag);
  if (threadIdx.x == 0) MaxInt(&stats->sum_len_k, kHalf + visited + 1);
}

// ---------------------------------------------------------------------------------------------
// dQ inside RowDkDvKernel (kFused): the dK/dV kernel has P and dS of every (query tile, key
// block) pair it visits, so it also forms that pair's share of dQ, dS K over its keys, and adds
// it to dq in global memory, instead of RowDqKernel computing the scores, P and dS a second
// time (FlashAttention-2's backward, Dao 2023, algorithm 2, does the same with atomic adds).
// Atomic adds in whatever order the blocks come would make dq's bits change from run to run;
// here the key blocks that may see a query tile add their shares in ascending key order, one
// after another: a turn per (batch, query head, query tile) in global memory holds the key
// block whose turn it is (FirstTurnKernel sets the first, each block passes it to the next one
// that may see the tile, -1 after the last). The adds themselves are red.global.add.f64
// (AddGlobal: IEEE round to nearest even, subnormals kept; PTX ISA, "red"), which return
// nothing, so a block does not wait for them; its fence before passing the turn orders them
// before the next block's. Each dq element is then ((0 + s_0) + s_1) + ..., then scaled
// (ScaleKernel: dq = scale dQ), s_j two chains of 32 keys (RowProductAdd) added: a chain of at
// most tk + (key blocks) + 1, the sum_len_k the kernel reports. Blocks start in the order of
// their index on the GPUs this runs on, so a block's predecessors on a tile have started before
// it; and the blocks walk query tiles in descending order (heads of the group innermost), so
// that with causal or banded masks a block's predecessor reaches each tile no later than it
// does. A block that waits more than kTurnTimeoutNs gives up (order_timeouts), and the host
// computes dQ again with RowDqKernel.
constexpr unsigned long long kTurnTimeoutNs = 4000000000ull;

// The arguments of the fused dQ: dq (zeroed by the host), the turns (q_tiles per (batch, head)).
struct FusedDq {
  double* dq;
  int* turn;
  int64_t q_tiles;
};

// The keys that some row of query tile i0 (p.tq rows) may see: [*a, *z), empty when *a >= *z.
// Every lane of the warp gets it.
__device__ void QueryTileHull(const Dev& p, const Seq& s, int64_t i0, int64_t* a, int64_t* z) {
  long long lo = s.k_len, hi = 0;
  for (int r = threadIdx.x % 32; r < p.tq; r += 32) {
    if (i0 + r < s.q_len) {
      int64_t x = 0, y = 0;
      KeyBounds(p, s, i0 + r, &x, &y);
      if (x < y) {
        lo = min(lo, static_cast<long long>(x));
        hi = max(hi, static_cast<long long>(y));
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  *a = lo;
  *z = hi;
}

// The first key block (of p.tk keys) after kb that may see query tile i0 (QueryTileMaySee; the
// tile's keys end at z: QueryTileHull), or -1. Every lane of the warp gets it.
__device__ int NextKeyBlock(const Dev& p, const Seq& s, int64_t i0, int64_t kb, int64_t z) {
  for (int64_t j = kb + 1; j * p.tk < min(z, s.k_len); ++j) {
    if (QueryTileMaySee(p, s, i0, j * p.tk, min(static_cast<int64_t>(p.tk), s.k_len - j * p.tk))) {
      return static_cast<int>(j);
    }
  }
  return -1;
}

// The first turn of every query tile (a warp per tile): the key block holding the first key
// that some row of the tile may see (that block may see it), or -1.
__global__ void FirstTurnKernel(Dev p, FusedDq fz) {
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  int first = -1;
  if (i0 < s.q_len) {
    int64_t a = 0, z = 0;
    QueryTileHull(p, s, i0, &a, &z);
    if (a < z) first = static_cast<int>(a / p.tk);
  }
  if (threadIdx.x == 0) fz.turn[(b * p.hq + h) * fz.q_tiles + blockIdx.x] = first;
}

// By one thread: waits until the turn at `at` is `mine` (acquire), or gives up after
// kTurnTimeoutNs or once another block has (stats->order_timeouts).
__device__ void AwaitTurn(const int* at, int mine, DevStats* stats) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  // Blocks run one after another in index order: a turn not ours now never will be.
  if (*at != mine) atomicAdd(&stats->order_timeouts, 1ull);
#else
  // The acquiring load before the caller's __syncthreads (the wait of CUTLASS's
  // cutlass/barrier.h, GenericBarrier::wait_eq).
  int now = 0;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(now) : "l"(at) : "memory");
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (now != mine) {
    __nanosleep(100);
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(now) : "l"(at) : "memory");
    if (now == mine) break;
    if (*static_cast<volatile unsigned long long*>(&stats->order_timeouts) != 0) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > kTurnTimeoutNs) {
      atomicAdd(&stats->order_timeouts, 1ull);
      return;
    }
  }
#endif
}

// By one thread, after the block's writes and a __syncthreads: a fence, then the turn at `at`
// becomes `next` (the arrival of CUTLASS's cutlass/barrier.h, GenericBarrier::arrive_inc).
__device__ void PassTurn(int* at, int next) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  *at = next;
#else
  __threadfence();
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(at), "r"(next) : "memory");
#endif
}

// dq += x at L2 (red.global.add.f64: no value comes back).
__device__ void AddGlobal(double* at, double x) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  *at += x;
#else
  atomicAdd(at, x);
#endif
}
// x *= scale for n doubles.
__global__ void ScaleKernel(double* x, int64_t n, double scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = scale * x[i];
}

// Shared memory of RowDkDvKernel, in doubles: the K and V tiles of tk keys, one Q and one dO
// tile of tq rows with their norms, lse and delta, the rows' key bounds, the key norms and the
// fragments each warp hands its partner (256 per warp).
__host__ __device__ int64_t RowDkDvShared(int64_t d, int64_t dv, int tq, int tk, int warps) {
  return tk * (RowVStride(d) + RowVStride(dv)) + tq * (RowVStride(d) + RowVStride(dv)) +
         3 * tq + 2 * tq + tk + 256 * warps;
}

// The tile product acc[y] += A B over the 32 query rows of the tile (RowProductAdd over 4 k
// steps: DkDvKernel's chain), with A (P^T or dS^T, 16 keys x 32 queries) from
// the warps' fragments in xb (step kb from warp pair_base + kb / 2, its block kb % 2) and B the
// tile's rows (queries 2t + x of each step, columns col0 + 8y + g) at row stride sb, for the
// blocks 8y < w.
template <int NH>
__device__ void RowKeyProduct(const double* xb, int pair_base, const double* bt, int64_t sb,
                              int64_t col0, int64_t w, double (&acc)[NH][4]) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  double a[4][4];
  ATTEST_UNROLL
  for (int kb = 0; kb < 4; ++kb) {
    const double* src = xb + ((pair_base + kb / 2) * 2 + kb % 2) * 128 + lane;
    ATTEST_UNROLL
    for (int x = 0; x < 4; ++x) a[kb][x] = src[32 * x];
  }
  RowProductAdd(a, bt + 2 * t * sb + col0 + g, sb, w, acc);
}

// The pairs of warps of a whole block: the fused dQ (FusedDq) runs with every pair, 16 kPairs
// keys per block.
constexpr int kPairs = kThreads / 64;

// A block's share of dQ for the 32 queries of a tile (kFused RowDkDvKernel, kPairs pairs of
// warps, 16 kPairs keys): acc = dS K for queries q0 + [0, 16) and the columns [col0, col0 + w)
// (w <= 8 NQ), over the block's keys in groups of at most 32 (RowProductAdd: a chain of at most
// 4 steps of 8 from zero per group, each added). dS is read from the warps' dS^T fragments in
// xb (hand in RowDkDvKernel: the fragment of warp 2 (key / 16) + query / 16, block y, holds
// (key 8u + gk, query 8y + 2tq + xq) in lane 4 gk + tq, element u + 2 xq), transposed into the
// A operand (slot t + 4x: key 2t + x), and K from the block's tile (rows 2t, 2t + 1 of each
// step).
template <int NQ>
__device__ void FusedDqShare(const double* xb, const double* sk_tile, int64_t sd, int q0,
                             int64_t col0, int64_t w, double (&acc)[NQ][4]) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  ATTEST_UNROLL
  for (int y = 0; y < NQ; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) acc[y][e] = 0;
  }
  if (w <= 0) return;
  constexpr int kSteps = 2 * kPairs, kGroup = kSteps < 4 ? kSteps : 4;
  ATTEST_UNROLL
  for (int group = 0; group < kSteps / kGroup; ++group) {
    double a[kGroup][4];
    ATTEST_UNROLL
    for (int kb = 0; kb < kGroup; ++kb) {
      const int kk = 8 * (kGroup * group + kb);  // the step's first key
      const double* src = xb + (2 * (kk / 16) + q0 / 16) * 256 + (g >> 1) + 64 * (g & 1) +
                          32 * ((kk % 16) / 8) + 8 * t;
      ATTEST_UNROLL
      for (int x = 0; x < 4; ++x) a[kb][x] = src[128 * (x & 1) + 4 * (x >> 1)];
    }
    RowProductAdd(a, sk_tile + (8 * kGroup * group + 2 * t) * sd + col0 + g, sd, w, acc);
  }
}

// RowDkDvKernel's walk: the (query head, query tile) pair after (*hh, *ii) in NextQueryTile's
// order, or with kFused the query tiles that may see the keys [j0, j0 + nk) in descending order,
// each with every head of kv head kvh's group (ratio heads).
template <bool kFused>
__device__ __forceinline__ bool NextDkDvPair(const Dev& p, const Seq& s, int64_t kvh,
                                             int64_t ratio, int tq, int64_t j0, int64_t nk,
                                             int64_t* hh, int64_t* ii) {
  if constexpr (kFused) {
    if (*hh + 1 < (kvh + 1) * ratio) {
      ++*hh;
      return true;
    }
    for (int64_t x = *ii - tq; x >= 0; x -= tq) {
      if (QueryTileMaySee(p, s, x, j0, nk)) {
        *hh = kvh * ratio;
        *ii = x;
        return true;
      }
    }
    return false;
  } else {
    return NextQueryTile(p, s, kvh, j0, nk, hh, ii);
  }
}

// P^T and dS^T of a RowDkDvKernel warp in its scores' registers (ScoresBackwardMma's entry): cs
// (S^T) becomes P^T and cp (dP^T) dS^T, entry (key kp + g + 8u, query qm + 8y + 2t + x) with
// e = 2u + x (P = -0.0 where masked), of query tile i0 (Q norms rn, lse and delta per row) and
// key tile j0 (the lane's key norms key_n); mass[u] and seen[u] gather the key's P and visible
// entries, mag the score magnitude statistic.
__device__ __forceinline__ void DkDvTileEntries(
    const Dev& p, const Seq& s, int64_t i0, int64_t j0, int kp, int qm, int g, int t,
    const int64_t* lo, const int64_t* hi, const int64_t* range, const double* rn,
    const double* row_lse, const double* row_delta, const double (&key_n)[2], double slope,
    double (&cs)[2][4], double (&cp)[2][4], double (&mass)[2], long long (&seen)[2],
    double& mag) {
  const bool whole = WholeTile(p, s, i0, j0, range);
  const bool plain = PlainTile(p, whole, slope);
  if (plain) {
    mag = fmax(mag, PlainTileMag<2>(p, fmax(key_n[0], key_n[1]), rn + qm, t, true));
  }
  ATTEST_UNROLL
  for (int y = 0; y < 2; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int u = e >> 1, r = qm + 8 * y + 2 * t + (e & 1);
      const int64_t i = i0 + r, j = j0 + kp + g + 8 * u;
      double pr = -0.0, dsv = 0, th = 0, sc = -INFINITY;
      if (plain) {
        sc = p.scale * cs[y][e];
      } else if (whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i, j))) {
        sc = ScoreOf(p, s, i, j, slope, cs[y][e], rn[r], key_n[u], th, mag);
      }
      if (sc > -INFINITY) {
        pr = exp(sc - row_lse[r]);
        dsv = pr * (cp[y][e] - row_delta[r]);
        if (p.softcap > 0 && pr != 0.0) dsv *= 1.0 - th * th;
      }
      mass[u] += pr;
      seen[u] += signbit(pr) ? 0 : 1;
      cs[y][e] = pr;
      cp[y][e] = dsv;
    }
  }
}

// dq += acc_q, a block's share of dQ (FusedDqShare) for the queries i0 + q0 + g + 8u of head h
// and the columns col_q + 8y + 2t + x (8y < w_q), element by element at L2 (AddGlobal).
template <int NQ>
__device__ __forceinline__ void FusedDqAdd(const Dev& p, const Seq& s, double* dq, int64_t h,
                                           int64_t i0, int q0, int64_t col_q, int64_t w_q, int g,
                                           int t, const double (&acc_q)[NQ][4]) {
  if (w_q > 0) {
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      const int64_t r = i0 + q0 + g + 8 * u;
      if (r >= s.q_len) continue;
      double* row = dq + ((s.q_begin + r) * p.hq + h) * p.d + col_q;
      ATTEST_UNROLL
      for (int y = 0; y < NQ; ++y) {
        if (8 * y < w_q) {
          ATTEST_UNROLL
          for (int x = 0; x < 2; ++x) AddGlobal(row + 8 * y + 2 * t + x, acc_q[y][2 * u + x]);
        }
      }
    }
  }
}

// The end of RowDkDvKernel for the lane's keys kp + g + 8u (< nk) of key tile j0 of kv head kvh:
// dk = scale dK and dv = dV for the warp's half of the columns (from kcol of dK, vcol of dV).
// dd and dv are the kernel's p.d and p.dv, passed rather than read again from p (read again,
// RowDkDvKernel<4> and <8> spilled more: ptxas -v, sm_90).
template <int NH>
__device__ __forceinline__ void RowDkDvStore(const Dev& p, const Seq& s, int64_t kvh, int64_t j0,
                                             int64_t nk, int64_t dd, int64_t dv, int kp,
                                             int64_t kcol, int64_t vcol, int g, int t,
                                             const double (&acc_k)[NH][4],
                                             const double (&acc_v)[NH][4], double* dk,
                                             double* dvo) {
  ATTEST_UNROLL
  for (int u = 0; u < 2; ++u) {
    const int64_t c = kp + g + 8 * u;
    if (c >= nk) continue;
    double* out_k = dk + ((s.k_begin + j0 + c) * p.hkv + kvh) * dd + kcol;
    double* out_v = dvo + ((s.k_begin + j0 + c) * p.hkv + kvh) * dv + vcol;
    ATTEST_UNROLL
    for (int y = 0; y < NH; ++y) {
      ATTEST_UNROLL
      for (int x = 0; x < 2; ++x) {
        const int64_t col = 8 * y + 2 * t + x;
        if (col < dd / 2) out_k[col] = p.scale * acc_k[y][2 * u + x];
        if (col < dv / 2) out_v[col] = acc_v[y][2 * u + x];
      }
    }
  }
}

// RowDkDvKernel's column statistics per key (kp + g + 8u < nk): the lane's mass and count of
// visible entries summed over the 4 lanes of the row, then over the pair (through xb, after a
// barrier: every warp calls this); then the statistics, with the score magnitude statistic mag.
__device__ __forceinline__ void KeyColumnStats(int warp, int member, int kp, int g, int t,
                                               int64_t nk, double (&mass)[2],
                                               long long (&seen)[2], double* xb, double mag,
                                               DevStats* stats) {
  ATTEST_UNROLL
  for (int u = 0; u < 2; ++u) {
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mass[u] += __shfl_xor_sync(0xffffffffu, mass[u], o2);
      seen[u] += __shfl_xor_sync(0xffffffffu, seen[u], o2);
    }
  }
  __syncthreads();
  long long* xs = reinterpret_cast<long long*>(xb);
  if (member == 1 && t == 0) {
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      xb[(warp >> 1) * 64 + g + 8 * u] = mass[u];
      xs[(warp >> 1) * 64 + 32 + g + 8 * u] = seen[u];
    }
  }
  __syncthreads();
  MaxDouble(&stats->score_abs_max, mag);
  if (member == 0 && t == 0) {
    double mass_max = 0;
    long long seen_max = 0, unseen = 0;
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      if (kp + g + 8 * u >= nk) continue;
      const double m = mass[u] + xb[(warp >> 1) * 64 + g + 8 * u];
      const long long n = seen[u] + xs[(warp >> 1) * 64 + 32 + g + 8 * u];
      mass_max = fmax(mass_max, m);
      seen_max = max(seen_max, n);
      if (n == 0) ++unseen;
    }
    MaxDouble(&stats->col_mass_max, mass_max);
    MaxInt(&stats->max_queries, seen_max);
    if (unseen > 0) atomicAdd(&stats->unseen_keys, static_cast<unsigned long long>(unseen));
  }
}

// dK and dV with a pair of warps per 16 keys (p.tk = 16 per pair, p.tq = 32; d and dv multiples
// of 16, each at most 16 NH): for every (query head, query tile) that may see the key tile, in
// DkDvKernel's order, the pair computes dP^T = V dO^T and S^T = K Q^T for its 16 keys, each warp
// for 16 of the 32 queries, P^T and dS^T in their epilogue (ScoresBackwardMma's expressions,
// P = -0.0 where masked), hands its fragments of P^T, then of dS^T, to its partner through
// shared memory, and accumulates dV += P^T dO and dK += dS^T Q over the tile's 32 queries for its
// half of the columns, in registers. Per key, the column mass and the count of visible entries
// are summed over the lane's entries, then over the 4 lanes of the row and the pair.
// kFused (kPairs pairs): the block also adds its share of dQ, dS K over its keys, to dq in the
// order of the turns (FusedDq above); it then walks the query tiles in descending order.
template <int NH, bool kFused>
__global__ void ATTEST_LAUNCH_BOUNDS(kThreads, 1)
    RowDkDvKernel(Dev p, const double* q, const double* k, const double* v, const double* dout,
                  const double* lse, const double* delta, double* dk, double* dvo,
                  DevStats* stats, FusedDq fz) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * p.tk;
  const Seq s = SeqOf(p, b);
  if (j0 >= s.k_len) return;
  const int tq = p.tq, tk = p.tk;
  const int64_t dd = p.d, dv = p.dv, ratio = p.hq / p.hkv;
  const int64_t sd = RowVStride(dd), sdv = RowVStride(dv);
  const int warps = static_cast<int>(blockDim.x / 32);
  double* sk_tile = smem;
  double* sv_tile = sk_tile + tk * sd;
  double* sq_tile = sv_tile + tk * sdv;
  double* sdo_tile = sq_tile + tq * sd;
  double* rn = sdo_tile + tq * sdv;
  double* row_lse = rn + tq;
  double* row_delta = row_lse + tq;
  double* cn = row_delta + tq;
  double* xb = cn + tk;
  int64_t* lo = reinterpret_cast<int64_t*>(xb + 256 * warps);
  int64_t* hi = lo + tq;
  int64_t range[4];  // TileRowBounds
  const int warp = static_cast<int>(threadIdx.x / 32), lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int member = warp & 1, pair_base = warp & ~1;
  const int kp = 16 * (warp >> 1);   // the pair's first key in the tile
  const int qm = 16 * member;        // the warp's first query of the tile for the scores
  const int64_t kcol = member * (dd / 2), vcol = member * (dv / 2);  // its half of dK, dV

  const int64_t nk = min(static_cast<int64_t>(tk), s.k_len - j0);
  LoadKeysAt(p, s, kvh, k, dd, sd, j0, sk_tile, cn);
  LoadKeysAt(p, s, kvh, v, dv, sdv, j0, sv_tile, nullptr);
  double acc_k[NH][4], acc_v[NH][4];
  ZeroAcc(acc_k);
  ZeroAcc(acc_v);
  double mass[2] = {0, 0};  // the lane's keys kp + g + 8u: P summed over its entries
  long long seen[2] = {0, 0};
  int64_t adds = 0;
  double mag = 0;  // the score magnitude statistic of this thread's entries
  // The Q rows (and norms), then the dO rows (and lse, delta) of query tile i0 of head h.
  auto load_q = [&](int64_t h, int64_t i0) {
    const int64_t n = min(static_cast<int64_t>(tq), s.q_len - i0);
    LoadTile(q, p.hq, h, dd, sd, s.q_begin + i0, n, tq, sq_tile);
    LoadRows(p.qn, p.hq, h, s.q_begin + i0, n, tq, 0.0, rn);
    CopyCommit();
  };
  auto load_do = [&](int64_t h, int64_t i0) {
    const int64_t n = min(static_cast<int64_t>(tq), s.q_len - i0);
    LoadTile(dout, p.hq, h, dv, sdv, s.q_begin + i0, n, tq, sdo_tile);
    const int64_t at = LseIndex(p, b, h, s, i0);  // rows of one (batch, head) are contiguous
    LoadRows(lse, 1, 0, at, n, tq, -INFINITY, row_lse);
    LoadRows(delta, 1, 0, at, n, tq, 0.0, row_delta);
    CopyCommit();
  };
  auto next_pair = [&](int64_t* hh, int64_t* ii) {
    return NextDkDvPair<kFused>(p, s, kvh, ratio, tq, j0, nk, hh, ii);
  };
  int64_t h = kvh * ratio, i0 = -tq;
  if constexpr (kFused) {
    h = (kvh + 1) * ratio - 1;
    i0 = (s.q_len + tq - 1) / tq * tq;
  }
  bool more = next_pair(&h, &i0);
  if (more) {
    load_do(h, i0);
    load_q(h, i0);
  }
  // The lane's key norms (rows g, g + 8 of the pair's keys), once K's group is in.
  double key_n[2] = {0, 0};
  bool key_n_read = false;
  while (more) {
    ++adds;
    int64_t hn = h, in = i0;
    const bool next = next_pair(&hn, &in);  // the same in every thread
    TileRowBounds(p, s, i0, lo, hi, range);
    const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;
    double cs[2][4], cp[2][4];
    ZeroAcc(cs);
    ZeroAcc(cp);
    CopyWait<1>();  // K, V, and this tile's dO, lse and delta (its Q may still be on the way)
    __syncthreads();
    RowScores(sv_tile + (kp + g) * sdv, sdv, sdo_tile + (qm + g) * sdv, sdv, dv, t, cp);
    CopyWait<0>();  // this tile's Q and norms
    __syncthreads();
    if (!key_n_read) {
      key_n[0] = cn[kp + g];
      key_n[1] = cn[kp + g + 8];
      key_n_read = true;
    }
    RowScores(sk_tile + (kp + g) * sd, sd, sq_tile + (qm + g) * sd, sd, dd, t, cs);
    DkDvTileEntries(p, s, i0, j0, kp, qm, g, t, lo, hi, range, rn, row_lse, row_delta, key_n,
                    slope, cs, cp, mass, seen, mag);  // P^T in cs, dS^T in cp
    // The A fragments (slot t + 4x: query 2t + x of each block) of P^T, then of dS^T, to the
    // pair through xb; dV += P^T dO, then dK += dS^T Q, over the tile's 32 queries.
    auto hand = [&](const double (&c)[2][4]) {
      double a[2][4];
      AccumulatorsAsA(c, a);
      ATTEST_UNROLL
      for (int y = 0; y < 2; ++y) {
        double* dst = xb + (warp * 2 + y) * 128 + lane;
        ATTEST_UNROLL
        for (int x = 0; x < 4; ++x) dst[32 * x] = a[y][x];
      }
    };
    hand(cs);
    __syncthreads();
    RowKeyProduct(xb, pair_base, sdo_tile, sdv, vcol, dv / 2, acc_v);
    __syncthreads();  // dO and the P fragments are read
    if (next) load_do(hn, in);
    hand(cp);
    __syncthreads();
    RowKeyProduct(xb, pair_base, sq_tile, sd, kcol, dd / 2, acc_k);
    // kFused: this block's share of dQ for the tile's 32 queries, dS K over its keys, each
    // warp 16 queries and 1 / kPairs of the columns; then the turn.
    constexpr int NQ = 2 * NH / kPairs;  // D <= 16 NH: blocks of 8 columns per warp
    static_assert(NQ >= kChains && NQ % kChains == 0, "RowProductAdd's column blocks");
    [[maybe_unused]] double acc_q[NQ][4];
    [[maybe_unused]] int turn_next = -1;
    [[maybe_unused]] int* turn_at = nullptr;
    [[maybe_unused]] const int q0 = 16 * (warp & 1);
    [[maybe_unused]] const int64_t col_q = 8 * NQ * (warp >> 1);
    [[maybe_unused]] const int64_t w_q = min(dd - col_q, int64_t{8 * NQ});
    if constexpr (kFused) {
      FusedDqShare(xb, sk_tile, sd, q0, col_q, w_q, acc_q);
      // range[1]: the end of the keys the tile's rows may see (TileRowBounds, QueryTileHull's z).
      turn_next = NextKeyBlock(p, s, i0, blockIdx.x, range[1]);
      turn_at = fz.turn + (b * p.hq + h) * fz.q_tiles + i0 / tq;
      if (threadIdx.x == 0) AwaitTurn(turn_at, static_cast<int>(blockIdx.x), stats);
    }
    __syncthreads();  // Q and the dS fragments are read (kFused: and dq is ours)
    if (next) load_q(hn, in);
    if constexpr (kFused) {
      FusedDqAdd(p, s, fz.dq, h, i0, q0, col_q, w_q, g, t, acc_q);  // in the turn's order
      __syncthreads();
      if (threadIdx.x == 0) PassTurn(turn_at, turn_next);
    }
    more = next;
    h = hn;
    i0 = in;
  }
  CopyWait<0>();  // no copy outlives the block (K and V when no query tile ran)
  RowDkDvStore(p, s, kvh, j0, nk, dd, dv, kp, kcol, vcol, g, t, acc_k, acc_v, dk, dvo);
  KeyColumnStats(warp, member, kp, g, t, nk, mass, seen, xb, mag, stats);
  if (threadIdx.x == 0) MaxInt(&stats->sum_len_q, tq + adds);
  // dQ's chains (FusedDq): tk keys, one addition per key block and the scaling's.
  if (kFused && threadIdx.x == 0) MaxInt(&stats->sum_len_k, tk + (s.k_len + tk - 1) / tk + 1);
}

}  // namespace
