// The CUDA float64 oracle's row forward kernels: RowForwardKernel (a warp per 16 query rows) and
// RowForwardPairKernel (a pair of warps per 16 query rows), their shared memory and the end they
// share (RowForwardEnd). oracle_cuda_rows.cuh's header comment describes the row kernels and
// holds the helpers these use. Included by oracle_cuda.cu only, after oracle_cuda_rows.cuh.
#pragma once

namespace {

// Shared memory of RowForwardKernel, in doubles: the Q tile (A fragments: LoadFragTile), one K
// tile (with its norms), one V tile, the Q norms and the rows' key bounds.
__host__ __device__ int64_t RowForwardShared(int64_t d, int64_t dv, int tq) {
  return tq * d + kRowTileKeys * PairStride(d) + kRowTileKeys * RowVStride(dv) +
         kRowTileKeys + tq + 2 * tq;
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

// The S tile c becomes P = exp(s - m_new) of the lane's two rows: the tile's exps first, masked
// entries selected to 0 after (no branch around each).
template <int NB>
__device__ __forceinline__ void RowExps(const double (&m_new)[2], const long long (&count)[2],
                                        double (&c)[NB][4]) {
  ATTEST_UNROLL
  for (int y = 0; y < NB; ++y) {
    ATTEST_UNROLL
    for (int e = 0; e < 4; ++e) {
      const double pv = exp(c[y][e] - m_new[e >> 1]);
      c[y][e] = count[e >> 1] > 0 && c[y][e] > -INFINITY ? pv : 0.0;
    }
  }
}

// A row's statistics after a tile with `count` visible entries and the compensated row sum
// (sum, cs) of its P: l = f l + sum with Sum2's compensation, m = m_new, the keys and tiles.
__device__ __forceinline__ void RowStatsAdd(double sum, double cs, double f, double m_new,
                                            long long count, double& m, double& l, double& comp,
                                            long long& keys, long long& tiles) {
  if (count > 0) {
    double lr = l * f, cr = comp * f + cs;
    TwoSumAdd(lr, cr, sum);
    l = lr;
    comp = cr;
    m = m_new;
    keys += count;
    tiles += 1;
  }
}

// O = f O where some row of the warp has a new maximum (f = 1 elsewhere: the same bits), before
// O + P V (fl(fl(f O) + part) either way).
template <int NY>
__device__ __forceinline__ void RowRescaleAcc(const double (&f)[2], double (&acc)[NY][4]) {
  if (__ballot_sync(0xffffffffu, f[0] != 1.0 || f[1] != 1.0) != 0) {
    ATTEST_UNROLL
    for (int y = 0; y < NY; ++y) {
      ATTEST_UNROLL
      for (int e = 0; e < 4; ++e) acc[y][e] *= f[e >> 1];
    }
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
  ZeroAcc(acc);
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
    RowExps(m_new, count, c);
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
    RowRescaleAcc(f, acc);
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
      RowStatsAdd(sum, cs, f[u], m_new[u], count[u], m[u], l[u], comp[u], keys[u], tiles[u]);
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

}  // namespace
