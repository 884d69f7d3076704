// The CUDA float64 oracle's row kernels, in which each warp owns 16 query rows (the forward,
// dQ) or, with a partner warp, 16 keys (dK, dV) (FlashAttention-2's division of work: Dao,
// "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", 2023,
// section 3.3): the scores, P, dS and the accumulators of those rows stay in the warp's
// registers, in the fragments of mma.sync.m16n8k8.f64 (sm_90), so no score tile and no
// accumulator goes through shared memory (dK/dV hands P^T and dS^T fragments to the partner
// warp). Included by oracle_cuda.cu only, after oracle_cuda_kernels.cuh.
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

// Shared memory of RowForwardKernel, in doubles: the Q tile (A fragments: LoadFragTile), one K
// tile (with its norms), one V tile, the Q norms and the rows' key bounds.
__host__ __device__ int64_t RowForwardShared(int64_t d, int64_t dv, int tq) {
  return tq * d + kRowTileKeys * PairStride(d) + kRowTileKeys * RowVStride(dv) +
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

// The end of a row forward: o = O / l for the lane's rows r0 + g + 8u (< nq) and the columns
// col0 + 8y + 2t + x < col0 + w of O's accumulator, then, where `rows_owner`, lse = m + log l
// and the rows' statistics; the score magnitude statistic from every thread.
template <int NY>
__device__ void RowForwardEnd(const Dev& p, const Seq& s, int64_t b, int64_t h, int64_t i0,
                              int r0, int64_t nq, int64_t col0, int64_t w, bool rows_owner,
                              const double (&acc)[NY][4], const double (&m)[2],
                              const double (&l)[2], const double (&comp)[2],
                              const long long (&keys)[2], const long long (&tiles)[2],
                              double mag, double* o, double* lse, DevStats* stats) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  double lse_max = 0;
  long long keys_max = 0, chain_max = 0, empty = 0;
  ATTEST_UNROLL
  for (int u = 0; u < 2; ++u) {
    const int r = r0 + g + 8 * u;
    if (r >= nq) continue;
    double* out = o + ((s.q_begin + i0 + r) * p.hq + h) * p.dv + col0;
    ATTEST_UNROLL
    for (int y = 0; y < NY; ++y) {
      if (8 * y < w) {
        ATTEST_UNROLL
        for (int x = 0; x < 2; ++x) {
          out[8 * y + 2 * t + x] = m[u] == -INFINITY ? 0.0 : acc[y][2 * u + x] / (l[u] + comp[u]);
        }
      }
    }
    if (t == 0 && rows_owner) {
      double x = -INFINITY;
      if (m[u] == -INFINITY) {
        ++empty;
      } else {
        x = m[u] + log(l[u] + comp[u]);
        lse_max = fmax(lse_max, fabs(x));
      }
      lse[LseIndex(p, b, h, s, i0 + r)] = x;
      keys_max = max(keys_max, keys[u]);
      chain_max = max(chain_max, static_cast<long long>(kRowTileKeys) + tiles[u]);
    }
  }
  MaxDouble(&stats->score_abs_max, mag);
  MaxDouble(&stats->lse_abs_max, lse_max);
  MaxInt(&stats->max_keys, keys_max);
  MaxInt(&stats->sum_len_k, chain_max);
  if (empty > 0) atomicAdd(&stats->empty_rows, static_cast<unsigned long long>(empty));
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
  double* sk_tile = sq_tile + tq * p.d;  // Q as A fragments: tq * d doubles
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
  LoadFragTile(q, p.hq, h, p.d, s.q_begin + i0, nq, tq, sq_tile);  // A fragments of Q K^T
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
  int64_t j0 = NextKeyTile(p, s, lo, hi, range, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeysAt(p, s, kv, k, p.d, sq, j0, sk_tile, cn);
    LoadKeysAt(p, s, kv, v, dv, sv, j0, sv_tile, nullptr);
  }
  while (j0 < end) {
    const int64_t jn = NextKeyTile(p, s, lo, hi, range, j0 + tk, end);  // in every thread
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
      const double* qa = sq_tile + (r0 / 16) * (p.d / 8) * 128 + 2 * lane;  // LoadFragTile
      const double* kb = sk_tile + g * sq + 2 * t;
      ATTEST_UNROLL_BY_2
      for (int64_t k0 = 0; k0 < p.d; k0 += 8) {
        double a[4];
        LoadPair(qa + 16 * k0, a[0], a[1]);
        LoadPair(qa + 16 * k0 + 64, a[2], a[3]);
        ATTEST_UNROLL
        for (int y = 0; y < kNb; ++y) {
          double bb[2];
          LoadPair(kb + 8 * y * sq + k0, bb[0], bb[1]);
          Mma1688(c[y], a, bb);
        }
      }
    }
    // The transformed, masked scores, then K and its norms are free.
    ScoreTile(p, s, i0, j0, r0, 0, lo, hi, range, rn, cn, slope, g, t, c, mag);
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, k, p.d, sq, jn, sk_tile, cn);  // the next K
    // The online softmax of each of the lane's two rows (OnlineSoftmax's expressions): c
    // becomes P = exp(s - m_new); f[u] rescales O. The row statistics first, then the tile's
    // 16 exps (masked entries selected to 0 after: no branch around each), then the sums.
    double mx[2], m_new[2], f[2];
    long long count[2];
    RowMaxCount(c, mx, count);
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      m_new[u] = fmax(m[u], mx[u]);
      f[u] = 1.0;  // a new maximum is rare after the first tiles: a branch, not a select
      if (count[u] > 0 && mx[u] > m[u] && m[u] != -INFINITY) f[u] = exp(m[u] - mx[u]);
    }
    ATTEST_UNROLL
    for (int y = 0; y < kNb; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) {
        const double pv = exp(c[y][e] - m_new[e >> 1]);
        c[y][e] = count[e >> 1] > 0 && c[y][e] > -INFINITY ? pv : 0.0;
      }
    }
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      double sum = 0, cs = 0;
      ATTEST_UNROLL
      for (int y = 0; y < kNb; ++y) {
        ATTEST_UNROLL
        for (int x = 0; x < 2; ++x) TwoSumAdd(sum, cs, c[y][2 * u + x]);
      }
      QuadSum2(sum, cs);
      if (count[u] > 0) {
        double lr = l[u] * f[u], cr = comp[u] * f[u] + cs;
        TwoSumAdd(lr, cr, sum);
        l[u] = lr;
        comp[u] = cr;
        m[u] = m_new[u];
        keys[u] += count[u];
        tiles[u] += 1;
      }
    }
    // O = f O where some row of the warp has a new maximum (f = 1 elsewhere: the same bits),
    // before O + P V (fl(fl(f O) + part) either way).
    if (__ballot_sync(0xffffffffu, f[0] != 1.0 || f[1] != 1.0) != 0) {
      ATTEST_UNROLL
      for (int y = 0; y < NDV; ++y) {
        ATTEST_UNROLL
        for (int e = 0; e < 4; ++e) acc[y][e] *= f[e >> 1];
      }
    }
    if (jn < end) {
      CopyWait<1>();  // this tile's V (the next K may still be on the way)
    } else {
      CopyWait<0>();
    }
    __syncthreads();
    // O += P V (RowProductAdd over the tile's 4 key blocks): P's accumulator is the A operand.
    {
      double a[kNb][4];
      AccumulatorsAsA(c, a);
      RowProductAdd(a, sv_tile + 2 * t * sv + g, sv, dv, acc);
    }
    __syncthreads();
    if (jn < end) LoadKeysAt(p, s, kv, v, dv, sv, jn, sv_tile, nullptr);  // the next V
    j0 = jn;
  }
  CopyWait<0>();  // no copy outlives the block (Q when no key tile ran)
  RowForwardEnd(p, s, b, h, i0, r0, nq, 0, dv, true, acc, m, l, comp, keys, tiles, mag, o, lse,
                stats);
}

// The forward with a pair of warps per 16 query rows (p.tq = 16 per pair, p.tk = kRowTileKeys;
// d a multiple of 8, dv a multiple of 16 and at most 16 NH): each warp of the pair computes S for
// 16 of the tile's 32 keys and holds O for half of dv, so that O takes 4 NH doubles a thread
// instead of RowForwardKernel's 8 NDV and a block may run kWarps warps. Per key tile the pair
// exchanges, through shared memory and at barriers the tile walk has anyway, its rows' maxima
// and counts (before the exps) and its half of P as A fragments (before P V). Both warps then
// run every row statistic on the whole tile in RowForwardKernel's order (the same maximum, count
// and TwoSum chain over the lane's 8 keys), and P V over the tile's 4 k steps in the same order
// for their columns: every output is the bits RowForwardKernel gives.
template <int NH, int kWarps>
__global__ void ATTEST_LAUNCH_BOUNDS(32 * kWarps, 1)
    RowForwardPairKernel(Dev p, const double* q, const double* k, const double* v, double* o,
                         double* lse, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  constexpr int tk = kRowTileKeys;
  const int64_t kv = h / (p.hq / p.hkv);
  const int tq = p.tq;
  const int64_t dv = p.dv, sq = PairStride(p.d), sv = RowVStride(dv);
  double* sq_tile = smem;
  double* sk_tile = sq_tile + tq * p.d;  // Q as A fragments: tq * d doubles
  double* sv_tile = sk_tile + tk * sq;
  double* cn = sv_tile + tk * sv;
  double* rn = cn + tk;
  int64_t* lo = reinterpret_cast<int64_t*>(rn + tq);
  int64_t* hi = lo + tq;
  // Per warp 384 doubles: its half of P as the A fragments of k steps 2 member and
  // 2 member + 1 (128 each, LoadFragTile's order), then its rows' maxima and counts per lane.
  double* xw = reinterpret_cast<double*>(hi + tq);
  int64_t range[4];  // TileRowBounds
  const int warp = static_cast<int>(threadIdx.x / 32), lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3, member = warp & 1;
  const int r0 = 16 * (warp >> 1);  // the pair's first row in the tile
  const int kh = 16 * member;       // the warp's first key of each tile
  const int64_t vc = member * (dv / 2);  // its half of O's columns
  double* mine = xw + 384 * warp;
  const double* partner = xw + 384 * (warp ^ 1);
  const double* pair_a = xw + 384 * (warp & ~1);  // k step kb at pair_a + (kb / 2) 384 + ...
  const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadFragTile(q, p.hq, h, p.d, s.q_begin + i0, nq, tq, sq_tile);
  LoadRows(p.qn, p.hq, h, s.q_begin + i0, nq, tq, 0.0, rn);
  CopyCommit();
  double acc[NH][4];  // O's element (row g + 8 (e >> 1), column vc + 8 y + 2t + (e & 1))
  ATTEST_UNROLL
  for (int y = 0; y < NH; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) acc[y][e] = 0;
  }
  double m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, comp[2] = {0, 0};
  long long keys[2] = {0, 0}, tiles[2] = {0, 0};
  double mag = 0;
  TileRowBounds(p, s, i0, lo, hi, range);
  const int64_t end = range[1];
  int64_t j0 = NextKeyTile(p, s, lo, hi, range, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeysAt(p, s, kv, k, p.d, sq, j0, sk_tile, cn);
    LoadKeysAt(p, s, kv, v, dv, sv, j0, sv_tile, nullptr);
  }
  while (j0 < end) {
    const int64_t jn = NextKeyTile(p, s, lo, hi, range, j0 + tk, end);
    CopyWait<1>();
    __syncthreads();
    // S for the pair's 16 rows and the warp's 16 keys: c[y][e] is entry (row g + 8 (e >> 1),
    // key kh + 8 y + 2t + (e & 1)).
    double c[2][4];
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) c[y][e] = 0;
    }
    {
      const double* qa = sq_tile + (r0 / 16) * (p.d / 8) * 128 + 2 * lane;
      const double* kb = sk_tile + (kh + g) * sq + 2 * t;
      ATTEST_UNROLL_BY_2
      for (int64_t k0 = 0; k0 < p.d; k0 += 8) {
        double a[4];
        LoadPair(qa + 16 * k0, a[0], a[1]);
        LoadPair(qa + 16 * k0 + 64, a[2], a[3]);
        ATTEST_UNROLL
        for (int y = 0; y < 2; ++y) {
          double bb[2];
          LoadPair(kb + 8 * y * sq + k0, bb[0], bb[1]);
          Mma1688(c[y], a, bb);
        }
      }
    }
    ScoreTile(p, s, i0, j0, r0, kh, lo, hi, range, rn, cn, slope, g, t, c, mag);
    // The rows' maximum and count over the warp's keys, to the partner.
    double mx[2];
    long long count[2];
    RowMaxCount(c, mx, count);
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      mine[256 + 2 * lane + u] = mx[u];
      reinterpret_cast<long long*>(mine)[320 + 2 * lane + u] = count[u];
    }
    __syncthreads();  // K is free; the partner's maxima and counts are in
    if (jn < end) LoadKeysAt(p, s, kv, k, p.d, sq, jn, sk_tile, cn);
    double m_new[2], f[2];
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      mx[u] = fmax(mx[u], partner[256 + 2 * lane + u]);  // fmax is exact: any order
      count[u] += reinterpret_cast<const long long*>(partner)[320 + 2 * lane + u];
      m_new[u] = fmax(m[u], mx[u]);
      f[u] = 1.0;
      if (count[u] > 0 && mx[u] > m[u] && m[u] != -INFINITY) f[u] = exp(m[u] - mx[u]);
    }
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) {
        const double pv = exp(c[y][e] - m_new[e >> 1]);
        c[y][e] = count[e >> 1] > 0 && c[y][e] > -INFINITY ? pv : 0.0;
      }
    }
    // The warp's half of P as A fragments (AccumulatorsAsA: slot t + 4x holds key 2t + x).
    {
      double a[2][4];
      AccumulatorsAsA(c, a);
      ATTEST_UNROLL
      for (int y = 0; y < 2; ++y) {
        double* dst = mine + 128 * y + 2 * lane;
        dst[0] = a[y][0];
        dst[1] = a[y][1];
        dst[64] = a[y][2];
        dst[65] = a[y][3];
      }
    }
    if (__ballot_sync(0xffffffffu, f[0] != 1.0 || f[1] != 1.0) != 0) {
      ATTEST_UNROLL
      for (int y = 0; y < NH; ++y) {
        ATTEST_UNROLL
        for (int e = 0; e < 4; ++e) acc[y][e] *= f[e >> 1];
      }
    }
    if (jn < end) {
      CopyWait<1>();
    } else {
      CopyWait<0>();
    }
    __syncthreads();  // this tile's V and the partner's half of P are in
    // The row sums over the tile's 32 keys in RowForwardKernel's order (key blocks y = 0..3,
    // then x), from the pair's A fragments: accumulator element (x, u) is A's element 2x + u.
    ATTEST_UNROLL
    for (int u = 0; u < 2; ++u) {
      double sum = 0, cs = 0;
      ATTEST_UNROLL
      for (int y = 0; y < 4; ++y) {
        const double* src = pair_a + 384 * (y / 2) + 128 * (y % 2) + 2 * lane;
        double a0, a1, a2, a3;
        LoadPair(src, a0, a1);
        LoadPair(src + 64, a2, a3);
        TwoSumAdd(sum, cs, u == 0 ? a0 : a1);  // (x 0, u): A element u
        TwoSumAdd(sum, cs, u == 0 ? a2 : a3);  // (x 1, u): A element 2 + u
      }
      QuadSum2(sum, cs);
      if (count[u] > 0) {
        double lr = l[u] * f[u], cr = comp[u] * f[u] + cs;
        TwoSumAdd(lr, cr, sum);
        l[u] = lr;
        comp[u] = cr;
        m[u] = m_new[u];
        keys[u] += count[u];
        tiles[u] += 1;
      }
    }
    // O += P V for the warp's columns (RowProductAdd's chains), A read per column group.
    RowProductAddOf<NH, 4>(
        [&](int kb, double (&a)[4]) {
          const double* src = pair_a + 384 * (kb / 2) + 128 * (kb % 2) + 2 * lane;
          LoadPair(src, a[0], a[1]);
          LoadPair(src + 64, a[2], a[3]);
        },
        sv_tile + 2 * t * sv + vc + g, sv, dv / 2, acc);
    __syncthreads();  // V and the pair's P are read
    if (jn < end) LoadKeysAt(p, s, kv, v, dv, sv, jn, sv_tile, nullptr);
    j0 = jn;
  }
  CopyWait<0>();
  RowForwardEnd(p, s, b, h, i0, r0, nq, vc, dv / 2, member == 0, acc, m, l, comp, keys, tiles,
                mag, o, lse, stats);
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
  ATTEST_UNROLL
  for (int y = 0; y < NH; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) acc_k[y][e] = acc_v[y][e] = 0;
  }
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
  // The walk: (query head, query tile) pairs in NextQueryTile's order, or with kFused the
  // tiles that may see the keys in descending order, each with every head of the group.
  auto next_pair = [&](int64_t* hh, int64_t* ii) {
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
    ATTEST_UNROLL
    for (int y = 0; y < 2; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) cs[y][e] = cp[y][e] = 0;
    }
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
    // P^T and dS^T in the scores' registers (cs, cp): entry (key kp + g + 8u, query
    // qm + 8y + 2t + x) with e = 2u + x.
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
      // dq += share, element by element at L2 (AddGlobal), in the turn's order.
      if (w_q > 0) {
        ATTEST_UNROLL
        for (int u = 0; u < 2; ++u) {
          const int64_t r = i0 + q0 + g + 8 * u;
          if (r >= s.q_len) continue;
          double* row = fz.dq + ((s.q_begin + r) * p.hq + h) * dd + col_q;
          ATTEST_UNROLL
          for (int y = 0; y < NQ; ++y) {
            if (8 * y < w_q) {
              ATTEST_UNROLL
              for (int x = 0; x < 2; ++x) AddGlobal(row + 8 * y + 2 * t + x, acc_q[y][2 * u + x]);
            }
          }
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) PassTurn(turn_at, turn_next);
    }
    more = next;
    h = hn;
    i0 = in;
  }
  CopyWait<0>();  // no copy outlives the block (K and V when no query tile ran)
  // dk = scale dK, dv = dV for the warp's half of the columns.
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
  // The column statistics per key: the 4 lanes of the row, then the pair (through xb).
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
  if (threadIdx.x == 0) MaxInt(&stats->sum_len_q, tq + adds);
  // dQ's chains (FusedDq): tk keys, one addition per key block and the scaling's.
  if (kFused && threadIdx.x == 0) MaxInt(&stats->sum_len_k, tk + (s.k_len + tk - 1) / tk + 1);
}

}  // namespace
