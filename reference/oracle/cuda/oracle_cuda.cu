// The float64 attention oracle on a CUDA GPU (oracle_cuda.h; the CPU oracle is
// reference/oracle/oracle_double.cc, whose semantics and summation structure this follows).
//
// Kernels (all float64, --fmad=false: every fused multiply-add is an explicit fma()):
// - NormsKernel: per (row, head) 2-norms and max |x| of q, k, v, dO (OracleStats inputs).
// - ForwardKernel, one block per (batch, query head, query tile of tq rows): for every key
//   tile of tk keys that some row of the tile may see (the rule of TileWalk::ForEachKeyTile,
//   reference/problem/tile_walk.h), in ascending order: S = scale Q K^T (fma chains of D),
//   the score transform and the mask (reference/problem/mask.h, reproduced below), the online
//   softmax (running max m, rescaling of O and the denominator l by exp(m_old - m_new)),
//   P = exp(s - m), l += rowsum(P) compensated (a TwoSum tree over the warp, then TwoSum into
//   l, as Sum2), O = f O + P V (the tile's product summed apart, then added: a chain of tk +
//   tiles per element, as the CPU's). o = O / l, lse = m + log l; empty rows o = 0, lse = -inf.
// - DeltaKernel: delta = dO . o by Dot2 (compensated, exact products by fma), as the CPU.
// - DqKernel, one block per (batch, query head, query tile): the forward's scores again (same
//   code), P = exp(s - lse), dP = dO V^T, dS = P (dP - delta) [(1 - tanh^2) with softcap],
//   dQ += dS K per key tile; dq = scale dQ.
// - DkDvKernel, one block per (batch, kv head, key tile): for every query head of the group
//   and every query tile that may see the tile, in ascending order: the same S, P, dS;
//   dV += P^T dO, dK += dS^T Q; dk = scale dK. No atomics on outputs: every output element
//   has one owner block, so results are deterministic (run to run bitwise equal).
// Memory: O(tile) shared memory per block plus the inputs, outputs and per-row norms; never
// O(Sq Sk).
// Products: fma chains over shared-memory tiles (each thread a few outputs), or with
// ATTEST_ORACLE_CUDA_MMA the FP64 tensor cores (MmaProduct: mma.sync m8n8k4 f64 per 8 x 8
// block). Both sum each tile's product apart and then add it, so the chains are the same.
// Compiled with -DATTEST_ORACLE_CUDA_EMULATE by a C++ compiler (oracle_cuda_emulated.cc), the
// kernels run on CPU threads (oracle_cuda_emulate.h) for tests without a GPU.
//
// Error bound. The GPU evaluates the same expressions as the CPU oracle with at most the same
// per-operation error: additions, multiplications, divisions and sqrt are IEEE round-to-nearest
// (u); fma rounds once; exp, log and tanh of CUDA's double-precision math library have a
// maximum error of 1 ulp (CUDA C++ Programming Guide, "Mathematical Functions", Double-Precision
// Floating-Point Functions: exp 1, log 1, tanh 1;
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/#double-precision-floating-point-functions
// — found by extensive but not exhaustive testing, as that appendix states), which is what
// reference/oracle/oracle_bound.cc assumes for the CPU (exp within one ulp, log and tanh of glibc
// within one ulp). The products are fma chains in some order, the sums of Higham's any-order
// model. So ErrorBound(stats, t) of oracle.h holds for the GPU result with the statistics this
// file reports (sum_len_k and sum_len_q are the GPU's own chain lengths: tk + key tiles, tq +
// (head, query tile) pairs), and |gpu - cpu| <= ErrorBound(gpu) + ErrorBound(cpu).
#include "reference/oracle/cuda/oracle_cuda.h"

#ifdef ATTEST_ORACLE_CUDA_EMULATE
#include "reference/oracle/cuda/oracle_cuda_emulate.h"  // the kernels on CPU threads
#else
#include <cuda_runtime.h>
#define ATTEST_LAUNCH(kernel, grid, block, shared, ...) \
  kernel<<<(grid), (block), (shared)>>>(__VA_ARGS__)
#define ATTEST_DYNAMIC_SHARED(name) extern __shared__ double name[]
#endif
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

#ifdef ATTEST_ORACLE_CUDA_EMULATE
constexpr int kThreads = 64;  // fewer CPU threads per block; the kernels read blockDim
#else
constexpr int kThreads = 256;  // 8 warps
#endif

// The problem on the device: sizes, the effective mask rules of MaskView (mask.cc), pointers to
// device copies of the per-token arrays.
struct Dev {
  int64_t batch, hq, hkv, sq, sk, d, dv, total_q, total_k;
  double scale, softcap;
  int top_left;
  int64_t left, right, prefix;  // right: causal caps it at 0 (MaskView's constructor)
  const double* slopes;
  const int32_t* cu_q;
  const int32_t* cu_k;
  const int32_t* doc_q;
  const int32_t* doc_k;
  int64_t block_q, block_k, key_blocks;
  const uint8_t* blocks;
  // Norms of (row, head) for the score magnitude statistic.
  const double* qn;
  const double* kn;
  int tq, tk;  // tile sizes (<= 32 each; multiples of 8 with mma)
  int mma;     // products on the FP64 tensor cores (MmaProduct) instead of fma chains
};

struct Seq {
  int64_t q_begin, q_len, k_begin, k_len, off;
};

// Statistics on the device: maxima of non-negative doubles kept as their bit patterns (the
// order of non-negative IEEE doubles is that of the integers), counts as integers.
struct DevStats {
  unsigned long long score_abs_max, v_abs_max, v_norm_max, k_abs_max, lse_abs_max;
  unsigned long long q_abs_max, do_abs_max, do_norm_max, col_mass_max;
  unsigned long long max_keys, sum_len_k, empty_rows, max_queries, sum_len_q, unseen_keys;
};

__device__ void MaxDouble(unsigned long long* at, double x) {
  if (x > 0) atomicMax(at, static_cast<unsigned long long>(__double_as_longlong(x)));
}
__device__ void MaxInt(unsigned long long* at, int64_t x) {
  if (x > 0) atomicMax(at, static_cast<unsigned long long>(x));
}

__device__ Seq SeqOf(const Dev& p, int64_t b) {
  Seq s;
  if (p.cu_q != nullptr) {
    s.q_begin = p.cu_q[b];
    s.q_len = p.cu_q[b + 1] - s.q_begin;
    s.k_begin = p.cu_k[b];
    s.k_len = p.cu_k[b + 1] - s.k_begin;
  } else {
    s.q_begin = b * p.sq;
    s.q_len = p.sq;
    s.k_begin = b * p.sk;
    s.k_len = p.sk;
  }
  s.off = p.top_left ? 0 : s.k_len - s.q_len;
  return s;
}

// MaskView::KeyBounds (reference/problem/mask.cc), line by line.
__device__ void KeyBounds(const Dev& p, const Seq& s, int64_t i, int64_t* lo_out,
                          int64_t* hi_out) {
  const int64_t diag = i + s.off;
  int64_t lo = p.left >= 0 ? max(int64_t{0}, diag - p.left) : 0;
  int64_t hi = p.right >= 0 ? min(s.k_len, diag + p.right + 1) : s.k_len;
  if (p.prefix > 0) {
    const int64_t pre = min(p.prefix, s.k_len);
    if (hi <= lo) {
      lo = 0;
      hi = pre;
    } else {
      lo = 0;
      hi = max(hi, pre);
    }
  }
  if (hi < lo) hi = lo;
  *lo_out = min(max(lo, int64_t{0}), s.k_len);
  *hi_out = min(max(hi, int64_t{0}), s.k_len);
}

// MaskView::Visible (mask.cc). Document ids are indexed by token row (padded layouts only).
__device__ bool Visible(const Dev& p, const Seq& s, int64_t i, int64_t j) {
  if (i < 0 || i >= s.q_len || j < 0 || j >= s.k_len) return false;
  const int64_t diag = i + s.off;
  bool band = true;
  if (p.left >= 0 && j < diag - p.left) band = false;
  if (p.right >= 0 && j > diag + p.right) band = false;
  if (!(band || j < p.prefix)) return false;
  if (p.doc_q != nullptr && p.doc_q[s.q_begin + i] != p.doc_k[s.k_begin + j]) return false;
  if (p.blocks != nullptr &&
      p.blocks[(i / p.block_q) * p.key_blocks + j / p.block_k] == 0) {
    return false;
  }
  return true;
}

__device__ int64_t LseIndex(const Dev& p, int64_t b, int64_t h, const Seq& s, int64_t i) {
  if (p.cu_q != nullptr) return h * p.total_q + s.q_begin + i;
  return (b * p.hq + h) * p.sq + i;
}

// The shared-memory row stride of a tile of `width` doubles (odd: fewer bank conflicts).
__host__ __device__ int64_t Stride(int64_t width) { return width + 1; }

// Warp reductions (all lanes get the result).
__device__ double WarpMax(double x) {
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Compensated sum over the warp: a TwoSum tree carrying each addition's exact error (Sum2's
// bound in tree order; Ogita, Rump, Oishi, "Accurate sum and dot product", SIAM J. Sci.
// Comput. 26(6), 2005). TwoSum is symmetric, so every lane ends with the same (sum, comp).
__device__ void WarpSum2(double* sum, double* comp) {
  double s = *sum, c = *comp;
  for (int o = 16; o > 0; o >>= 1) {
    const double s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const double c2 = __shfl_xor_sync(0xffffffffu, c, o);
    const double t = s + s2;
    const double bp = t - s;
    const double e = (s - (t - bp)) + (s2 - bp);
    s = t;
    c = (c + c2) + e;
  }
  *sum = s;
  *comp = c;
}
// TwoSumAdd of oracle_double.cc.
__device__ void TwoSumAdd(double& sum, double& comp, double x) {
  const double t = sum + x;
  const double bp = t - sum;
  comp += (sum - (t - bp)) + (x - bp);
  sum = t;
}

// D = A B + C for one 8 x 8 x 4 block on the FP64 tensor cores: mma.sync.aligned.m8n8k4.row.col
// .f64 (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f64 floating point type"): with
// g = lane >> 2 and t = lane & 3, lane holds a = A[g][t], b = B[t][g], and c0, c1 = C[g][2t],
// C[g][2t + 1] (in and out). Every lane of the warp must call it.
__device__ void Mma884(double& c0, double& c1, double a, double b) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  attest_emu::Mma884(c0, c1, a, b);
#else
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(c0), "+d"(c1)
               : "d"(a), "d"(b));
#endif
}

// The tile product C = A B (m x n, m a multiple of 8; k = kdim) on the tensor cores, with
// A(i, k) = a[i * a_i + k * a_k] and B(k, j) = b[k * b_k + j * b_j] in shared memory; each warp
// takes 8 x 8 blocks of C in turn and hands every element to out(i, j, value) once (columns
// j >= n are padding, never handed out). Every thread of the block must call it; the caller
// synchronises after.
template <class Out>
__device__ void MmaProduct(int m, int64_t n, int64_t kdim, const double* a, int64_t a_i,
                           int64_t a_k, const double* b, int64_t b_k, int64_t b_j, Out&& out) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int warps = static_cast<int>(blockDim.x / 32);
  const int64_t col_blocks = (n + 7) / 8, blocks = (m / 8) * col_blocks;
  for (int64_t blk = threadIdx.x / 32; blk < blocks; blk += warps) {
    const int64_t i0 = blk / col_blocks * 8, j0 = blk % col_blocks * 8;
    double c0 = 0, c1 = 0;
    for (int64_t k0 = 0; k0 < kdim; k0 += 4) {
      const int64_t k = k0 + t;
      const double av = k < kdim ? a[(i0 + g) * a_i + k * a_k] : 0.0;
      const double bv = k < kdim && j0 + g < n ? b[k * b_k + (j0 + g) * b_j] : 0.0;
      Mma884(c0, c1, av, bv);
    }
    const int64_t j = j0 + 2 * t;
    if (j < n) out(i0 + g, j, c0);
    if (j + 1 < n) out(i0 + g, j + 1, c1);
  }
}

// Row bounds of query rows [i0, i0 + tq) into lo/hi (tile rows past the sequence: empty), then
// the union of the bounds into range[0..1]. Begins and ends with __syncthreads().
__device__ void TileRowBounds(const Dev& p, const Seq& s, int64_t i0, int64_t* lo, int64_t* hi,
                              int64_t* range) {
  __syncthreads();  // lo, hi and range may still be read for the previous tile
  for (int r = threadIdx.x; r < p.tq; r += blockDim.x) {
    int64_t a = 0, z = 0;
    if (i0 + r < s.q_len) KeyBounds(p, s, i0 + r, &a, &z);
    lo[r] = a;
    hi[r] = z;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t a = s.k_len, z = 0;
    for (int r = 0; r < p.tq; ++r) {
      if (lo[r] < hi[r]) {
        a = min(a, lo[r]);
        z = max(z, hi[r]);
      }
    }
    range[0] = a;
    range[1] = z;
  }
  __syncthreads();
}

// TileWalk::MaySee: some row of the tile may see some key of [j0, j0 + tk).
__device__ bool MaySee(const Dev& p, const int64_t* lo, const int64_t* hi, int64_t j0,
                       int64_t tk) {
  for (int r = 0; r < p.tq; ++r) {
    if (lo[r] < hi[r] && lo[r] < j0 + tk && hi[r] > j0) return true;
  }
  return false;
}

// Loads rows [row0, row0 + n) of head `head` of a [rows, heads, width] tensor into a tile of
// `rows_tile` rows (stride Stride(width)); rows past n are zero.
__device__ void LoadTile(const double* x, int64_t heads, int64_t head, int64_t width,
                         int64_t row0, int64_t n, int rows_tile, double* tile) {
  const int64_t count = rows_tile * width;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t r = e / width, d = e % width;
    tile[r * Stride(width) + d] = r < n ? x[((row0 + r) * heads + head) * width + d] : 0.0;
  }
}

// Transformed, masked scores of the tile (query rows i0.., keys j0.. of sequence s, query head
// h): s_rc = TransformScore(scale q.k) where Visible, -inf elsewhere (reference/problem/mask.h);
// th_rc = tanh(scale q.k / cap) with softcap (th may be null). Records the score magnitude
// statistic of every visible entry into the thread's `mag`. Ends with __syncthreads().
__device__ void Scores(const Dev& p, const Seq& s, int64_t h, int64_t i0, int64_t j0,
                       const int64_t* lo, const int64_t* hi, const double* sq_tile,
                       const double* sk_tile, double* ss, double* th, double& mag) {
  const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;
  const int64_t g = h / (p.hq / p.hkv);
  if (p.mma) {  // Q K^T into ss first
    MmaProduct(p.tq, p.tk, p.d, sq_tile, Stride(p.d), 1, sk_tile, 1, Stride(p.d),
               [&](int64_t r, int64_t c, double x) { ss[r * Stride(p.tk) + c] = x; });
    __syncthreads();
  }
  for (int e = threadIdx.x; e < p.tq * p.tk; e += blockDim.x) {
    const int r = e / p.tk, c = e % p.tk;
    const int64_t i = i0 + r, j = j0 + c;
    double sc = -INFINITY, t = 0;
    if (j >= lo[r] && j < hi[r] && Visible(p, s, i, j)) {
      double dot = 0;
      if (p.mma) {
        dot = ss[r * Stride(p.tk) + c];
      } else {
        const double* qr = sq_tile + r * Stride(p.d);
        const double* kr = sk_tile + c * Stride(p.d);
        for (int64_t d = 0; d < p.d; ++d) dot = fma(qr[d], kr[d], dot);
      }
      sc = p.scale * dot;
      if (p.softcap > 0) {
        t = tanh(sc / p.softcap);
        sc = p.softcap * t;
      }
      const int64_t diag = i + s.off;
      const int64_t dist = diag > j ? diag - j : j - diag;
      if (slope != 0) sc -= slope * static_cast<double>(dist);
      const double nq = p.qn[(s.q_begin + i) * p.hq + h];
      const double nk = p.kn[(s.k_begin + j) * p.hkv + g];
      mag = fmax(mag, fabs(p.scale) * nq * nk + fabs(slope) * static_cast<double>(dist));
    }
    ss[r * Stride(p.tk) + c] = sc;
    if (th != nullptr) th[r * Stride(p.tk) + c] = t;
  }
  __syncthreads();
}

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

// ---------------------------------------------------------------------------------------------
// Host side.

void SetMessage(char* message, int64_t size, const std::string& text) {
  if (message == nullptr || size <= 0) return;
  const size_t n = std::min(static_cast<size_t>(size - 1), text.size());
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

struct Failure {
  int code;
  std::string message;
};

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Failure{2, std::string("CUDA oracle: ") + what + ": " + cudaGetErrorName(e) + ": " +
                         cudaGetErrorString(e)};
  }
}

void Require(bool ok, const std::string& text) {
  if (!ok) throw Failure{1, "CUDA oracle: " + text};
}

// Device allocations freed when the call ends, whatever way.
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* ptr : ptrs_) cudaFree(ptr);
  }
  template <class T>
  T* Alloc(int64_t n, const char* what) {
    void* ptr = nullptr;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
    Check(cudaMalloc(&ptr, bytes), (std::string("cudaMalloc ") + what).c_str());
    ptrs_.push_back(ptr);
    return static_cast<T*>(ptr);
  }
  template <class T>
  T* Copy(const T* host, int64_t n, const char* what) {
    T* dev = Alloc<T>(n, what);
    if (n > 0) {
      Check(cudaMemcpy(dev, host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice),
            (std::string("cudaMemcpy to device ") + what).c_str());
    }
    return dev;
  }

 private:
  std::vector<void*> ptrs_;
};

void CheckLaunch(const char* kernel) {
  Check(cudaGetLastError(), (std::string("launch of ") + kernel).c_str());
}

double Bits(unsigned long long x) {
  double d;
  std::memcpy(&d, &x, sizeof d);
  return d;
}

void Run(const AttestOracleCudaProblem& pr, const double* q, const double* k, const double* v,
         const double* dout, double* o, double* lse, double* dq, double* dk, double* dv,
         double* delta, int flags, AttestOracleCudaStats* stats) {
  Require(pr.batch >= 1 && pr.batch <= 65535, "batch must be in [1, 65535]");
  Require(pr.heads_kv >= 1 && pr.heads_q >= pr.heads_kv && pr.heads_q % pr.heads_kv == 0 &&
              pr.heads_q <= 65535,
          "heads_q must be a multiple of heads_kv >= 1 (and <= 65535)");
  Require(pr.seqlen_q >= 0 && pr.seqlen_k >= 0, "seqlen_q and seqlen_k must be >= 0");
  Require(pr.head_dim >= 1 && pr.head_dim_v >= 1, "head_dim and head_dim_v must be >= 1");
  Require((pr.cu_seqlens_q == nullptr) == (pr.cu_seqlens_k == nullptr),
          "cu_seqlens_q and cu_seqlens_k: both or neither");
  Require((pr.document_ids_q == nullptr) == (pr.document_ids_k == nullptr),
          "document_ids_q and document_ids_k: both or neither");
  Require(pr.document_ids_q == nullptr || pr.cu_seqlens_q == nullptr,
          "document_ids_q: not with cu_seqlens (as Validate)");
  Require(pr.block_q <= 0 || (pr.block_k > 0 && pr.blocks_map != nullptr),
          "block_sparse: block_k > 0 and blocks_map are needed with block_q > 0");
  Require(q != nullptr && k != nullptr && v != nullptr && o != nullptr && lse != nullptr,
          "q, k, v, o and lse must not be null");
  Require(dout == nullptr ||
              (dq != nullptr && dk != nullptr && dv != nullptr && delta != nullptr),
          "dq, dk, dv and delta must not be null with dout");
  const bool on_device = (flags & ATTEST_ORACLE_CUDA_DEVICE_POINTERS) != 0;

  int devices = 0;
  Check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  Require(devices > 0, "no CUDA device");
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");

  const int64_t batch = pr.batch, hq = pr.heads_q, hkv = pr.heads_kv;
  int64_t total_q = batch * pr.seqlen_q, total_k = batch * pr.seqlen_k;
  int64_t max_q = pr.seqlen_q, max_k = pr.seqlen_k;
  if (pr.cu_seqlens_q != nullptr) {
    Require(pr.cu_seqlens_q[0] == 0 && pr.cu_seqlens_k[0] == 0, "cu_seqlens must start at 0");
    max_q = max_k = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t lq = pr.cu_seqlens_q[b + 1] - pr.cu_seqlens_q[b];
      const int64_t lk = pr.cu_seqlens_k[b + 1] - pr.cu_seqlens_k[b];
      Require(lq >= 0, "cu_seqlens_q must be non-decreasing");
      Require(lk >= 0, "cu_seqlens_k must be non-decreasing");
      max_q = std::max(max_q, lq);
      max_k = std::max(max_k, lk);
    }
    total_q = pr.cu_seqlens_q[batch];
    total_k = pr.cu_seqlens_k[batch];
  }
  const int64_t dd = pr.head_dim, dvw = pr.head_dim_v;
  const int64_t nq_el = total_q * hq * dd, nk_el = total_k * hkv * dd;
  const int64_t nv_el = total_k * hkv * dvw, no_el = total_q * hq * dvw;
  const int64_t nlse = total_q * hq;

  // Tiles: the largest that fit the device's shared memory in all three kernels.
  int optin = 0;
  Check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  const int64_t limit = optin - 1024;  // room for the kernels' static shared variables
  int tq = 0, tk = 0;
  const int candidates[][2] = {{32, 32}, {16, 32}, {16, 16}, {8, 16}, {8, 8}, {4, 8}};
  const bool mma = (flags & ATTEST_ORACLE_CUDA_MMA) != 0;
  for (const auto& c : candidates) {
    if (mma && (c[0] % 8 != 0 || c[1] % 8 != 0)) continue;  // MmaProduct's 8 x 8 blocks
    const int64_t need = 8 * std::max({ForwardShared(dd, dvw, c[0], c[1]),
                                        DqShared(dd, dvw, c[0], c[1]),
                                        DkDvShared(dd, dvw, c[0], c[1])});
    if (need <= limit) {
      tq = c[0];
      tk = c[1];
      break;
    }
  }
  Require(tq > 0, "head_dim " + std::to_string(dd) + " / head_dim_v " + std::to_string(dvw) +
                      ": too large for the device's shared memory (" + std::to_string(optin) +
                      " bytes per block)");
  const size_t fwd_bytes = 8 * static_cast<size_t>(ForwardShared(dd, dvw, tq, tk));
  const size_t dq_bytes = 8 * static_cast<size_t>(DqShared(dd, dvw, tq, tk));
  const size_t dkdv_bytes = 8 * static_cast<size_t>(DkDvShared(dd, dvw, tq, tk));
  Check(cudaFuncSetAttribute(ForwardKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(fwd_bytes)),
        "cudaFuncSetAttribute(ForwardKernel)");
  Check(cudaFuncSetAttribute(DqKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(dq_bytes)),
        "cudaFuncSetAttribute(DqKernel)");
  Check(cudaFuncSetAttribute(DkDvKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(dkdv_bytes)),
        "cudaFuncSetAttribute(DkDvKernel)");

  DeviceArena arena;
  Dev p{};
  p.batch = batch;
  p.hq = hq;
  p.hkv = hkv;
  p.sq = pr.seqlen_q;
  p.sk = pr.seqlen_k;
  p.d = dd;
  p.dv = dvw;
  p.total_q = total_q;
  p.total_k = total_k;
  p.scale = pr.scale;
  p.softcap = pr.softcap;
  p.top_left = pr.causal_top_left != 0;
  p.left = pr.window_left;
  p.right = pr.window_right;
  if (pr.causal) p.right = p.right < 0 ? 0 : std::min<int64_t>(p.right, 0);
  p.prefix = pr.prefix_lm;
  p.slopes = pr.alibi_slopes != nullptr ? arena.Copy(pr.alibi_slopes, hq, "alibi_slopes")
                                        : nullptr;
  if (pr.cu_seqlens_q != nullptr) {
    p.cu_q = arena.Copy(pr.cu_seqlens_q, batch + 1, "cu_seqlens_q");
    p.cu_k = arena.Copy(pr.cu_seqlens_k, batch + 1, "cu_seqlens_k");
  }
  if (pr.document_ids_q != nullptr) {
    p.doc_q = arena.Copy(pr.document_ids_q, batch * pr.seqlen_q, "document_ids_q");
    p.doc_k = arena.Copy(pr.document_ids_k, batch * pr.seqlen_k, "document_ids_k");
  }
  if (pr.block_q > 0) {
    p.block_q = pr.block_q;
    p.block_k = pr.block_k;
    const int64_t qb = (pr.seqlen_q + pr.block_q - 1) / pr.block_q;
    p.key_blocks = (pr.seqlen_k + pr.block_k - 1) / pr.block_k;
    p.blocks = arena.Copy(pr.blocks_map, qb * p.key_blocks, "blocks_map");
  }
  p.tq = tq;
  p.tk = tk;
  p.mma = mma ? 1 : 0;

  // Inputs and outputs on the device.
  const double *dq_in = q, *dk_in = k, *dv_in = v, *ddo_in = dout;
  double *d_o = o, *d_lse = lse, *d_dq = dq, *d_dk = dk, *d_dv = dv, *d_delta = delta;
  if (!on_device) {
    dq_in = arena.Copy(q, nq_el, "q");
    dk_in = arena.Copy(k, nk_el, "k");
    dv_in = arena.Copy(v, nv_el, "v");
    if (dout != nullptr) ddo_in = arena.Copy(dout, no_el, "dout");
    d_o = arena.Alloc<double>(no_el, "o");
    d_lse = arena.Alloc<double>(nlse, "lse");
    if (dout != nullptr) {
      d_dq = arena.Alloc<double>(nq_el, "dq");
      d_dk = arena.Alloc<double>(nk_el, "dk");
      d_dv = arena.Alloc<double>(nv_el, "dv");
      d_delta = arena.Alloc<double>(nlse, "delta");
    }
  }
  double* qn = arena.Alloc<double>(total_q * hq, "q norms");
  double* kn = arena.Alloc<double>(total_k * hkv, "k norms");
  p.qn = qn;
  p.kn = kn;
  DevStats* dstats = arena.Alloc<DevStats>(1, "statistics");
  Check(cudaMemset(dstats, 0, sizeof(DevStats)), "cudaMemset(statistics)");
  Check(cudaMemset(d_o, 0, static_cast<size_t>(no_el) * 8), "cudaMemset(o)");
  if (dout != nullptr) {
    Check(cudaMemset(d_dq, 0, static_cast<size_t>(nq_el) * 8), "cudaMemset(dq)");
    Check(cudaMemset(d_dk, 0, static_cast<size_t>(nk_el) * 8), "cudaMemset(dk)");
    Check(cudaMemset(d_dv, 0, static_cast<size_t>(nv_el) * 8), "cudaMemset(dv)");
    Check(cudaMemset(d_delta, 0, static_cast<size_t>(nlse) * 8), "cudaMemset(delta)");
  }

  cudaEvent_t start = nullptr, stop = nullptr;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  struct EventGuard {
    cudaEvent_t a, b;
    ~EventGuard() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  } guard{start, stop};
  Check(cudaEventRecord(start), "cudaEventRecord");

  auto blocks_for = [](int64_t n) {
    return static_cast<unsigned>((n + kThreads - 1) / kThreads);
  };
  DevStats* sp = dstats;
  if (total_q * hq > 0) {
    ATTEST_LAUNCH(NormsKernel, blocks_for(total_q * hq), kThreads, 0, dq_in, total_q * hq, dd,
                  qn, &sp->q_abs_max, nullptr);
    CheckLaunch("NormsKernel(q)");
  }
  if (total_k * hkv > 0) {
    ATTEST_LAUNCH(NormsKernel, blocks_for(total_k * hkv), kThreads, 0, dk_in, total_k * hkv, dd,
                  kn, &sp->k_abs_max, nullptr);
    CheckLaunch("NormsKernel(k)");
    ATTEST_LAUNCH(NormsKernel, blocks_for(total_k * hkv), kThreads, 0, dv_in, total_k * hkv, dvw,
                  nullptr, &sp->v_abs_max, &sp->v_norm_max);
    CheckLaunch("NormsKernel(v)");
  }
  if (dout != nullptr && total_q * hq > 0) {
    ATTEST_LAUNCH(NormsKernel, blocks_for(total_q * hq), kThreads, 0, ddo_in, total_q * hq, dvw,
                  nullptr, &sp->do_abs_max, &sp->do_norm_max);
    CheckLaunch("NormsKernel(dout)");
  }
  const int64_t q_tiles = (max_q + tq - 1) / tq, k_tiles = (max_k + tk - 1) / tk;
  if (q_tiles > 0) {
    Require(q_tiles <= 0x7fffffff, "seqlen_q too large");
    const dim3 grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(hq),
                    static_cast<unsigned>(batch));
    ATTEST_LAUNCH(ForwardKernel, grid, kThreads, fwd_bytes, p, dq_in, dk_in, dv_in, d_o, d_lse,
                  dstats);
    CheckLaunch("ForwardKernel");
  }
  // Rows of zero-length sequences have no lse entries; nothing else to fill.
  if (dout != nullptr) {
    if (nlse > 0) {
      ATTEST_LAUNCH(DeltaKernel, blocks_for(nlse), kThreads, 0, p, ddo_in, d_o, d_delta);
      CheckLaunch("DeltaKernel");
    }
    if (q_tiles > 0) {
      const dim3 grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(hq),
                      static_cast<unsigned>(batch));
      ATTEST_LAUNCH(DqKernel, grid, kThreads, dq_bytes, p, dq_in, dk_in, dv_in, ddo_in, d_lse,
                    d_delta, d_dq, dstats);
      CheckLaunch("DqKernel");
    }
    if (k_tiles > 0) {
      Require(k_tiles <= 0x7fffffff, "seqlen_k too large");
      const dim3 grid(static_cast<unsigned>(k_tiles), static_cast<unsigned>(hkv),
                      static_cast<unsigned>(batch));
      ATTEST_LAUNCH(DkDvKernel, grid, kThreads, dkdv_bytes, p, dq_in, dk_in, dv_in, ddo_in, d_lse,
                    d_delta, d_dk, d_dv, dstats);
      CheckLaunch("DkDvKernel");
    }
  }
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "kernels (cudaEventSynchronize)");
  Check(cudaDeviceSynchronize(), "kernels (cudaDeviceSynchronize)");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");

  if (!on_device) {
    auto back = [](double* host, const double* dev, int64_t n, const char* what) {
      if (n <= 0) return;
      Check(cudaMemcpy(host, dev, static_cast<size_t>(n) * 8, cudaMemcpyDeviceToHost),
            (std::string("cudaMemcpy to host ") + what).c_str());
    };
    back(o, d_o, no_el, "o");
    back(lse, d_lse, nlse, "lse");
    if (dout != nullptr) {
      back(dq, d_dq, nq_el, "dq");
      back(dk, d_dk, nk_el, "dk");
      back(dv, d_dv, nv_el, "dv");
      back(delta, d_delta, nlse, "delta");
    }
  }
  DevStats h{};
  Check(cudaMemcpy(&h, dstats, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy statistics");
  if (stats != nullptr) {
    AttestOracleCudaStats out{};
    out.score_abs_max = Bits(h.score_abs_max);
    out.v_abs_max = Bits(h.v_abs_max);
    out.v_norm_max = Bits(h.v_norm_max);
    out.k_abs_max = Bits(h.k_abs_max);
    out.lse_abs_max = Bits(h.lse_abs_max);
    out.max_keys = static_cast<int64_t>(h.max_keys);
    out.sum_len_k = static_cast<int64_t>(h.sum_len_k);
    out.empty_rows = static_cast<int64_t>(h.empty_rows);
    if (dout != nullptr) {
      out.q_abs_max = Bits(h.q_abs_max);
      out.do_abs_max = Bits(h.do_abs_max);
      out.do_norm_max = Bits(h.do_norm_max);
      out.col_mass_max = Bits(h.col_mass_max);
      out.max_queries = static_cast<int64_t>(h.max_queries);
      out.sum_len_q = static_cast<int64_t>(h.sum_len_q);
      out.unseen_keys = static_cast<int64_t>(h.unseen_keys);
    }
    out.kernel_seconds = ms * 1e-3;
    *stats = out;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int attest_oracle_cuda_run(
    const AttestOracleCudaProblem* problem, const double* q, const double* k, const double* v,
    const double* dout, double* o, double* lse, double* dq, double* dk, double* dv,
    double* delta, int flags, AttestOracleCudaStats* stats, char* message,
    int64_t message_size) {
  SetMessage(message, message_size, "");
  if (problem == nullptr) {
    SetMessage(message, message_size, "CUDA oracle: problem is null");
    return 1;
  }
  try {
    Run(*problem, q, k, v, dout, o, lse, dq, dk, dv, delta, flags, stats);
    return 0;
  } catch (const Failure& f) {
    SetMessage(message, message_size, f.message);
    return f.code;
  } catch (const std::exception& e) {
    SetMessage(message, message_size, std::string("CUDA oracle: ") + e.what());
    return 3;
  }
}

extern "C" __attribute__((visibility("default"))) int attest_oracle_cuda_device_count(
    char* message, int64_t message_size) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    SetMessage(message, message_size,
               std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
                   cudaGetErrorString(e));
    return 0;
  }
  if (n == 0) SetMessage(message, message_size, "no CUDA device");
  return n;
}

// cuBLAS through dlopen (cublas_api.h: cublasCreate_v2, cublasDgemm_v2, cublasDestroy_v2;
// cublasOperation_t CUBLAS_OP_N = 0; status 0 = CUBLAS_STATUS_SUCCESS).
extern "C" __attribute__((visibility("default"))) int attest_oracle_cuda_dgemm_seconds(
    int64_t n, int repeats, double* seconds, char* message, int64_t message_size) {
  SetMessage(message, message_size, "");
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  (void)n;
  (void)repeats;
  (void)seconds;
  SetMessage(message, message_size, "no cuBLAS in the CPU emulation");
  return 1;
#else
  std::vector<std::string> names;
  if (const char* env = std::getenv("ATTEST_CUBLAS"); env != nullptr && *env != '\0') {
    names.push_back(env);
  }
  for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
    names.push_back(name);
  }
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : names) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (lib == nullptr) {
    SetMessage(message, message_size, "no cuBLAS (tried " + tried + "; set ATTEST_CUBLAS)");
    return 1;
  }
  using Create = int (*)(void**);
  using Destroy = int (*)(void*);
  using Dgemm = int (*)(void*, int, int, int, int, int, const double*, const double*, int,
                        const double*, int, const double*, double*, int);
  auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "cublasDestroy_v2"));
  auto dgemm = reinterpret_cast<Dgemm>(dlsym(lib, "cublasDgemm_v2"));
  if (create == nullptr || destroy == nullptr || dgemm == nullptr) {
    SetMessage(message, message_size, "cuBLAS lacks cublasCreate_v2/cublasDgemm_v2");
    return 1;
  }
  try {
    DeviceArena arena;
    double* a = arena.Alloc<double>(n * n, "dgemm A");
    double* b = arena.Alloc<double>(n * n, "dgemm B");
    double* c = arena.Alloc<double>(n * n, "dgemm C");
    Check(cudaMemset(a, 0, static_cast<size_t>(n * n) * 8), "cudaMemset");
    Check(cudaMemset(b, 0, static_cast<size_t>(n * n) * 8), "cudaMemset");
    void* handle = nullptr;
    Require(create(&handle) == 0, "cublasCreate_v2 failed");
    const double one = 1, zero = 0;
    const int ni = static_cast<int>(n);
    double best = 1e30;
    cudaEvent_t e0, e1;
    Check(cudaEventCreate(&e0), "cudaEventCreate");
    Check(cudaEventCreate(&e1), "cudaEventCreate");
    for (int r = 0; r <= repeats; ++r) {
      Check(cudaEventRecord(e0), "cudaEventRecord");
      Require(dgemm(handle, 0, 0, ni, ni, ni, &one, a, ni, b, ni, &zero, c, ni) == 0,
              "cublasDgemm_v2 failed");
      Check(cudaEventRecord(e1), "cudaEventRecord");
      Check(cudaEventSynchronize(e1), "dgemm (cudaEventSynchronize)");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (r > 0) best = std::min(best, ms * 1e-3);  // r = 0: warm-up
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    destroy(handle);
    *seconds = best;
    return 0;
  } catch (const Failure& f) {
    SetMessage(message, message_size, f.message);
    return f.code;
  }
#endif
}
