// The kernels of the CUDA float64 oracle (NormsKernel, ForwardKernel, DeltaKernel, DqKernel,
// DkDvKernel; oracle_cuda.cu's header comment describes them). Included by oracle_cuda.cu only,
// after oracle_cuda_device.cuh.
#pragma once

namespace {


__global__ void NormsKernel(const double* x, int64_t rows_heads, int64_t width, double* norms,
                            unsigned long long* abs_max, unsigned long long* norm_max) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= rows_heads) return;
  const double* row = x + n * width;
  double ss = 0, m = 0;
  for (int64_t d = 0; d < width; ++d) {
    ss = fma(row[d], row[d], ss);
    m = fmax(m, fabs(row[d]));
  }
  const double nrm = sqrt(ss);
  if (norms != nullptr) norms[n] = nrm;
  MaxDouble(abs_max, m);
  if (norm_max != nullptr) MaxDouble(norm_max, nrm);
}

// Shared memory of ForwardKernel, in doubles: the Q tile, one K and one V tile (and the K
// tile's norms), the score tile, the accumulator, per-row state.
__host__ __device__ int64_t ForwardShared(int64_t d, int64_t dv, int tq, int tk, int frag) {
  return tq * Stride(d, frag) + tk * Stride(d, frag) + tk * Stride(dv, frag) + tk +
         tq * Stride(tk, frag) + tq * Stride(dv, frag) + 9 * tq;
}

// The next key tile from j (a multiple of tk) that some row of the query tile may see, in
// ascending order (TileWalk::ForEachKeyTile); end (range[1]) or beyond when none is left. A
// tile inside every row's bounds (range of TileRowBounds: range[2], the largest lo, <= j and
// j + nk <= range[3], the smallest hi) is seen by every row, without a vote. Every thread of
// the block calls it and gets the same answer.
__device__ int64_t NextKeyTile(const Dev& p, const Seq& s, const int64_t* lo, const int64_t* hi,
                               const int64_t* range, int64_t j, int64_t end) {
  while (j < end) {
    const int64_t nk = min(static_cast<int64_t>(p.tk), s.k_len - j);
    if ((j >= range[2] && j + nk <= range[3]) || MaySee(p, lo, hi, j, nk)) break;
    j += p.tk;
  }
  return j;
}

// The K rows (and norms) or V rows of key tile j0 at row stride `stride` (asynchronous, one
// group).
__device__ void LoadKeysAt(const Dev& p, const Seq& s, int64_t g, const double* x,
                           int64_t width, int64_t stride, int64_t j0, double* tile,
                           double* norms) {
  const int64_t nk = min(static_cast<int64_t>(p.tk), s.k_len - j0);
  LoadTile(x, p.hkv, g, width, stride, s.k_begin + j0, nk, p.tk, tile);
  if (norms != nullptr) LoadRows(p.kn, p.hkv, g, s.k_begin + j0, nk, p.tk, 0.0, norms);
  CopyCommit();
}

// LoadKeysAt at the old kernels' row stride (Stride).
__device__ void LoadKeys(const Dev& p, const Seq& s, int64_t g, const double* x, int64_t width,
                         int64_t j0, double* tile, double* norms) {
  LoadKeysAt(p, s, g, x, width, Stride(width, p.frag), j0, tile, norms);
}

// The online softmax of the score tile ss (rows of tq, keys of tk <= 32), in place: ss becomes
// P = exp(s - m_new); m, l (+ comp: Sum2's compensation), f (the rescaling of O), keys and tiles
// per row. One warp per row, lane c holding key c; each warp takes kRows of its rows at once,
// step by step, so that their shuffles and exp overlap (each row's operations and their order
// are those of one row at a time).
__device__ void OnlineSoftmax(int tq, int tk, int64_t st, double* ss, double* m, double* l,
                              double* comp, double* f, int64_t* keys, int64_t* tiles) {
  constexpr int kRows = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int r0 = warp; r0 < tq; r0 += kRows * warps) {
    double x[kRows], mx[kRows], sum[kRows], c[kRows], m_old[kRows], m_new[kRows], fr[kRows];
    int count[kRows];
    ATTEST_UNROLL
    for (int u = 0; u < kRows; ++u) {
      const int r = r0 + u * warps;
      x[u] = r < tq && lane < tk ? ss[r * st + lane] : -INFINITY;
      count[u] = __popc(__ballot_sync(0xffffffffu, x[u] > -INFINITY));
      mx[u] = x[u];
      m_old[u] = r < tq ? m[r] : -INFINITY;
    }
    WarpMax(mx);
    ATTEST_UNROLL
    for (int u = 0; u < kRows; ++u) {
      m_new[u] = fmax(m_old[u], mx[u]);
      fr[u] = 1;
      if (count[u] > 0 && mx[u] > m_old[u] && m_old[u] != -INFINITY) fr[u] = exp(m_old[u] - mx[u]);
      sum[u] = count[u] > 0 && x[u] > -INFINITY ? exp(x[u] - m_new[u]) : 0.0;
      x[u] = sum[u];  // P of this lane's key
      c[u] = 0;
    }
    WarpSum2(sum, c);
    __syncwarp();
    ATTEST_UNROLL
    for (int u = 0; u < kRows; ++u) {
      const int r = r0 + u * warps;
      if (r >= tq) continue;
      if (lane == 0) {
        if (count[u] > 0) {
          double lr = l[r] * fr[u], cr = comp[r] * fr[u] + c[u];
          TwoSumAdd(lr, cr, sum[u]);
          l[r] = lr;
          comp[r] = cr;
          m[r] = m_new[u];
          f[r] = fr[u];
          keys[r] += count[u];
          tiles[r] += 1;
        } else {
          f[r] = 1;
        }
      }
      if (lane < tk) ss[r * st + lane] = x[u];
    }
  }
}

// Key tiles stream through one K and one V buffer: the next tile's K rows are requested as soon
// as the scores are computed (while the softmax and P V run), its V rows as soon as P V is done
// (while the next scores run).
__global__ void ForwardKernel(Dev p, const double* q, const double* k, const double* v,
                              double* o, double* lse, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  const int64_t g = h / (p.hq / p.hkv);
  const int tq = p.tq, tk = p.tk;
  const int64_t dv = p.dv, sd = Stride(p.d, p.frag), sdv = Stride(dv, p.frag);
  const int64_t st = Stride(tk, p.frag);
  double* sq_tile = smem;
  double* sk_tile = sq_tile + tq * sd;
  double* sv_tile = sk_tile + tk * sd;
  double* cn = sv_tile + tk * sdv;
  double* ss = cn + tk;
  double* acc = ss + tq * st;
  double* m = acc + tq * sdv;
  double* l = m + tq;
  double* comp = l + tq;
  double* f = comp + tq;
  double* rn = f + tq;
  int64_t* lo = reinterpret_cast<int64_t*>(rn + tq);
  int64_t* hi = lo + tq;
  int64_t* keys = hi + tq;
  int64_t* tiles = keys + tq;
  int64_t range[4];  // TileRowBounds
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadTile(q, p.hq, h, p.d, sd, s.q_begin + i0, nq, tq, sq_tile);
  LoadRows(p.qn, p.hq, h, s.q_begin + i0, nq, tq, 0.0, rn);
  CopyCommit();
  for (int r = warp; r < tq; r += warps) {
    for (int64_t d = lane; d < dv; d += 32) acc[r * sdv + d] = 0;
  }
  for (int r = threadIdx.x; r < tq; r += blockDim.x) {
    m[r] = -INFINITY;
    l[r] = 0;
    comp[r] = 0;
    f[r] = 1;
    keys[r] = 0;
    tiles[r] = 0;
  }
  double mag = 0;  // the score magnitude statistic of this thread's entries
  TileRowBounds(p, s, i0, lo, hi, range);
  const int64_t end = range[1];
  int64_t j0 = NextKeyTile(p, s, lo, hi, range, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeys(p, s, g, k, p.d, j0, sk_tile, cn);
    LoadKeys(p, s, g, v, dv, j0, sv_tile, nullptr);
  }
  while (j0 < end) {
    const int64_t jn = NextKeyTile(p, s, lo, hi, range, j0 + tk, end);  // in every thread
    CopyWait<1>();  // Q and this tile's K (its V may still be on the way)
    __syncthreads();
    Scores(p, s, h, i0, j0, lo, hi, range, sq_tile, sk_tile, rn, cn, ss, nullptr, mag);
    if (jn < end) LoadKeys(p, s, g, k, p.d, jn, sk_tile, cn);  // K is free: the next one
    // Online softmax, one warp per row; lane c holds key c of the tile.
    OnlineSoftmax(tq, tk, st, ss, m, l, comp, f, keys, tiles);
    if (jn < end) {
      CopyWait<1>();  // this tile's V (the next K may still be on the way)
    } else {
      CopyWait<0>();
    }
    __syncthreads();
    // O = f O + P V (the tile's product summed apart: a chain of tk, then one addition).
    if (p.mma) {
      MmaProduct<2, 4>(p.m16, tq, dv, tk, ss, st, 1, sv_tile, sdv, 1,
                       [&](int64_t r, int64_t d, double part) {
                         acc[r * sdv + d] = acc[r * sdv + d] * f[r] + part;
                       });
    } else {
      for (int r = warp; r < tq; r += warps) {
        const double* pr = ss + r * st;
        for (int64_t d = lane; d < dv; d += 32) {
          double part = 0;
          for (int c = 0; c < tk; ++c) part = fma(pr[c], sv_tile[c * sdv + d], part);
          acc[r * sdv + d] = acc[r * sdv + d] * f[r] + part;
        }
      }
    }
    __syncthreads();
    if (jn < end) LoadKeys(p, s, g, v, dv, jn, sv_tile, nullptr);  // V is free: the next one
    j0 = jn;
  }
  CopyWait<0>();  // no copy outlives the block (Q when no key tile ran)
  for (int r = warp; r < nq; r += warps) {
    double* out = o + ((s.q_begin + i0 + r) * p.hq + h) * dv;
    for (int64_t d = lane; d < dv; d += 32) {
      out[d] = m[r] == -INFINITY ? 0.0 : acc[r * sdv + d] / (l[r] + comp[r]);
    }
  }
  double lse_max = 0;
  int64_t keys_max = 0, chain_max = 0, empty = 0;
  for (int r = threadIdx.x; r < nq; r += blockDim.x) {
    double x = -INFINITY;
    if (m[r] == -INFINITY) {
      ++empty;
    } else {
      x = m[r] + log(l[r] + comp[r]);
      lse_max = fmax(lse_max, fabs(x));
    }
    lse[LseIndex(p, b, h, s, i0 + r)] = x;
    keys_max = max(keys_max, keys[r]);
    chain_max = max(chain_max, tk + tiles[r]);
  }
  MaxDouble(&stats->score_abs_max, mag);
  MaxDouble(&stats->lse_abs_max, lse_max);
  MaxInt(&stats->max_keys, keys_max);
  MaxInt(&stats->sum_len_k, chain_max);
  if (empty > 0) atomicAdd(&stats->empty_rows, static_cast<unsigned long long>(empty));
}

// delta_i = dO_i . o_i by Dot2 (oracle_double.cc Delta), one thread per (row, head).
__global__ void DeltaKernel(Dev p, const double* dout, const double* o, double* delta) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= p.total_q * p.hq) return;
  const int64_t row = n / p.hq, h = n % p.hq;
  const double* a = dout + n * p.dv;
  const double* c = o + n * p.dv;
  double sum = 0, comp = 0;
  for (int64_t d = 0; d < p.dv; ++d) {
    const double prod = a[d] * c[d];
    TwoSumAdd(sum, comp, prod);
    comp += fma(a[d], c[d], -prod);
  }
  // The row's batch entry, for the lse layout.
  int64_t b = 0, i = row;
  if (p.cu_q != nullptr) {
    while (b + 1 < p.batch && p.cu_q[b + 1] <= row) ++b;
    i = row - p.cu_q[b];
  } else {
    b = row / p.sq;
    i = row % p.sq;
  }
  const Seq s = SeqOf(p, b);
  delta[LseIndex(p, b, h, s, i)] = sum + comp;
}

// The fma path's P and dS of the tile, after Scores: P = exp(s - lse) where s > -inf (ss in
// place), dS = P (dP - delta) [(1 - th^2)] into ds (which holds th on entry with softcap),
// dP = dO V^T by fma chains. (The mma path computes the same in ScoresBackwardMma.) Ends with
// __syncthreads().
__device__ void BackwardTile(const Dev& p, const double* sdo_tile, const double* sv_tile,
                             const double* row_lse, const double* row_delta, double* ss,
                             double* ds) {
  const int64_t sdv = Stride(p.dv, p.frag), st = Stride(p.tk, p.frag);
  const int lane = threadIdx.x % 32, warps = static_cast<int>(blockDim.x / 32);
  for (int r = threadIdx.x / 32; r < p.tq; r += warps) {
    for (int c = lane; c < p.tk; c += 32) {
      const double x = ss[r * st + c];
      double pr = 0, dsv = 0;
      if (x > -INFINITY) {
        pr = exp(x - row_lse[r]);
        const double* dor = sdo_tile + r * sdv;
        const double* vr = sv_tile + c * sdv;
        double dp = 0;
        for (int64_t d = 0; d < p.dv; ++d) dp = fma(dor[d], vr[d], dp);
        dsv = pr * (dp - row_delta[r]);
        if (p.softcap > 0 && pr != 0.0) {
          const double t = ds[r * st + c];
          dsv *= 1.0 - t * t;
        }
      }
      ss[r * st + c] = pr;
      ds[r * st + c] = dsv;
    }
  }
  __syncthreads();
}

// Shared memory of DqKernel, in doubles: the Q and dO tiles, k_buffers K tiles (and norms), one
// V tile, P and dS, the accumulator, per-row data.
__host__ __device__ int64_t DqShared(int64_t d, int64_t dv, int tq, int tk, int frag,
                                     int k_buffers) {
  return tq * Stride(d, frag) + tq * Stride(dv, frag) + k_buffers * (tk * Stride(d, frag) + tk) +
         tk * Stride(dv, frag) + 2 * tq * Stride(tk, frag) + tq * Stride(d, frag) + 5 * tq;
}

// Key tiles stream as in ForwardKernel; with two K buffers the next K tile is requested at the
// start of a tile, else when dQ += dS K is done; the next V tile when dP is done.
__global__ void DqKernel(Dev p, const double* q, const double* k, const double* v,
                         const double* dout, const double* lse, const double* delta, double* dq,
                         DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  const int64_t g = h / (p.hq / p.hkv);
  const int tq = p.tq, tk = p.tk;
  const int64_t dd = p.d, dv = p.dv, sd = Stride(dd, p.frag), sdv = Stride(dv, p.frag);
  const int64_t st = Stride(tk, p.frag);
  const bool two = p.k_buffers == 2;
  double* sq_tile = smem;
  double* sdo_tile = sq_tile + tq * sd;
  double* kbuf = sdo_tile + tq * sdv;  // k_buffers of [K tile, its norms]
  const int64_t kbuf_size = tk * sd + tk;
  double* sv_tile = kbuf + p.k_buffers * kbuf_size;
  double* ss = sv_tile + tk * sdv;
  double* ds = ss + tq * st;
  double* acc = ds + tq * st;
  double* row_lse = acc + tq * sd;
  double* row_delta = row_lse + tq;
  double* rn = row_delta + tq;
  int64_t* lo = reinterpret_cast<int64_t*>(rn + tq);
  int64_t* hi = lo + tq;
  int64_t range[4];  // TileRowBounds
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadTile(q, p.hq, h, dd, sd, s.q_begin + i0, nq, tq, sq_tile);
  LoadTile(dout, p.hq, h, dv, sdv, s.q_begin + i0, nq, tq, sdo_tile);
  LoadRows(p.qn, p.hq, h, s.q_begin + i0, nq, tq, 0.0, rn);
  CopyCommit();
  for (int r = warp; r < tq; r += warps) {
    for (int64_t d = lane; d < dd; d += 32) acc[r * sd + d] = 0;
  }
  for (int r = threadIdx.x; r < tq; r += blockDim.x) {
    row_lse[r] = r < nq ? lse[LseIndex(p, b, h, s, i0 + r)] : -INFINITY;
    row_delta[r] = r < nq ? delta[LseIndex(p, b, h, s, i0 + r)] : 0.0;
  }
  double mag = 0;  // the score magnitude statistic of this thread's entries
  TileRowBounds(p, s, i0, lo, hi, range);
  const int64_t end = range[1];
  int64_t visited = 0;
  int cur = 0;  // the K buffer of this tile
  int64_t j0 = NextKeyTile(p, s, lo, hi, range, range[0] / tk * tk, end);
  if (j0 < end) {
    LoadKeys(p, s, g, k, dd, j0, kbuf, kbuf + tk * sd);
    LoadKeys(p, s, g, v, dv, j0, sv_tile, nullptr);
  }
  while (j0 < end) {
    const int64_t jn = NextKeyTile(p, s, lo, hi, range, j0 + tk, end);  // in every thread
    ++visited;
    double* sk_tile = kbuf + cur * kbuf_size;
    if (two) {
      double* other = kbuf + (1 - cur) * kbuf_size;
      if (jn < end) {
        LoadKeys(p, s, g, k, dd, jn, other, other + tk * sd);
      } else {
        CopyCommit();  // an empty group: the same count of groups in every case
      }
      // Q, dO and this tile's K (the next K may be on the way; with fma, this tile's V too).
      if (p.mma) {
        CopyWait<1>();
      } else {
        CopyWait<2>();
      }
    } else {
      CopyWait<0>();  // Q, dO, this tile's K (requested last) and its V
    }
    __syncthreads();
    if (p.mma) {
      ScoresBackwardMma(p, s, h, i0, j0, lo, hi, range, sq_tile, sk_tile, sdo_tile, sv_tile, rn,
                        sk_tile + tk * sd, row_lse, row_delta, ss, ds, mag);
    } else {
      Scores(p, s, h, i0, j0, lo, hi, range, sq_tile, sk_tile, rn, sk_tile + tk * sd, ss,
             p.softcap > 0 ? ds : nullptr, mag);
      if (two) {
        CopyWait<1>();  // this tile's V
      } else {
        CopyWait<0>();
      }
      __syncthreads();
      BackwardTile(p, sdo_tile, sv_tile, row_lse, row_delta, ss, ds);
    }
    if (jn < end) {
      LoadKeys(p, s, g, v, dv, jn, sv_tile, nullptr);  // V is free: the next one
    } else {
      CopyCommit();
    }
    // dQ += dS K.
    if (p.mma) {
      MmaProduct<2, 4>(p.m16, tq, dd, tk, ds, st, 1, sk_tile, sd, 1,
                       [&](int64_t r, int64_t d, double part) { acc[r * sd + d] += part; });
    } else {
      for (int r = warp; r < tq; r += warps) {
        const double* dsr = ds + r * st;
        for (int64_t d = lane; d < dd; d += 32) {
          double part = 0;
          for (int c = 0; c < tk; ++c) part = fma(dsr[c], sk_tile[c * sd + d], part);
          acc[r * sd + d] += part;
        }
      }
    }
    __syncthreads();
    if (!two && jn < end) LoadKeys(p, s, g, k, dd, jn, sk_tile, sk_tile + tk * sd);
    if (two) cur = 1 - cur;
    j0 = jn;
  }
  CopyWait<0>();
  for (int r = warp; r < nq; r += warps) {
    double* out = dq + ((s.q_begin + i0 + r) * p.hq + h) * dd;
    for (int64_t d = lane; d < dd; d += 32) out[d] = p.scale * acc[r * sd + d];
  }
  MaxDouble(&stats->score_abs_max, mag);
  if (threadIdx.x == 0) MaxInt(&stats->sum_len_k, tk + visited);
}

// Shared memory of DkDvKernel, in doubles: the K and V tiles, their accumulators, per-key data,
// one Q and one dO tile with per-row data, P and dS.
__host__ __device__ int64_t DkDvShared(int64_t d, int64_t dv, int tq, int tk, int frag) {
  return 2 * tk * Stride(d, frag) + 2 * tk * Stride(dv, frag) + 3 * tk + tq * Stride(d, frag) +
         tq * Stride(dv, frag) + 5 * tq + 2 * tq * Stride(tk, frag);
}

// The (query head, query tile) pair after (h, i0) in the walk's order (heads of the group in
// ascending order, query tiles in ascending order) that may see key tile j0; false when none.
// Every warp computes it (QueryTileMaySee), the same in every thread.
__device__ bool NextQueryTile(const Dev& p, const Seq& s, int64_t g, int64_t j0, int64_t nk,
                              int64_t* h, int64_t* i0) {
  const int64_t ratio = p.hq / p.hkv;
  int64_t hh = *h, ii = *i0 + p.tq;
  for (; hh < (g + 1) * ratio; ++hh, ii = 0) {
    for (; ii < s.q_len; ii += p.tq) {
      if (QueryTileMaySee(p, s, ii, j0, nk)) {
        *h = hh;
        *i0 = ii;
        return true;
      }
    }
  }
  return false;
}

// The Q rows (and norms) and the dO rows (and lse, delta) of query tile i0 of head h, two groups.
__device__ void LoadQueries(const Dev& p, const Seq& s, int64_t b, int64_t h, int64_t i0,
                            const double* q, const double* dout, const double* lse,
                            const double* delta, double* sq_tile, double* rn, double* sdo_tile,
                            double* rows) {
  const int64_t nq = min(static_cast<int64_t>(p.tq), s.q_len - i0);
  LoadTile(q, p.hq, h, p.d, Stride(p.d, p.frag), s.q_begin + i0, nq, p.tq, sq_tile);
  LoadRows(p.qn, p.hq, h, s.q_begin + i0, nq, p.tq, 0.0, rn);
  CopyCommit();
  LoadTile(dout, p.hq, h, p.dv, Stride(p.dv, p.frag), s.q_begin + i0, nq, p.tq, sdo_tile);
  const int64_t at = LseIndex(p, b, h, s, i0);  // rows of one (batch, head) are contiguous
  LoadRows(lse, 1, 0, at, nq, p.tq, -INFINITY, rows);
  LoadRows(delta, 1, 0, at, nq, p.tq, 0.0, rows + p.tq);
  CopyCommit();
}

// The end of DkDvKernel for key tile j0 (nk keys) of kv head g, once the accumulators and column
// statistics are complete and every thread may read them: dk = scale dK and dv = dV (a warp per
// key, from acc_k and acc_v at row strides sd and sdv), then the statistics (the column mass and
// count of visible entries per key, by one thread; the score magnitude statistic mag and the
// chain length tq + adds).
__device__ __forceinline__ void DkDvEnd(const Dev& p, const Seq& s, int64_t g, int64_t j0,
                                        int64_t nk, int64_t sd, int64_t sdv, const double* acc_k,
                                        const double* acc_v, const double* mass,
                                        const int64_t* seen, int64_t adds, double mag, double* dk,
                                        double* dvo, DevStats* stats) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);
  const int64_t dd = p.d, dv = p.dv;
  for (int c = warp; c < nk; c += warps) {
    double* out_k = dk + ((s.k_begin + j0 + c) * p.hkv + g) * dd;
    double* out_v = dvo + ((s.k_begin + j0 + c) * p.hkv + g) * dv;
    for (int64_t d = lane; d < dd; d += 32) out_k[d] = p.scale * acc_k[c * sd + d];
    for (int64_t d = lane; d < dv; d += 32) out_v[d] = acc_v[c * sdv + d];
  }
  MaxDouble(&stats->score_abs_max, mag);
  if (threadIdx.x == 0) {
    double mass_max = 0;
    int64_t seen_max = 0, unseen = 0;
    for (int c = 0; c < nk; ++c) {
      mass_max = fmax(mass_max, mass[c]);
      seen_max = max(seen_max, seen[c]);
      if (seen[c] == 0) ++unseen;
    }
    MaxDouble(&stats->col_mass_max, mass_max);
    MaxInt(&stats->max_queries, seen_max);
    MaxInt(&stats->sum_len_q, p.tq + adds);
    if (unseen > 0) atomicAdd(&stats->unseen_keys, static_cast<unsigned long long>(unseen));
  }
}

// Query tiles stream through one Q and one dO buffer: the next tile's Q rows are requested when
// dK += dS^T Q is done (while dV += P^T dO runs), its dO rows when dV is done (while the next
// scores run).
__global__ void DkDvKernel(Dev p, const double* q, const double* k, const double* v,
                           const double* dout, const double* lse, const double* delta,
                           double* dk, double* dvo, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, g = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * p.tk;
  const Seq s = SeqOf(p, b);
  if (j0 >= s.k_len) return;
  const int tq = p.tq, tk = p.tk;
  const int64_t dd = p.d, dv = p.dv, ratio = p.hq / p.hkv;
  const int64_t sd = Stride(dd, p.frag), sdv = Stride(dv, p.frag), st = Stride(tk, p.frag);
  double* sk_tile = smem;
  double* sv_tile = sk_tile + tk * sd;
  double* acc_k = sv_tile + tk * sdv;
  double* acc_v = acc_k + tk * sd;
  double* cn = acc_v + tk * sdv;
  double* mass = cn + tk;
  int64_t* seen = reinterpret_cast<int64_t*>(mass + tk);
  double* sq_tile = reinterpret_cast<double*>(seen + tk);
  double* sdo_tile = sq_tile + tq * sd;
  double* rn = sdo_tile + tq * sdv;
  double* row_lse = rn + tq;
  double* row_delta = row_lse + tq;
  double* ss = row_delta + tq;
  double* ds = ss + tq * st;
  int64_t* lo = reinterpret_cast<int64_t*>(ds + tq * st);
  int64_t* hi = lo + tq;
  int64_t range[4];  // TileRowBounds
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);

  const int64_t nk = min(static_cast<int64_t>(tk), s.k_len - j0);
  LoadKeys(p, s, g, k, dd, j0, sk_tile, cn);
  LoadKeys(p, s, g, v, dv, j0, sv_tile, nullptr);
  for (int c = warp; c < tk; c += warps) {
    for (int64_t d = lane; d < dd; d += 32) acc_k[c * sd + d] = 0;
    for (int64_t d = lane; d < dv; d += 32) acc_v[c * sdv + d] = 0;
  }
  for (int c = threadIdx.x; c < tk; c += blockDim.x) {
    mass[c] = 0;
    seen[c] = 0;
  }
  int64_t adds = 0;
  double mag = 0;  // the score magnitude statistic of this thread's entries
  int64_t h = g * ratio, i0 = -tq;
  bool more = NextQueryTile(p, s, g, j0, nk, &h, &i0);
  if (more) LoadQueries(p, s, b, h, i0, q, dout, lse, delta, sq_tile, rn, sdo_tile, row_lse);
  while (more) {
    ++adds;
    int64_t hn = h, in = i0;
    const bool next = NextQueryTile(p, s, g, j0, nk, &hn, &in);  // the same in every thread
    TileRowBounds(p, s, i0, lo, hi, range);
    if (p.mma) {
      CopyWait<0>();  // K, V and this tile's Q and dO
      __syncthreads();
      ScoresBackwardMma(p, s, h, i0, j0, lo, hi, range, sq_tile, sk_tile, sdo_tile, sv_tile, rn,
                        cn, row_lse, row_delta, ss, ds, mag);
    } else {
      CopyWait<1>();  // K, V and this tile's Q (its dO may still be on the way)
      __syncthreads();
      Scores(p, s, h, i0, j0, lo, hi, range, sq_tile, sk_tile, rn, cn, ss,
             p.softcap > 0 ? ds : nullptr, mag);
      for (int c = threadIdx.x; c < tk; c += blockDim.x) {  // in a register: no aliasing stalls
        int64_t n = seen[c];
        for (int r = 0; r < tq; ++r) n += ss[r * st + c] > -INFINITY ? 1 : 0;
        seen[c] = n;
      }
      CopyWait<0>();  // this tile's dO, lse and delta
      __syncthreads();
      BackwardTile(p, sdo_tile, sv_tile, row_lse, row_delta, ss, ds);
    }
    for (int c = threadIdx.x; c < tk; c += blockDim.x) {  // the same order, in a register
      double x = mass[c];
      if (p.mma) {  // with the count of entries where s > -inf: P is -0.0 elsewhere
        int64_t n = seen[c];
        for (int r = 0; r < tq; ++r) {
          const double pr = ss[r * st + c];
          x += pr;
          n += signbit(pr) ? 0 : 1;
        }
        seen[c] = n;
      } else {
        for (int r = 0; r < tq; ++r) x += ss[r * st + c];
      }
      mass[c] = x;
    }
    // dK += dS^T Q, dV += P^T dO (each the tile's product summed apart, then added); the next
    // tile's Q rows requested as soon as dK is done, its dO rows as soon as dV is.
    const int64_t nq_next = next ? min(static_cast<int64_t>(tq), s.q_len - in) : 0;
    // acc += A^T B over the tile's tq rows: A (ds or ss) [tq, tk] at row stride st, B [tq, w]
    // at row stride sb, acc [tk, w] at row stride sb.
    auto product = [&](const double* a, const double* bt, int64_t sb, int64_t w, double* acc) {
      if (p.mma) {
        MmaProduct<2, 4>(p.m16, tk, w, tq, a, 1, st, bt, sb, 1,
                         [&](int64_t c, int64_t d, double part) { acc[c * sb + d] += part; });
      } else {
        for (int c = warp; c < tk; c += warps) {
          for (int64_t d = lane; d < w; d += 32) {
            double part = 0;
            for (int r = 0; r < tq; ++r) part = fma(a[r * st + c], bt[r * sb + d], part);
            acc[c * sb + d] += part;
          }
        }
      }
      __syncthreads();
    };
    auto product_k = [&] {
      product(ds, sq_tile, sd, dd, acc_k);
      if (next) {
        LoadTile(q, p.hq, hn, dd, sd, s.q_begin + in, nq_next, tq, sq_tile);
        LoadRows(p.qn, p.hq, hn, s.q_begin + in, nq_next, tq, 0.0, rn);
      }
      CopyCommit();
    };
    auto product_v = [&] {
      product(ss, sdo_tile, sdv, dv, acc_v);
      if (next) {
        LoadTile(dout, p.hq, hn, dv, sdv, s.q_begin + in, nq_next, tq, sdo_tile);
        const int64_t at = LseIndex(p, b, hn, s, in);
        LoadRows(lse, 1, 0, at, nq_next, tq, -INFINITY, row_lse);
        LoadRows(delta, 1, 0, at, nq_next, tq, 0.0, row_delta);
      }
      CopyCommit();
    };
    if (p.mma) {  // dO first: both are waited for together, and Q is the shorter wait
      product_v();
      product_k();
    } else {  // Q first: the fma path waits for Q before dO
      product_k();
      product_v();
    }
    more = next;
    h = hn;
    i0 = in;
  }
  // The accumulators and column statistics are complete (and initialised, when no query tile
  // ran: a sequence without queries) before they are read across threads.
  CopyWait<0>();
  __syncthreads();
  DkDvEnd(p, s, g, j0, nk, sd, sdv, acc_k, acc_v, mass, seen, adds, mag, dk, dvo, stats);
}

}  // namespace
