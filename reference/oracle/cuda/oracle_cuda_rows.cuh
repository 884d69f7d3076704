// The CUDA float64 oracle's row kernels, in which each warp owns 16 query rows (the forward,
// dQ) or, with a partner warp, 16 keys (dK, dV) (FlashAttention-2's division of work: Dao,
// "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", 2023,
// section 3.3): the scores, P, dS and the accumulators of those rows stay in the warp's
// registers, in the fragments of mma.sync.m16n8k8.f64 (sm_90), so no score tile and no
// accumulator goes through shared memory (dK/dV hands P^T and dS^T fragments to the partner
// warp). Included by oracle_cuda.cu only, after oracle_cuda_kernels.cuh and before the row
// kernels' files.
//
// From scores to a second product without shuffles. The accumulator of S = Q K^T holds, in lane
// (g, t), the keys 2t and 2t + 1 of rows g and g + 8 of each 16 x 8 block (Mma16x8x8's C
// layout), while the A operand of P V wants keys t and t + 4 (its k slots). A product's k order
// is free (mma.sync sums its 8 products in an order the PTX ISA leaves unspecified, and a
// block's chain is the same sum in any k order), so the kernels relabel the k slots: slot t + 4x
// holds key 2t + x, in A and in B alike. P's accumulator then is P V's A operand as it stands,
// and B reads the V rows 2t and 2t + 1. The same relabelling lets the scores' A and B fragments
// (Q and K, k = 2t and 2t + 1 of each step) come in one 16-byte load each.
//
// RowForwardKernel computes what ForwardKernel computes, expression for expression: the scores and
// their transform and mask (ScoreOf, Visible), the online softmax with Sum2's compensated row
// sum (a TwoSum chain over the lane's 8 keys, then a TwoSum tree over the row's 4 lanes),
// O = f O + P V with the tile's product summed apart (a chain of tk over the tile's keys) and
// then added, o = O / l, lse = m + log l. The chains and the statistics are those of
// ForwardKernel with tk = 32, so oracle_cuda.cu's error bound holds unchanged. RowDqKernel and
// RowDkDvKernel compute what DqKernel and DkDvKernel compute (ScoresBackwardMma's expressions),
// each tile's product summed apart and then added, with the chain lengths they report.
//
// This file holds what the row kernels share: the tile sizes, strides and fragment loads, the
// score tile and its row statistics, and the two products (RowScores, RowProductAdd). The
// kernels are in oracle_cuda_rows_forward.cuh (RowForwardKernel, RowForwardPairKernel) and
// oracle_cuda_rows_backward.cuh (RowDqKernel, RowDkDvKernel and its fused dQ).
#pragma once

namespace {

#ifdef ATTEST_ORACLE_CUDA_EMULATE
#define ATTEST_LAUNCH_BOUNDS(threads, blocks)
#else
#define ATTEST_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#endif

constexpr int kRowTileKeys = 32;  // the key tile of the row kernels: 4 blocks of 8 keys
#ifndef ATTEST_ROW_CHAINS
#define ATTEST_ROW_CHAINS 2
#endif
// Column blocks whose tile products (P V, dS K) run side by side, so that each warp has that
// many independent mma chains in flight (an mma's result feeds the next of its chain).
constexpr int kChains = ATTEST_ROW_CHAINS;

// Shared-memory row strides of the row kernels, in doubles. Q and K rows are read in 16-byte
// pairs (k = 2t, 2t + 1 of lane (g, t), rows g apart): with a stride of 8 (mod 16), the 8 lanes
// of each quarter-warp read 8 different 16-byte bank groups (CUDA C++ Programming Guide, "Shared
// Memory", compute capability 5.x and later: 16-byte accesses are served a quarter-warp at a
// time). V rows are read as single doubles, lane (g, t) at row 2t + x, column g: with a stride
// of 2 (mod 8), (2t + x) stride + g is 4t + g + 2x (mod 16), so the 16 lanes of each half-warp
// hit 16 different bank pairs (the 8-byte rule of Stride in oracle_cuda_device.cuh).
__host__ __device__ int64_t PairStride(int64_t width) { return width + (24 - width % 16) % 16; }
__host__ __device__ int64_t RowVStride(int64_t width) { return width + (10 - width % 8) % 8; }

// Two consecutive doubles from shared memory (16-byte aligned) in one load.
__device__ void LoadPair(const double* at, double& x0, double& x1) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  x0 = at[0];
  x1 = at[1];
#else
  const double2 v = *reinterpret_cast<const double2*>(at);
  x0 = v.x;
  x1 = v.y;
#endif
}

// Rows [row0, row0 + n) of head `head` of a [rows, heads, width] tensor (width a multiple of
// 8) into a tile of `rows_tile` rows (a multiple of 16; rows past n are zero) laid out as the A
// fragments of the row kernels' m16n8k8 products (slot t + 4x of a block of 8 holds k = 2t + x):
// per 16 rows and block of 8 columns, 64 doubles with lane (g, t)'s pair (row g, row g + 8) at
// k = 2t, then 64 with its pair at k = 2t + 1. A lane's A operand is two 16-byte loads, 2 lane
// apart (contiguous over the warp: no bank conflicts), in the register order of the mma.
// Asynchronous as LoadTile (an 8-byte copy per element; the caller commits and waits).
__device__ int64_t FragIndex(int r, int k, int width) {
  const int lane = 4 * (r % 8) + (k % 8) / 2;
  return ((static_cast<int64_t>(r / 16) * (width / 8) + k / 8) * 2 + k % 2) * 64 + 2 * lane +
         (r % 16) / 8;
}
__device__ void LoadFragTile(const double* x, int64_t heads, int64_t head, int64_t width,
                             int64_t row0, int64_t n, int rows_tile, double* tile) {
  const int w = static_cast<int>(width), total = rows_tile * w;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const int r = e / w, k = e % w;
    double* dst = tile + FragIndex(r, k, w);
    if (r < n) {
      CopyAsync(dst, x + ((row0 + r) * heads + head) * width + k);
    } else {
      *dst = 0.0;
    }
  }
}

// Whether every entry of a whole tile (WholeTile) has a plain score: no softcap and no ALiBi
// slope. Then ScoreOf's s is scale q.k, and the score magnitude statistic of a thread's entries
// is fl(fl(|scale| nq) nk) at its largest q norm and its largest k norm (a rounded product of
// non-negative numbers never decreases when a factor grows, and |slope| dist adds +0), so the
// row kernels skip ScoreOf per entry.
__device__ bool PlainTile(const Dev& p, bool whole, double slope) {
  return whole && slope == 0 && !(p.softcap > 0);
}

// A plain tile's score magnitude statistic for a thread (PlainTile): fl(fl(|scale| nq) nk) at its
// largest q norm and its largest k norm, with one side given (`one`: the largest of its own
// rows' norms) and the other the largest of norms[8y + 2t], norms[8y + 2t + 1] over y < NB (the
// lane's columns of the tile's blocks of 8). keys_given: `one` holds the k norms.
template <int NB>
__device__ double PlainTileMag(const Dev& p, double one, const double* norms, int t,
                               bool keys_given) {
  double other = 0;
  ATTEST_UNROLL
  for (int y = 0; y < NB; ++y) {
    other = fmax(other, fmax(norms[8 * y + 2 * t], norms[8 * y + 2 * t + 1]));
  }
  return keys_given ? fabs(p.scale) * other * one : fabs(p.scale) * one * other;
}

// Sum2's combination of the (sum, compensation) pairs of the 4 lanes of a row (lanes g * 4 + t,
// t < 4): a TwoSum tree as WarpSum2's, over lane masks 1 and 2; every lane ends with the same.
__device__ void QuadSum2(double& sum, double& comp) {
  for (int o = 1; o <= 2; o <<= 1) {
    const double s2 = __shfl_xor_sync(0xffffffffu, sum, o);
    const double c2 = __shfl_xor_sync(0xffffffffu, comp, o);
    Sum2Combine(sum, comp, s2, c2);
  }
}

// The second product of a row kernel's tile, acc[y] += A B for the column blocks 8y < w: over
// NK k steps of 8, a chain from zero per block of 8 columns (kChains blocks side by side:
// independent chains between the dependent mma), then added (the tile's product summed apart,
// as the CPU oracle's tiles). a[kb] is step kb's A fragment (slot t + 4x: k = 2t + x of the
// step); B is read at pb (the lane's row 2t, column g of the first step) with row stride sb:
// rows 2t and 2t + 1 of step kb, column 8y. RowProductAddOf takes the A fragments from
// a_of(kb, a) instead (RowForwardPairKernel reads them from shared memory per column group).
template <int NY, int NK, class AOf>
__device__ void RowProductAddOf(AOf a_of, const double* pb, int64_t sb, int64_t w,
                                double (&acc)[NY][4]) {
  ATTEST_UNROLL
  for (int y0 = 0; y0 < NY; y0 += kChains) {
    if (8 * y0 < w) {
      double part[kChains][4];
      ATTEST_UNROLL
      for (int z = 0; z < kChains; ++z) {
        ATTEST_UNROLL
        for (int e = 0; e < 4; ++e) part[z][e] = 0;
      }
      ATTEST_UNROLL
      for (int kb = 0; kb < NK; ++kb) {
        double a[4];
        a_of(kb, a);
        ATTEST_UNROLL
        for (int z = 0; z < kChains; ++z) {
          const int y = y0 + z;
          const double bb[2] = {pb[8 * kb * sb + 8 * y], pb[(8 * kb + 1) * sb + 8 * y]};
          Mma1688(part[z], a, bb);
        }
      }
      ATTEST_UNROLL
      for (int z = 0; z < kChains; ++z) {
        ATTEST_UNROLL
        for (int e = 0; e < 4; ++e) acc[y0 + z][e] += part[z][e];
      }
    }
  }
}

template <int NY, int NK>
__device__ void RowProductAdd(const double (&a)[NK][4], const double* pb, int64_t sb, int64_t w,
                              double (&acc)[NY][4]) {
  RowProductAddOf<NY, NK>(
      [&](int kb, double (&x)[4]) {
        ATTEST_UNROLL
        for (int e = 0; e < 4; ++e) x[e] = a[kb][e];
      },
      pb, sb, w, acc);
}

// acc = 0 for NY blocks of accumulators (or of S tiles, before their product).
template <int NY>
__device__ __forceinline__ void ZeroAcc(double (&acc)[NY][4]) {
  ATTEST_UNROLL
  for (int y = 0; y < NY; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) acc[y][e] = 0;
  }
}

// A accumulators of NK blocks (rows g, g + 8; columns 2t, 2t + 1) as the A fragments of the next
// product: with slot t + 4x holding k = 2t + x, accumulator element (x, u) is A's element 2x + u.
template <int NK>
__device__ void AccumulatorsAsA(const double (&c)[NK][4], double (&a)[NK][4]) {
  ATTEST_UNROLL
  for (int kb = 0; kb < NK; ++kb) {
    a[kb][0] = c[kb][0];
    a[kb][1] = c[kb][2];
    a[kb][2] = c[kb][1];
    a[kb][3] = c[kb][3];
  }
}

// The transform and mask of a row kernel's S tile in place (Scores' entry): c[y][e] becomes the
// score of (row r0 + g + 8 (e >> 1), key col0 + 8 y + 2t + (e & 1)) of query tile i0 and key
// tile j0, or -inf where masked; `mag` gathers the score magnitude statistic of the entries.
template <int NB>
__device__ void ScoreTile(const Dev& p, const Seq& s, int64_t i0, int64_t j0, int r0, int col0,
                          const int64_t* lo, const int64_t* hi, const int64_t* range,
                          const double* rn, const double* cn, double slope, int g, int t,
                          double (&c)[NB][4], double& mag) {
  const bool whole = WholeTile(p, s, i0, j0, range);
  const bool plain = PlainTile(p, whole, slope);
  if (plain) {
    mag = fmax(mag, PlainTileMag<NB>(p, fmax(rn[r0 + g], rn[r0 + g + 8]), cn + col0, t, false));
  }
  ATTEST_UNROLL
  for (int y = 0; y < NB; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + g + 8 * (e >> 1), col = col0 + 8 * y + 2 * t + (e & 1);
      const int64_t j = j0 + col;
      double sc = -INFINITY;
      if (plain) {
        sc = p.scale * c[y][e];
      } else if (whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i0 + r, j))) {
        double th = 0;
        sc = ScoreOf(p, s, i0 + r, j, slope, c[y][e], rn[r], cn[col], th, mag);
      }
      c[y][e] = sc;
    }
  }
}

// The maximum and the count of visible entries of each of the lane's two rows (u: rows g and
// g + 8) over the S tile c, combined over the row's 4 lanes.
template <int NB>
__device__ void RowMaxCount(const double (&c)[NB][4], double (&mx)[2], long long (&count)[2]) {
  ATTEST_UNROLL
  for (int u = 0; u < 2; ++u) {
    mx[u] = -INFINITY;
    count[u] = 0;
    ATTEST_UNROLL
    for (int y = 0; y < NB; ++y) {
      ATTEST_UNROLL
      for (int x = 0; x < 2; ++x) {
        mx[u] = fmax(mx[u], c[y][2 * u + x]);
        count[u] += c[y][2 * u + x] > -INFINITY ? 1 : 0;
      }
    }
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx[u] = fmax(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], o2));
      count[u] += __shfl_xor_sync(0xffffffffu, count[u], o2);
    }
  }
}

// The k of slot t + 4x in step `half` of a 16-wide k block, for the products whose A and B both
// come from tiles at a row stride of 2 (mod 8) (RowDqKernel's S and dP): over the two steps the
// 16 k are taken once each, and the 16 lanes of a half-warp (rows g apart) read 16 different
// bank pairs: 2g + (t & 1) + 8 (t >> 1) + 2x + 4 half (mod 16).
__device__ int SlotK(int t, int half, int x) { return 4 * half + 2 * x + (t & 1) + 8 * (t >> 1); }

// c[y][e] += A B^T over width w for 16 rows of A and NY blocks of 8 rows of B (row 8y + g),
// both in shared memory at row strides sa and sb of 2 (mod 8), in SlotK's k order: pa points at
// A's row g (of the 16), pb at B's row g; lane (g, t). The scores (S = Q K^T, dP = dO V^T) of
// the backward's row kernels.
template <int NY>
__device__ void RowScores(const double* pa, int64_t sa, const double* pb, int64_t sb, int64_t w,
                          int t, double (&c)[NY][4]) {
  // One step: slot t + 4x holds k = kk + slot(x).
  auto step = [&](int64_t kk, auto slot) {
    double a[4], bb[NY][2];
    ATTEST_UNROLL
    for (int x = 0; x < 4; ++x) a[x] = pa[8 * (x & 1) * sa + kk + slot(x >> 1)];
    ATTEST_UNROLL
    for (int y = 0; y < NY; ++y) {
      ATTEST_UNROLL
      for (int x = 0; x < 2; ++x) bb[y][x] = pb[8 * y * sb + kk + slot(x)];
    }
    ATTEST_UNROLL
    for (int y = 0; y < NY; ++y) Mma1688(c[y], a, bb[y]);
  };
  const int64_t w16 = w / 16 * 16;
  ATTEST_UNROLL_BY_2
  for (int64_t kk = 0; kk < w16; kk += 16) {
    step(kk, [&](int x) { return SlotK(t, 0, x); });
    step(kk, [&](int x) { return SlotK(t, 1, x); });
  }
  // A last step of 8 (w = 8 mod 16) in the plain order (k = t + 4x: some lanes share a bank).
  if (w16 < w) step(w16, [&](int x) { return t + 4 * x; });
}

}  // namespace
