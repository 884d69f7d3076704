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

// Shared memory of ForwardKernel, in doubles.
__host__ __device__ int64_t ForwardShared(int64_t d, int64_t dv, int tq, int tk) {
  return tq * Stride(d) + tk * Stride(d) + tk * Stride(dv) + tq * Stride(tk) + tq * dv +
         8 * tq;
}

__global__ void ForwardKernel(Dev p, const double* q, const double* k, const double* v,
                              double* o, double* lse, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  const int64_t g = h / (p.hq / p.hkv);
  const int tq = p.tq, tk = p.tk;
  const int64_t dv = p.dv;
  double* sq_tile = smem;
  double* sk_tile = sq_tile + tq * Stride(p.d);
  double* sv_tile = sk_tile + tk * Stride(p.d);
  double* ss = sv_tile + tk * Stride(dv);
  double* acc = ss + tq * Stride(tk);
  double* m = acc + tq * dv;
  double* l = m + tq;
  double* comp = l + tq;
  double* f = comp + tq;
  int64_t* lo = reinterpret_cast<int64_t*>(f + tq);
  int64_t* hi = lo + tq;
  int64_t* keys = hi + tq;
  int64_t* tiles = keys + tq;
  __shared__ int64_t range[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadTile(q, p.hq, h, p.d, s.q_begin + i0, nq, tq, sq_tile);
  for (int64_t e = threadIdx.x; e < tq * dv; e += blockDim.x) acc[e] = 0;
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
  for (int64_t j0 = range[0] / tk * tk; j0 < range[1]; j0 += tk) {
    const int64_t nk = min(static_cast<int64_t>(tk), s.k_len - j0);
    if (!MaySee(p, lo, hi, j0, nk)) continue;  // the same answer in every thread
    LoadTile(k, p.hkv, g, p.d, s.k_begin + j0, nk, tk, sk_tile);
    LoadTile(v, p.hkv, g, dv, s.k_begin + j0, nk, tk, sv_tile);
    __syncthreads();
    Scores(p, s, h, i0, j0, lo, hi, sq_tile, sk_tile, ss, nullptr, mag);
    // Online softmax, one warp per row; lane c holds key c of the tile.
    for (int r = warp; r < tq; r += static_cast<int>(blockDim.x / 32)) {
      const double x = lane < tk ? ss[r * Stride(tk) + lane] : -INFINITY;
      const bool vis = x > -INFINITY;
      const int count = __popc(__ballot_sync(0xffffffffu, vis));
      double pr = 0;
      if (count > 0) {
        const double mx = WarpMax(x);
        const double m_old = m[r];
        const double m_new = fmax(m_old, mx);
        double fr = 1;
        if (mx > m_old && m_old != -INFINITY) fr = exp(m_old - mx);
        pr = vis ? exp(x - m_new) : 0.0;
        double sum = pr, c = 0;
        WarpSum2(&sum, &c);
        __syncwarp();
        if (lane == 0) {
          double lr = l[r] * fr, cr = comp[r] * fr + c;
          TwoSumAdd(lr, cr, sum);
          l[r] = lr;
          comp[r] = cr;
          m[r] = m_new;
          f[r] = fr;
          keys[r] += count;
          tiles[r] += 1;
        }
      } else if (lane == 0) {
        f[r] = 1;
      }
      if (lane < tk) ss[r * Stride(tk) + lane] = pr;
    }
    __syncthreads();
    // O = f O + P V (the tile's product summed apart: a chain of tk, then one addition).
    if (p.mma) {
      MmaProduct(tq, dv, tk, ss, Stride(tk), 1, sv_tile, Stride(dv), 1,
                 [&](int64_t r, int64_t d, double part) {
                   acc[r * dv + d] = acc[r * dv + d] * f[r] + part;
                 });
    } else {
      for (int64_t e = threadIdx.x; e < tq * dv; e += blockDim.x) {
        const int64_t r = e / dv, d = e % dv;
        const double* pr = ss + r * Stride(tk);
        double part = 0;
        for (int c = 0; c < tk; ++c) part = fma(pr[c], sv_tile[c * Stride(dv) + d], part);
        acc[e] = acc[e] * f[r] + part;
      }
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < nq * dv; e += blockDim.x) {
    const int64_t r = e / dv, d = e % dv;
    double* out = o + ((s.q_begin + i0 + r) * p.hq + h) * dv + d;
    *out = m[r] == -INFINITY ? 0.0 : acc[e] / (l[r] + comp[r]);
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

// P = exp(s - lse) where visible (ss in place), dS = P (dP - delta) [(1 - th^2)] into ds
// (which holds th on entry with softcap), dP = dO V^T. Ends with __syncthreads().
__device__ void BackwardTile(const Dev& p, const double* sdo_tile, const double* sv_tile,
                             const double* row_lse, const double* row_delta, double* ss,
                             double* ds, double* dpb) {
  if (p.mma) {  // dO V^T into dpb first
    MmaProduct(p.tq, p.tk, p.dv, sdo_tile, Stride(p.dv), 1, sv_tile, 1, Stride(p.dv),
               [&](int64_t r, int64_t c, double x) { dpb[r * Stride(p.tk) + c] = x; });
    __syncthreads();
  }
  for (int e = threadIdx.x; e < p.tq * p.tk; e += blockDim.x) {
    const int r = e / p.tk, c = e % p.tk;
    const double x = ss[r * Stride(p.tk) + c];
    double pr = 0, dsv = 0;
    if (x > -INFINITY) {
      pr = exp(x - row_lse[r]);
      double dp = 0;
      if (p.mma) {
        dp = dpb[r * Stride(p.tk) + c];
      } else {
        const double* dor = sdo_tile + r * Stride(p.dv);
        const double* vr = sv_tile + c * Stride(p.dv);
        for (int64_t d = 0; d < p.dv; ++d) dp = fma(dor[d], vr[d], dp);
      }
      dsv = pr * (dp - row_delta[r]);
      if (p.softcap > 0 && pr != 0.0) {
        const double t = ds[r * Stride(p.tk) + c];
        dsv *= 1.0 - t * t;
      }
    }
    ss[r * Stride(p.tk) + c] = pr;
    ds[r * Stride(p.tk) + c] = dsv;
  }
  __syncthreads();
}

__host__ __device__ int64_t DqShared(int64_t d, int64_t dv, int tq, int tk) {
  return tq * Stride(d) + tq * Stride(dv) + tk * Stride(d) + tk * Stride(dv) +
         3 * tq * Stride(tk) + tq * d + 4 * tq;
}

__global__ void DqKernel(Dev p, const double* q, const double* k, const double* v,
                         const double* dout, const double* lse, const double* delta, double* dq,
                         DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * p.tq;
  const Seq s = SeqOf(p, b);
  if (i0 >= s.q_len) return;
  const int64_t g = h / (p.hq / p.hkv);
  const int tq = p.tq, tk = p.tk;
  const int64_t dd = p.d, dv = p.dv;
  double* sq_tile = smem;
  double* sdo_tile = sq_tile + tq * Stride(dd);
  double* sk_tile = sdo_tile + tq * Stride(dv);
  double* sv_tile = sk_tile + tk * Stride(dd);
  double* ss = sv_tile + tk * Stride(dv);
  double* ds = ss + tq * Stride(tk);
  double* dpb = ds + tq * Stride(tk);
  double* acc = dpb + tq * Stride(tk);
  double* row_lse = acc + tq * dd;
  double* row_delta = row_lse + tq;
  int64_t* lo = reinterpret_cast<int64_t*>(row_delta + tq);
  int64_t* hi = lo + tq;
  __shared__ int64_t range[2];

  const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
  LoadTile(q, p.hq, h, dd, s.q_begin + i0, nq, tq, sq_tile);
  LoadTile(dout, p.hq, h, dv, s.q_begin + i0, nq, tq, sdo_tile);
  for (int64_t e = threadIdx.x; e < tq * dd; e += blockDim.x) acc[e] = 0;
  for (int r = threadIdx.x; r < tq; r += blockDim.x) {
    row_lse[r] = r < nq ? lse[LseIndex(p, b, h, s, i0 + r)] : -INFINITY;
    row_delta[r] = r < nq ? delta[LseIndex(p, b, h, s, i0 + r)] : 0.0;
  }
  double mag = 0;  // the score magnitude statistic of this thread's entries
  TileRowBounds(p, s, i0, lo, hi, range);
  int64_t visited = 0;
  for (int64_t j0 = range[0] / tk * tk; j0 < range[1]; j0 += tk) {
    const int64_t nk = min(static_cast<int64_t>(tk), s.k_len - j0);
    if (!MaySee(p, lo, hi, j0, nk)) continue;  // the same answer in every thread
    ++visited;
    LoadTile(k, p.hkv, g, dd, s.k_begin + j0, nk, tk, sk_tile);
    LoadTile(v, p.hkv, g, dv, s.k_begin + j0, nk, tk, sv_tile);
    __syncthreads();
    Scores(p, s, h, i0, j0, lo, hi, sq_tile, sk_tile, ss, p.softcap > 0 ? ds : nullptr, mag);
    BackwardTile(p, sdo_tile, sv_tile, row_lse, row_delta, ss, ds, dpb);
    // dQ += dS K.
    if (p.mma) {
      MmaProduct(tq, dd, tk, ds, Stride(tk), 1, sk_tile, Stride(dd), 1,
                 [&](int64_t r, int64_t d, double part) { acc[r * dd + d] += part; });
    } else {
      for (int64_t e = threadIdx.x; e < tq * dd; e += blockDim.x) {
        const int64_t r = e / dd, d = e % dd;
        const double* dsr = ds + r * Stride(tk);
        double part = 0;
        for (int c = 0; c < tk; ++c) part = fma(dsr[c], sk_tile[c * Stride(dd) + d], part);
        acc[e] += part;
      }
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < nq * dd; e += blockDim.x) {
    const int64_t r = e / dd, d = e % dd;
    dq[((s.q_begin + i0 + r) * p.hq + h) * dd + d] = p.scale * acc[e];
  }
  MaxDouble(&stats->score_abs_max, mag);
  if (threadIdx.x == 0) MaxInt(&stats->sum_len_k, tk + visited);
}

__host__ __device__ int64_t DkDvShared(int64_t d, int64_t dv, int tq, int tk) {
  return tk * Stride(d) + tk * Stride(dv) + tk * d + tk * dv + tq * Stride(d) + tq * Stride(dv) +
         3 * tq * Stride(tk) + 4 * tq + 2 * tk;
}

__global__ void DkDvKernel(Dev p, const double* q, const double* k, const double* v,
                           const double* dout, const double* lse, const double* delta,
                           double* dk, double* dvo, DevStats* stats) {
  ATTEST_DYNAMIC_SHARED(smem);
  const int64_t b = blockIdx.z, g = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * p.tk;
  const Seq s = SeqOf(p, b);
  if (j0 >= s.k_len) return;
  const int tq = p.tq, tk = p.tk;
  const int64_t dd = p.d, dv = p.dv, ratio = p.hq / p.hkv;
  double* sk_tile = smem;
  double* sv_tile = sk_tile + tk * Stride(dd);
  double* acc_k = sv_tile + tk * Stride(dv);
  double* acc_v = acc_k + tk * dd;
  double* sq_tile = acc_v + tk * dv;
  double* sdo_tile = sq_tile + tq * Stride(dd);
  double* ss = sdo_tile + tq * Stride(dv);
  double* ds = ss + tq * Stride(tk);
  double* dpb = ds + tq * Stride(tk);
  double* row_lse = dpb + tq * Stride(tk);
  double* row_delta = row_lse + tq;
  double* mass = row_delta + tq;
  int64_t* seen = reinterpret_cast<int64_t*>(mass + tk);
  int64_t* lo = seen + tk;
  int64_t* hi = lo + tq;
  __shared__ int64_t range[2];

  const int64_t nk = min(static_cast<int64_t>(tk), s.k_len - j0);
  LoadTile(k, p.hkv, g, dd, s.k_begin + j0, nk, tk, sk_tile);
  LoadTile(v, p.hkv, g, dv, s.k_begin + j0, nk, tk, sv_tile);
  for (int64_t e = threadIdx.x; e < tk * dd; e += blockDim.x) acc_k[e] = 0;
  for (int64_t e = threadIdx.x; e < tk * dv; e += blockDim.x) acc_v[e] = 0;
  for (int c = threadIdx.x; c < tk; c += blockDim.x) {
    mass[c] = 0;
    seen[c] = 0;
  }
  int64_t adds = 0;
  double mag = 0;  // the score magnitude statistic of this thread's entries
  for (int64_t h = g * ratio; h < (g + 1) * ratio; ++h) {
    for (int64_t i0 = 0; i0 < s.q_len; i0 += tq) {
      TileRowBounds(p, s, i0, lo, hi, range);
      if (!MaySee(p, lo, hi, j0, nk)) continue;  // the same answer in every thread
      ++adds;
      const int64_t nq = min(static_cast<int64_t>(tq), s.q_len - i0);
      LoadTile(q, p.hq, h, dd, s.q_begin + i0, nq, tq, sq_tile);
      LoadTile(dout, p.hq, h, dv, s.q_begin + i0, nq, tq, sdo_tile);
      for (int r = threadIdx.x; r < tq; r += blockDim.x) {
        row_lse[r] = r < nq ? lse[LseIndex(p, b, h, s, i0 + r)] : -INFINITY;
        row_delta[r] = r < nq ? delta[LseIndex(p, b, h, s, i0 + r)] : 0.0;
      }
      __syncthreads();
      Scores(p, s, h, i0, j0, lo, hi, sq_tile, sk_tile, ss, p.softcap > 0 ? ds : nullptr, mag);
      for (int c = threadIdx.x; c < tk; c += blockDim.x) {
        for (int r = 0; r < tq; ++r) seen[c] += ss[r * Stride(tk) + c] > -INFINITY ? 1 : 0;
      }
      __syncthreads();
      BackwardTile(p, sdo_tile, sv_tile, row_lse, row_delta, ss, ds, dpb);
      for (int c = threadIdx.x; c < tk; c += blockDim.x) {
        for (int r = 0; r < tq; ++r) mass[c] += ss[r * Stride(tk) + c];
      }
      // dV += P^T dO, dK += dS^T Q (each the tile's product summed apart, then added).
      if (p.mma) {
        MmaProduct(tk, dv, tq, ss, 1, Stride(tk), sdo_tile, Stride(dv), 1,
                   [&](int64_t c, int64_t d, double part) { acc_v[c * dv + d] += part; });
        MmaProduct(tk, dd, tq, ds, 1, Stride(tk), sq_tile, Stride(dd), 1,
                   [&](int64_t c, int64_t d, double part) { acc_k[c * dd + d] += part; });
      } else {
        for (int64_t e = threadIdx.x; e < tk * dv; e += blockDim.x) {
          const int64_t c = e / dv, d = e % dv;
          double part = 0;
          for (int r = 0; r < tq; ++r) {
            part = fma(ss[r * Stride(tk) + c], sdo_tile[r * Stride(dv) + d], part);
          }
          acc_v[e] += part;
        }
        for (int64_t e = threadIdx.x; e < tk * dd; e += blockDim.x) {
          const int64_t c = e / dd, d = e % dd;
          double part = 0;
          for (int r = 0; r < tq; ++r) {
            part = fma(ds[r * Stride(tk) + c], sq_tile[r * Stride(dd) + d], part);
          }
          acc_k[e] += part;
        }
      }
      __syncthreads();
    }
  }
  // The accumulators and column statistics are complete (and initialised, when no query tile
  // ran: a sequence without queries) before they are read across threads.
  __syncthreads();
  for (int64_t e = threadIdx.x; e < nk * dd; e += blockDim.x) {
    const int64_t c = e / dd, d = e % dd;
    dk[((s.k_begin + j0 + c) * p.hkv + g) * dd + d] = p.scale * acc_k[e];
  }
  for (int64_t e = threadIdx.x; e < nk * dv; e += blockDim.x) {
    const int64_t c = e / dv, d = e % dv;
    dvo[((s.k_begin + j0 + c) * p.hkv + g) * dv + d] = acc_v[e];
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
    MaxInt(&stats->sum_len_q, tq + adds);
    if (unseen > 0) atomicAdd(&stats->unseen_keys, static_cast<unsigned long long>(unseen));
  }
}

}  // namespace
