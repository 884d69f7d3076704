// The CUDA float64 oracle's kernels in which each warp owns 16 query rows (FlashAttention-2's
// division of work: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", 2023, section 3.3): the scores, P and the output accumulator of those rows stay
// in the warp's registers, in the fragments of mma.sync.m16n8k8.f64 (sm_90), so no score tile
// and no accumulator goes through shared memory. Included by oracle_cuda.cu only, after
// oracle_cuda_kernels.cuh.
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
// What is computed is what ForwardKernel computes, expression for expression: the scores and
// their transform and mask (ScoreOf, Visible), the online softmax with Sum2's compensated row
// sum (a TwoSum chain over the lane's 8 keys, then a TwoSum tree over the row's 4 lanes),
// O = f O + P V with the tile's product summed apart (a chain of tk over the tile's keys) and
// then added, o = O / l, lse = m + log l. The chains and the statistics are those of
// ForwardKernel with tk = 32, so oracle_cuda.cu's error bound holds unchanged.
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

// Shared memory of RowForwardKernel, in doubles: the Q tile, one K tile (with its norms), one V
// tile, the Q norms and the rows' key bounds.
__host__ __device__ int64_t RowForwardShared(int64_t d, int64_t dv, int tq) {
  return tq * PairStride(d) + kRowTileKeys * PairStride(d) + kRowTileKeys * RowVStride(dv) +
         kRowTileKeys + tq + 2 * tq;
}

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

// MaySee after TileRowBounds (lo, hi in shared memory) by a warp vote: each lane takes rows of
// the tile; every lane of every warp gets the answer.
__device__ bool MaySeeVote(const Dev& p, const int64_t* lo, const int64_t* hi, int64_t j0,
                           int64_t nk) {
  bool any = false;
  for (int r = threadIdx.x % 32; r < p.tq; r += 32) {
    any = any || (lo[r] < hi[r] && lo[r] < j0 + nk && hi[r] > j0);
  }
  return __ballot_sync(0xffffffffu, any) != 0;
}

// NextKeyTile with MaySeeVote.
__device__ int64_t NextKeyTileVote(const Dev& p, const Seq& s, const int64_t* lo,
                                   const int64_t* hi, int64_t j, int64_t end) {
  while (j < end && !MaySeeVote(p, lo, hi, j, min(static_cast<int64_t>(p.tk), s.k_len - j))) {
    j += p.tk;
  }
  return j;
}

// The K rows (and norms) or V rows of key tile j0 at row stride `stride` (asynchronous, one
// group), as LoadKeys.
__device__ void LoadKeysAt(const Dev& p, const Seq& s, int64_t g, const double* x,
                           int64_t width, int64_t stride, int64_t j0, double* tile,
                           double* norms) {
  const int64_t nk = min(static_cast<int64_t>(p.tk), s.k_len - j0);
  LoadTile(x, p.hkv, g, width, stride, s.k_begin + j0, nk, p.tk, tile);
  if (norms != nullptr) LoadRows(p.kn, p.hkv, g, s.k_begin + j0, nk, p.tk, 0.0, norms);
  CopyCommit();
}

// Sum2's combination of the (sum, compensation) pairs of the 4 lanes of a row (lanes g * 4 + t,
// t < 4): a TwoSum tree as WarpSum2's, over lane masks 1 and 2; every lane ends with the same.
__device__ void QuadSum2(double& sum, double& comp) {
  for (int o = 1; o <= 2; o <<= 1) {
    const double s2 = __shfl_xor_sync(0xffffffffu, sum, o);
    const double c2 = __shfl_xor_sync(0xffffffffu, comp, o);
    const double t = sum + s2;
    const double bp = t - sum;
    const double e = (sum - (t - bp)) + (s2 - bp);
    sum = t;
    comp = (comp + c2) + e;
  }
}

// The forward with a warp per 16 query rows (p.tq = 16 warps, p.tk = kRowTileKeys; d and dv
// multiples of 8, dv <= 8 NDV): for every key tile that some row of the tile may see
// (NextKeyTile's walk), S in registers (16 x 32 per warp), the score transform and mask, the
// online softmax (each row's max, count and compensated sum over its 4 lanes), then O = f O +
// P V in registers. K and V stream through one buffer each as in ForwardKernel.
template <int NDV>
__global__ void ATTEST_LAUNCH_BOUNDS(kThreads, 1)
    RowForwardKernel(Dev p, const double* q, const double* k, const double* v, double* o,
                     double* lse, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  constexpr int tk = kRowTileKeys, kNb = tk / 8;
  const int64_t kv = h / (p.hq / p.hkv);
  const int tq = p.tq;
  const int64_t dv = p.dv, sq = PairStride(p.d), sv = RowVStride(dv);
  double* sq_tile = smem;
  double* sk_tile = sq_tile + tq * sq;
  double* sv_tile = sk_tile + tk * sq;
  double* cn = sv_tile + tk * sv;
  double* rn = cn + tk;
  int64_t* lo = reinterpret_cast<int64_t*>(rn + tq);
  int64_t* hi = lo + tq;
  int64_t range[4];  // TileRowBounds
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int r0 = 16 * static_cast<int>(threadIdx.x / 32);  // the warp's first row in the tile
  const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadTile(q, p.hq, h, p.d, sq, s.q_begin + i0, nq, tq, sq_tile);
  LoadRows(p.qn, p.hq, h, s.q_begin + i0, nq, tq, 0.0, rn);
  CopyCommit();
  // Row u of the lane is tile row r0 + g + 8 u; acc[y][e] is O's element (row g + 8 (e >> 1),
  // column 8 y + 2t + (e & 1)) of the warp's rows.
  double acc[NDV][4];
  ATTEST_UNROLL
  for (int y = 0; y < NDV; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) acc[y][e] = 0;
  }
  double m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, comp[2] = {0, 0};
  long long keys[2] = {0, 0}, tiles[2] = {0, 0};
  double mag = 0;  // the score magnitude statistic of this thread's entries
  TileRowBounds(p, s, i0, lo, hi, range);
  const int64_t end = range[1];
  int64_t j0 = NextKeyTileVote(p, s, lo, hi, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeysAt(p, s, kv, k, p.d, sq, j0, sk_tile, cn);
    LoadKeysAt(p, s, kv, v, dv, sv, j0, sv_tile, nullptr);
  }
  while (j0 < end) {
    const int64_t jn = NextKeyTileVote(p, s, lo, hi, j0 + tk, end);  // the same in every thread
    CopyWait<1>();  // Q and this tile's K (its V may still be on the way)
    __syncthreads();
    // S = Q K^T for the warp's 16 rows and the tile's 32 keys: c[y][e] is entry (row
    // g + 8 (e >> 1), key 8 y + 2t + (e & 1)); k slot t + 4x holds k = 2t + x of each step.
    double c[kNb][4];
    ATTEST_UNROLL
    for (int y = 0; y < kNb; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) c[y][e] = 0;
    }
    {
      const double* qa = sq_tile + (r0 + g) * sq + 2 * t;
      const double* kb = sk_tile + g * sq + 2 * t;
      ATTEST_UNROLL_BY_2
      for (int64_t k0 = 0; k0 < p.d; k0 += 8) {
        double a[4];
        LoadPair(qa + k0, a[0], a[2]);
        LoadPair(qa + 8 * sq + k0, a[1], a[3]);
        ATTEST_UNROLL
        for (int y = 0; y < kNb; ++y) {
          double bb[2];
          LoadPair(kb + 8 * y * sq + k0, bb[0], bb[1]);
          Mma1688(c[y], a, bb);
        }
      }
    }
    // The transformed, masked scores (Scores' entry), then K and its norms are free.
    const bool whole = WholeTile(p, s, i0, j0, range);
    ATTEST_UNROLL
    for (int y = 0; y < kNb; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + g + 8 * (e >> 1), col = 8 * y + 2 * t + (e & 1);
        const int64_t j = j0 + col;
        double sc = -INFINITY;
        if (whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i0 + r, j))) {
          double th = 0;
          sc = ScoreOf(p, s, i0 + r, j, slope, c[y][e], rn[r], cn[col], th, mag);
        }
        c[y][e] = sc;
      }
    }
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, k, p.d, sq, jn, sk_tile, cn);  // the next K
    // The online softmax of each of the lane's two rows (OnlineSoftmax's expressions): c
    // becomes P = exp(s - m_new); f[u] rescales O.
    double f[2];
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      double mx = -INFINITY;
      long long count = 0;
      ATTEST_UNROLL
      for (int y = 0; y < kNb; ++y) {
        ATTEST_UNROLL
        for (int x = 0; x < 2; ++x) {
          mx = fmax(mx, c[y][2 * u + x]);
          count += c[y][2 * u + x] > -INFINITY ? 1 : 0;
        }
      }
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
        count += __shfl_xor_sync(0xffffffffu, count, o2);
      }
      const double m_new = fmax(m[u], mx);
      double fr = 1;
      if (count > 0 && mx > m[u] && m[u] != -INFINITY) fr = exp(m[u] - mx);
      double sum = 0, cs = 0;
      ATTEST_UNROLL
      for (int y = 0; y < kNb; ++y) {
        ATTEST_UNROLL
        for (int x = 0; x < 2; ++x) {
          const double sc = c[y][2 * u + x];
          const double pv = count > 0 && sc > -INFINITY ? exp(sc - m_new) : 0.0;
          c[y][2 * u + x] = pv;
          TwoSumAdd(sum, cs, pv);
        }
      }
      QuadSum2(sum, cs);
      f[u] = 1;
      if (count > 0) {
        double lr = l[u] * fr, cr = comp[u] * fr + cs;
        TwoSumAdd(lr, cr, sum);
        l[u] = lr;
        comp[u] = cr;
        m[u] = m_new;
        f[u] = fr;
        keys[u] += count;
        tiles[u] += 1;
      }
    }
    if (jn < end) {
      CopyWait<1>();  // this tile's V (the next K may still be on the way)
    } else {
      CopyWait<0>();
    }
    __syncthreads();
    // O = f O + P V: per block of 8 columns, the tile's product as a chain over its 4 key
    // blocks from zero, then added. P's accumulator is the A operand (slot t + 4x: key 2t + x).
    {
      const double* vb = sv_tile + 2 * t * sv + g;
      // kChains blocks of columns side by side: independent chains between the dependent mma.
      ATTEST_UNROLL
      for (int y0 = 0; y0 < NDV; y0 += kChains) {
        if (8 * y0 < dv) {
          double part[kChains][4];
          ATTEST_UNROLL
          for (int z = 0; z < kChains; ++z) {
            ATTEST_UNROLL
            for (int e = 0; e < 4; ++e) part[z][e] = 0;
          }
          ATTEST_UNROLL
          for (int kb = 0; kb < kNb; ++kb) {
            const double a[4] = {c[kb][0], c[kb][2], c[kb][1], c[kb][3]};
            ATTEST_UNROLL
            for (int z = 0; z < kChains; ++z) {
              const int y = y0 + z;
              const double bb[2] = {vb[8 * kb * sv + 8 * y], vb[(8 * kb + 1) * sv + 8 * y]};
              Mma1688(part[z], a, bb);
            }
          }
          ATTEST_UNROLL
          for (int z = 0; z < kChains; ++z) {
            ATTEST_UNROLL
            for (int e = 0; e < 4; ++e) {
              acc[y0 + z][e] = acc[y0 + z][e] * f[e >> 1] + part[z][e];
            }
          }
        }
      }
    }
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, v, dv, sv, jn, sv_tile, nullptr);  // the next V
    j0 = jn;
  }
  CopyWait<0>();  // no copy outlives the block (Q when no key tile ran)
  double lse_max = 0;
  long long keys_max = 0, chain_max = 0, empty = 0;
  ATTEST_UNROLL
  for (int u = 0; u < 2; ++u) {
    const int r = r0 + g + 8 * u;
    if (r >= nq) continue;
    double* out = o + ((s.q_begin + i0 + r) * p.hq + h) * dv;
    ATTEST_UNROLL
    for (int y = 0; y < NDV; ++y) {
      if (8 * y < dv) {
        ATTEST_UNROLL
        for (int x = 0; x < 2; ++x) {
          out[8 * y + 2 * t + x] = m[u] == -INFINITY ? 0.0 : acc[y][2 * u + x] / (l[u] + comp[u]);
        }
      }
    }
    if (t == 0) {
      double x = -INFINITY;
      if (m[u] == -INFINITY) {
        ++empty;
      } else {
        x = m[u] + log(l[u] + comp[u]);
        lse_max = fmax(lse_max, fabs(x));
      }
      lse[LseIndex(p, b, h, s, i0 + r)] = x;
      keys_max = max(keys_max, keys[u]);
      chain_max = max(chain_max, static_cast<long long>(tk) + tiles[u]);
    }
  }
  MaxDouble(&stats->score_abs_max, mag);
  MaxDouble(&stats->lse_abs_max, lse_max);
  MaxInt(&stats->max_keys, keys_max);
  MaxInt(&stats->sum_len_k, chain_max);
  if (empty > 0) atomicAdd(&stats->empty_rows, static_cast<unsigned long long>(empty));
}

// Shared memory of RowDqKernel, in doubles: the Q and dO tiles, one K tile (with its norms), one
// V tile and the rows' key bounds. Every tile at row stride RowVStride (2 mod 8).
__host__ __device__ int64_t RowDqShared(int64_t d, int64_t dv, int tq) {
  return tq * (RowVStride(d) + RowVStride(dv)) +
         kRowTileKeys * (RowVStride(d) + RowVStride(dv)) + kRowTileKeys + 2 * tq;
}

// The k of slot t + 4x in step `half` of a 16-wide k block, for the products whose A and B both
// come from tiles at a row stride of 2 (mod 8) (RowDqKernel's S and dP): over the two steps the
// 16 k are taken once each, and the 16 lanes of a half-warp (rows g apart) read 16 different
// bank pairs: 2g + (t & 1) + 8 (t >> 1) + 2x + 4 half (mod 16).
__device__ int SlotK(int t, int half, int x) { return 4 * half + 2 * x + (t & 1) + 8 * (t >> 1); }

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
  int64_t j0 = NextKeyTileVote(p, s, lo, hi, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeysAt(p, s, kv, v, dv, sdv, j0, sv_tile, nullptr);
    LoadKeysAt(p, s, kv, k, dd, sd, j0, sk_tile, cn);
  }
  // Both products of the scores: c[y][e] += A B^T over width w for the warp's rows and keys,
  // A (Q or dO) and B (K or V) rows at stride sa and sb (SlotK's k order).
  auto scores = [&](const double* at, int64_t sa, const double* bt, int64_t sb, int64_t w,
                    double (&c)[2][4]) {
    const double* pa = at + (r0 + g) * sa;
    const double* pb = bt + (k0w + g) * sb;
    // One step: slot t + 4x holds k = kk + slot(x).
    auto step = [&](int64_t kk, auto slot) {
      double a[4], bb[2][2];
      ATTEST_UNROLL
      for (int x = 0; x < 4; ++x) a[x] = pa[8 * (x & 1) * sa + kk + slot(x >> 1)];
      ATTEST_UNROLL
      for (int y = 0; y < 2; ++y) {
        ATTEST_UNROLL
        for (int x = 0; x < 2; ++x) bb[y][x] = pb[8 * y * sb + kk + slot(x)];
      }
      ATTEST_UNROLL
      for (int y = 0; y < 2; ++y) Mma1688(c[y], a, bb[y]);
    };
    const int64_t w16 = w / 16 * 16;
    ATTEST_UNROLL_BY_2
    for (int64_t kk = 0; kk < w16; kk += 16) {
      step(kk, [&](int x) { return SlotK(t, 0, x); });
      step(kk, [&](int x) { return SlotK(t, 1, x); });
    }
    // A last step of 8 (w = 8 mod 16) in the plain order (k = t + 4x: some lanes share a bank).
    if (w16 < w) step(w16, [&](int x) { return t + 4 * x; });
  };
  while (j0 < end) {
    const int64_t jn = NextKeyTileVote(p, s, lo, hi, j0 + tk, end);  // the same in every thread
    ++visited;
    double cs[2][4], cp[2][4];
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) cs[y][e] = cp[y][e] = 0;
    }
    CopyWait<1>();  // Q, dO and this tile's V (its K may still be on the way)
    __syncthreads();
    scores(sdo_tile, sdv, sv_tile, sdv, dv, cp);
    CopyWait<0>();  // this tile's K and its norms
    __syncthreads();
    scores(sq_tile, sd, sk_tile, sd, dd, cs);
    // dS in the scores' registers (ScoresBackwardMma's entry).
    const bool whole = WholeTile(p, s, i0, j0, range);
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int u = e >> 1, r = r0 + g + 8 * u, col = k0w + 8 * y + 2 * t + (e & 1);
        const int64_t j = j0 + col;
        double dsv = 0;
        if (whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i0 + r, j))) {
          double th = 0;
          const double sc = ScoreOf(p, s, i0 + r, j, slope, cs[y][e], row_n[u], cn[col], th, mag);
          if (sc > -INFINITY) {
            const double pr = exp(sc - row_lse[u]);
            dsv = pr * (cp[y][e] - row_delta[u]);
            if (p.softcap > 0 && pr != 0.0) dsv *= 1.0 - th * th;
          }
        }
        cs[y][e] = dsv;
      }
    }
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, v, dv, sdv, jn, sv_tile, nullptr);  // V is free
    // dQ += dS K over the warp's 16 keys: dS's accumulator is the A operand (slot t + 4x: key
    // 2t + x of each block of 8), B reads the K rows 2t and 2t + 1.
    {
      const double* kb = sk_tile + (k0w + 2 * t) * sd + g;
      ATTEST_UNROLL
      for (int y0 = 0; y0 < ND; y0 += kChains) {
        if (8 * y0 < dd) {
          double part[kChains][4];
          ATTEST_UNROLL
          for (int z = 0; z < kChains; ++z) {
            ATTEST_UNROLL
            for (int e = 0; e < 4; ++e) part[z][e] = 0;
          }
          ATTEST_UNROLL
          for (int x8 = 0; x8 < 2; ++x8) {
            const double a[4] = {cs[x8][0], cs[x8][2], cs[x8][1], cs[x8][3]};
            ATTEST_UNROLL
            for (int z = 0; z < kChains; ++z) {
              const int y = y0 + z;
              const double bb[2] = {kb[8 * x8 * sd + 8 * y], kb[(8 * x8 + 1) * sd + 8 * y]};
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

}  // namespace
