// Device helpers of the CUDA float64 oracle: the problem and statistics on the device, the
// mask rules (MaskView::KeyBounds and Visible of reference/problem/mask.cc), warp reductions,
// compensated sums, the FP64 tensor-core block product and the tile loaders and score tiles.
// Included by oracle_cuda.cu only, after its CUDA (or emulation) includes; the file's header
// comment describes the kernels and the error bound.
#pragma once

namespace {


#ifdef ATTEST_ORACLE_CUDA_EMULATE
#define ATTEST_UNROLL
#define ATTEST_UNROLL_BY_2
#define ATTEST_UNROLL_BY_4
#else
#define ATTEST_UNROLL _Pragma("unroll")
#define ATTEST_UNROLL_BY_2 _Pragma("unroll 2")
#define ATTEST_UNROLL_BY_4 _Pragma("unroll 4")
#endif

#ifdef ATTEST_ORACLE_CUDA_EMULATE
constexpr int kThreads = 64;  // fewer emulated threads per block; the kernels read blockDim
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
  int tq, tk;     // tile sizes (tq <= 64, tk <= 32; multiples of 8 with mma)
  int mma;        // products on the FP64 tensor cores (MmaProducts) instead of fma chains
  int frag;       // Stride's mma fragment strides (where they cost no tile size), else odd ones
  int k_buffers;  // DqKernel: 2 when its shared memory holds two K tiles (prefetch), else 1
  int m16;        // MmaProducts in blocks of 16 x 8 x 8 where the rows allow (sm_90), else
                  // 8 x 8 x 4
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
  unsigned long long order_timeouts;  // fused dQ blocks that gave up waiting (AwaitTurn)
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

// The shared-memory row stride of a tile of `width` doubles. Shared memory has 32 banks of 4
// bytes, so a double at index x sits in bank pair x mod 16, and a warp's 8-byte loads are served
// half a warp at a time (CUDA C++ Programming Guide, "Shared Memory" of compute capability 5.x
// and later). The fma path's loops read a column of a tile across the lanes (row stride apart):
// an odd stride puts 16 consecutive rows in 16 different bank pairs. The mma path reads
// fragments: lane (g, t) reads element (g, t) of an 8 x 4 block (MmaProduct), at g * stride + t
// or t * stride + g; with stride = 4 (mod 8), each half-warp's 16 lanes hit 16 different bank
// pairs (4g + t or 4t + g, mod 16, over g < 4 or g >= 4 and t < 4). frag (Dev::frag): the
// latter; the host takes them with mma unless their padding would force a smaller tile.
__host__ __device__ int64_t Stride(int64_t width, int frag) {
  return frag ? width + (12 - width % 8) % 8 : width + 1;
}

// One step of Sum2's combination of two (sum, compensation) pairs: TwoSum of the sums, the
// compensations and the TwoSum error added into comp.
__device__ void Sum2Combine(double& sum, double& comp, double s2, double c2) {
  const double t = sum + s2;
  const double bp = t - sum;
  const double e = (sum - (t - bp)) + (s2 - bp);
  sum = t;
  comp = (comp + c2) + e;
}

// Warp reductions (all lanes get the result), of N independent values side by side (one value
// per row of the online softmax: their shuffles overlap).
template <int N>
__device__ void WarpMax(double (&x)[N]) {
  for (int o = 16; o > 0; o >>= 1) {
    ATTEST_UNROLL
    for (int u = 0; u < N; ++u) x[u] = fmax(x[u], __shfl_xor_sync(0xffffffffu, x[u], o));
  }
}
// Compensated sum over the warp: a TwoSum tree carrying each addition's exact error (Sum2's
// bound in tree order; Ogita, Rump, Oishi, "Accurate sum and dot product", SIAM J. Sci.
// Comput. 26(6), 2005). TwoSum is symmetric, so every lane ends with the same (sum, comp).
template <int N>
__device__ void WarpSum2(double (&sum)[N], double (&comp)[N]) {
  for (int o = 16; o > 0; o >>= 1) {
    double s2[N], c2[N];
    ATTEST_UNROLL
    for (int u = 0; u < N; ++u) {
      s2[u] = __shfl_xor_sync(0xffffffffu, sum[u], o);
      c2[u] = __shfl_xor_sync(0xffffffffu, comp[u], o);
    }
    ATTEST_UNROLL
    for (int u = 0; u < N; ++u) Sum2Combine(sum[u], comp[u], s2[u], c2[u]);
  }
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

// D = A B + C for one 16 x 8 x 8 block on the FP64 tensor cores (sm_90 and later):
// mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 (PTX ISA, "Matrix Fragments for mma.m16n8k8"
// of the .f64 type): lane (g, t) holds a[x] = A[g + 8 (x & 1)][t + 4 (x >> 1)],
// b[x] = B[t + 4 x][g] and c[x] = C[g + 8 (x >> 1)][2t + (x & 1)]. Every lane must call it.
__device__ void Mma1688(double (&c)[4], const double (&a)[4], const double (&b)[2]) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  attest_emu::Mma1688(c, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // the host sets Dev::m16 only on compute capability 9.0 and later
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#endif
}

// The two block shapes: rows (kRows) x 8 columns x k step (kStep); lane (g, t) holds A
// fragment element x at row ARow(x, g), k AK(x, t), B element x at k BK(x, t) (column g), and
// C element x at row CRow(x, g), column CCol(x, t) of the block.
struct Mma8x8x4 {
  static constexpr int kRows = 8, kStep = 4, kA = 1, kB = 1, kC = 2;
  __device__ static int ARow(int, int g) { return g; }
  __device__ static int AK(int, int t) { return t; }
  __device__ static int BK(int, int t) { return t; }
  __device__ static int CRow(int, int g) { return g; }
  __device__ static int CCol(int x, int t) { return 2 * t + x; }
  __device__ static void Run(double (&c)[kC], const double (&a)[kA], const double (&b)[kB]) {
    Mma884(c[0], c[1], a[0], b[0]);
  }
};
struct Mma16x8x8 {
  static constexpr int kRows = 16, kStep = 8, kA = 4, kB = 2, kC = 4;
  __device__ static int ARow(int x, int g) { return g + 8 * (x & 1); }
  __device__ static int AK(int x, int t) { return t + 4 * (x >> 1); }
  __device__ static int BK(int x, int t) { return t + 4 * x; }
  __device__ static int CRow(int x, int g) { return g + 8 * (x >> 1); }
  __device__ static int CCol(int x, int t) { return 2 * t + (x & 1); }
  __device__ static void Run(double (&c)[kC], const double (&a)[kA], const double (&b)[kB]) {
    Mma1688(c, a, b);
  }
};

// Operands of a tile product C = A B with k = kdim: A(i, k) = a[i * a_i + k * a_k] and
// B(k, j) = b[k * b_k + j * b_j] in shared memory.
struct MmaOperands {
  const double* a;
  int64_t a_i, a_k;
  const double* b;
  int64_t b_k, b_j, kdim;
};

// NP tile products of the same shape, m x n (m a multiple of Op::kRows), on the tensor cores in
// blocks of Op (Mma8x8x4 or Mma16x8x8): hands every element to out(i, j, v), v[x] the element
// of product x, once (columns j >= n are padding, never handed out). Each warp takes groups of
// MR x NR blocks in turn: per k step it loads MR fragments of A and NR of B per product and
// issues MR * NR independent mma per product (reuse of the fragments, and NP * MR * NR chains in
// flight instead of one). Every block's chain is the same as with one block and one product at
// a time: k steps in ascending order, each one mma (whose k products the hardware sums in an
// order it does not specify). Every thread of the block must call it; the caller synchronises
// after.
// BlockProducts' steps with (true) or without predicates, chosen at compile time.
template <bool W>
struct WholeGroup {
  static constexpr bool kWhole = W;
};

template <class Op, int MR, int NR, int NP, class Out>
__device__ void BlockProducts(int m, int64_t n, const MmaOperands (&ops)[NP], Out&& out) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int warps = static_cast<int>(blockDim.x / 32);
  const int row_blocks = m / Op::kRows, col_blocks = static_cast<int>((n + 7) / 8);
  const int row_groups = (row_blocks + MR - 1) / MR, col_groups = (col_blocks + NR - 1) / NR;
  int kfull[NP], ksteps = 0;
  int64_t oa[NP][Op::kA], ob[NP][Op::kB];  // each fragment element's offset in its block
  ATTEST_UNROLL
  for (int q = 0; q < NP; ++q) {
    kfull[q] = static_cast<int>(ops[q].kdim / Op::kStep * Op::kStep);
    ksteps = max(ksteps, kfull[q]);
    ATTEST_UNROLL
    for (int e = 0; e < Op::kA; ++e) {
      oa[q][e] = Op::ARow(e, g) * ops[q].a_i + Op::AK(e, t) * ops[q].a_k;
    }
    ATTEST_UNROLL
    for (int e = 0; e < Op::kB; ++e) ob[q][e] = Op::BK(e, t) * ops[q].b_k;
  }
  for (int grp = threadIdx.x / 32; grp < row_groups * col_groups; grp += warps) {
    const int bi = grp / col_groups * MR, bj = grp % col_groups * NR;
    const int mr = min(MR, row_blocks - bi), nr = min(NR, col_blocks - bj);  // warp-uniform
    const double* pa[NP][MR];
    const double* pb[NP][NR];
    bool bok[NR];
    ATTEST_UNROLL
    for (int y = 0; y < NR; ++y) bok[y] = 8 * (bj + y) + g < n;
    double c[NP][MR][NR][Op::kC];
    ATTEST_UNROLL
    for (int q = 0; q < NP; ++q) {
      ATTEST_UNROLL
      for (int x = 0; x < MR; ++x) pa[q][x] = ops[q].a + Op::kRows * (bi + x) * ops[q].a_i;
      ATTEST_UNROLL
      for (int y = 0; y < NR; ++y) {
        const int64_t j = bok[y] ? 8 * (bj + y) + g : 0;
        pb[q][y] = ops[q].b + j * ops[q].b_j;
      }
      ATTEST_UNROLL
      for (int x = 0; x < MR; ++x) {
        ATTEST_UNROLL
        for (int y = 0; y < NR; ++y) {
          ATTEST_UNROLL
          for (int e = 0; e < Op::kC; ++e) c[q][x][y][e] = 0;
        }
      }
    }
    // One k step of product q from k0; tail: only k < kdim is read (the rest is zero); whole
    // (WholeGroup<true>): every block of the group lies inside the tile, so no predicate is
    // compiled in and the loads of the next steps are issued while the mma run.
    auto step = [&](int q, int64_t k0, bool tail, auto group) {
      constexpr bool whole = decltype(group)::kWhole;
      double av[MR][Op::kA], bv[NR][Op::kB];
      ATTEST_UNROLL
      for (int x = 0; x < MR; ++x) {
        ATTEST_UNROLL
        for (int e = 0; e < Op::kA; ++e) {
          const bool ok = whole || (x < mr && (!tail || k0 + Op::AK(e, t) < ops[q].kdim));
          av[x][e] = ok ? pa[q][x][k0 * ops[q].a_k + oa[q][e]] : 0.0;
        }
      }
      ATTEST_UNROLL
      for (int y = 0; y < NR; ++y) {
        ATTEST_UNROLL
        for (int e = 0; e < Op::kB; ++e) {
          const bool ok =
              whole || (y < nr && bok[y] && (!tail || k0 + Op::BK(e, t) < ops[q].kdim));
          bv[y][e] = ok ? pb[q][y][k0 * ops[q].b_k + ob[q][e]] : 0.0;
        }
      }
      ATTEST_UNROLL
      for (int x = 0; x < MR; ++x) {
        ATTEST_UNROLL
        for (int y = 0; y < NR; ++y) {
          if (whole || (x < mr && y < nr)) Op::Run(c[q][x][y], av[x], bv[y]);
        }
      }
    };
    if (mr == MR && nr == NR && 8 * (bj + NR) <= n) {  // a whole group (warp-uniform)
      int kcommon = ksteps;
      ATTEST_UNROLL
      for (int q = 0; q < NP; ++q) kcommon = min(kcommon, kfull[q]);
      ATTEST_UNROLL_BY_4
      for (int k0 = 0; k0 < kcommon; k0 += Op::kStep) {
        ATTEST_UNROLL
        for (int q = 0; q < NP; ++q) step(q, k0, false, WholeGroup<true>{});
      }
      ATTEST_UNROLL
      for (int q = 0; q < NP; ++q) {
        for (int k0 = kcommon; k0 < kfull[q]; k0 += Op::kStep) {
          step(q, k0, false, WholeGroup<true>{});
        }
      }
    } else {
      ATTEST_UNROLL_BY_2
      for (int k0 = 0; k0 < ksteps; k0 += Op::kStep) {
        ATTEST_UNROLL
        for (int q = 0; q < NP; ++q) {
          if (k0 < kfull[q]) step(q, k0, false, WholeGroup<false>{});
        }
      }
    }
    ATTEST_UNROLL
    for (int q = 0; q < NP; ++q) {
      if (kfull[q] < ops[q].kdim) step(q, kfull[q], true, WholeGroup<false>{});
    }
    ATTEST_UNROLL
    for (int x = 0; x < MR; ++x) {
      ATTEST_UNROLL
      for (int y = 0; y < NR; ++y) {
        if (x < mr && y < nr) {
          ATTEST_UNROLL
          for (int e = 0; e < Op::kC; ++e) {
            const int64_t i = Op::kRows * (bi + x) + Op::CRow(e, g);
            const int64_t j = 8 * (bj + y) + Op::CCol(e, t);
            double v[NP];
            ATTEST_UNROLL
            for (int q = 0; q < NP; ++q) v[q] = c[q][x][y][e];
            if (j < n) out(i, j, v);
          }
        }
      }
    }
  }
}

// BlockProducts in blocks of 8 x 8 x 4 (groups of MR x NR), or, with m16 and m a multiple of
// 16, of 16 x 8 x 8 with the same outputs per group (MR / 2 x NR, or 1 x NR / 2 when MR = 1).
template <int MR, int NR, int NP, class Out>
__device__ void MmaProducts(bool m16, int m, int64_t n, const MmaOperands (&ops)[NP], Out&& out) {
  if (m16 && m % 16 == 0) {
    constexpr int mr = MR >= 2 ? MR / 2 : 1, nr = MR >= 2 ? NR : (NR >= 2 ? NR / 2 : 1);
    BlockProducts<Mma16x8x8, mr, nr>(m, n, ops, out);
  } else {
    BlockProducts<Mma8x8x4, MR, NR>(m, n, ops, out);
  }
}

// One tile product C = A B (m x n; k = kdim), as MmaProducts: out(i, j, value).
template <int MR, int NR, class Out>
__device__ void MmaProduct(bool m16, int m, int64_t n, int64_t kdim, const double* a,
                           int64_t a_i, int64_t a_k, const double* b, int64_t b_k, int64_t b_j,
                           Out&& out) {
  const MmaOperands ops[1] = {{a, a_i, a_k, b, b_k, b_j, kdim}};
  MmaProducts<MR, NR>(m16, m, n, ops,
                      [&](int64_t i, int64_t j, const double* v) { out(i, j, v[0]); });
}

// Row bounds of query rows [i0, i0 + tq) into lo/hi (tile rows past the sequence: empty), by
// warp 0; into range (every thread's own copy: each warp computes the rows' bounds and reduces
// them by shuffles): [0], [1] the union of the rows' bounds, [2] the largest lo and [3] the
// smallest hi over all tq rows (WholeTile's test). Begins and ends with __syncthreads().
__device__ void TileRowBounds(const Dev& p, const Seq& s, int64_t i0, int64_t* lo, int64_t* hi,
                              int64_t* range) {
  __syncthreads();  // lo and hi may still be read for the previous tile
  long long a = s.k_len, z = 0, lo_max = 0, hi_min = s.k_len;
  for (int r = threadIdx.x % 32; r < p.tq; r += 32) {
    int64_t x = 0, y = 0;
    if (i0 + r < s.q_len) KeyBounds(p, s, i0 + r, &x, &y);
    if (threadIdx.x < 32) {
      lo[r] = x;
      hi[r] = y;
    }
    if (x < y) {
      a = min(a, static_cast<long long>(x));
      z = max(z, static_cast<long long>(y));
    }
    lo_max = max(lo_max, static_cast<long long>(x));
    hi_min = min(hi_min, static_cast<long long>(y));
  }
  for (int o = 16; o > 0; o >>= 1) {
    a = min(a, __shfl_xor_sync(0xffffffffu, a, o));
    z = max(z, __shfl_xor_sync(0xffffffffu, z, o));
    lo_max = max(lo_max, __shfl_xor_sync(0xffffffffu, lo_max, o));
    hi_min = min(hi_min, __shfl_xor_sync(0xffffffffu, hi_min, o));
  }
  range[0] = a;
  range[1] = z;
  range[2] = lo_max;
  range[3] = hi_min;
  __syncthreads();
}

// TileWalk::MaySee after TileRowBounds (lo, hi in shared memory): some row of the tile may see
// some key of [j0, j0 + nk). Each lane takes rows of the tile and the warp votes: every lane of
// every warp gets the answer.
__device__ bool MaySee(const Dev& p, const int64_t* lo, const int64_t* hi, int64_t j0,
                       int64_t nk) {
  bool any = false;
  for (int r = threadIdx.x % 32; r < p.tq; r += 32) {
    any = any || (lo[r] < hi[r] && lo[r] < j0 + nk && hi[r] > j0);
  }
  return __ballot_sync(0xffffffffu, any) != 0;
}

// The same answer as MaySee after TileRowBounds(i0), without shared memory or barriers: each
// lane takes rows of the query tile, and the warp votes (every lane of every warp gets it).
__device__ bool QueryTileMaySee(const Dev& p, const Seq& s, int64_t i0, int64_t j0,
                                int64_t nk) {
  // Without a band or prefix every row has the bounds [0, k_len): the tile's first row sees
  // [j0, j0 + nk) when it exists (0 <= j0 < k_len and nk > 0 for the callers' key tiles).
  if (p.left < 0 && p.right < 0 && p.prefix <= 0) return i0 < s.q_len;
  bool any = false;
  for (int r = threadIdx.x % 32; r < p.tq; r += 32) {
    if (i0 + r < s.q_len) {
      int64_t a = 0, z = 0;
      KeyBounds(p, s, i0 + r, &a, &z);
      any = any || (a < z && a < j0 + nk && z > j0);
    }
  }
  return __ballot_sync(0xffffffffu, any) != 0;
}

// One double from global to shared memory without waiting (cp.async, PTX ISA "Data Movement
// and Conversion Instructions: cp.async", sm_80 and later): copies issued by a thread since its
// last CopyCommit form a group; CopyWait<n>() waits until at most n of the thread's groups are
// pending; a __syncthreads() after it makes every thread's copies visible to the block.
__device__ void CopyAsync(double* dst, const double* src) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  attest_emu::CopyAsync(dst, src);
#else
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(to), "l"(src) : "memory");
#endif
}
// Two doubles (16 bytes, both addresses 16-byte aligned) as CopyAsync, in one copy.
__device__ void CopyAsyncPair(double* dst, const double* src) {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  attest_emu::CopyAsync(dst, src);
  attest_emu::CopyAsync(dst + 1, src + 1);
#else
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(src) : "memory");
#endif
}
__device__ void CopyCommit() {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  attest_emu::CopyCommit();
#else
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ void CopyWait() {
#ifdef ATTEST_ORACLE_CUDA_EMULATE
  attest_emu::CopyWait(N);
#else
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Rows [row0, row0 + n) of head `head` of a [rows, heads, width] tensor into a tile of
// `rows_tile` rows (row stride `stride`); rows past n are zero. A warp per row, a lane per
// column (coalesced; no division). Asynchronous (CopyAsync) for the rows read: the caller
// commits and waits.
__device__ void LoadTile(const double* x, int64_t heads, int64_t head, int64_t width,
                         int64_t stride, int64_t row0, int64_t n, int rows_tile, double* tile) {
  const int lane = threadIdx.x % 32, warps = static_cast<int>(blockDim.x / 32);
  // 16-byte copies where every row starts 16-byte aligned in both memories (even widths and
  // strides, aligned bases: the usual case), else 8-byte ones.
  const bool pairs = width % 2 == 0 && stride % 2 == 0 &&
                     (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(tile)) % 16 == 0;
  const int w = static_cast<int>(width);
  for (int r = threadIdx.x / 32; r < rows_tile; r += warps) {
    double* dst = tile + r * stride;
    if (r < n) {
      const double* src = x + ((row0 + r) * heads + head) * width;
      if (pairs) {
        for (int d = 2 * lane; d < w; d += 64) CopyAsyncPair(dst + d, src + d);
      } else {
        for (int d = lane; d < w; d += 32) CopyAsync(dst + d, src + d);
      }
    } else {
      for (int64_t d = lane; d < width; d += 32) dst[d] = 0.0;
    }
  }
}
// `count` entries of a per-(row, head) array: out[r] = x[(row0 + r) * heads + head] for r < n,
// `fill` past n (asynchronous as LoadTile).
__device__ void LoadRows(const double* x, int64_t heads, int64_t head, int64_t row0, int64_t n,
                         int count, double fill, double* out) {
  for (int r = threadIdx.x; r < count; r += blockDim.x) {
    if (r < n) {
      CopyAsync(out + r, x + (row0 + r) * heads + head);
    } else {
      out[r] = fill;
    }
  }
}

// Whether every row of the tile (query rows i0.., keys j0..; lo, hi and range of
// TileRowBounds(i0)) sees the whole tile: no documents, no block-sparse map, every key inside
// every row's band and bounds. Then Visible holds for every entry, and the callers skip it.
__device__ bool WholeTile(const Dev& p, const Seq& s, int64_t i0, int64_t j0,
                          const int64_t* range) {
  return p.doc_q == nullptr && p.blocks == nullptr && j0 + p.tk <= s.k_len && range[2] <= j0 &&
         range[3] >= j0 + p.tk && (p.left < 0 || j0 >= i0 + p.tq - 1 + s.off - p.left) &&
         (p.right < 0 || j0 + p.tk - 1 <= i0 + s.off + p.right);
}

// The transformed score of a visible entry (query row i, key j; dot = q.k): TransformScore of
// reference/problem/mask.h; t = tanh(scale q.k / cap) with softcap. Records the score magnitude
// statistic (nq, nk: the q and k norms) into `mag`.
__device__ double ScoreOf(const Dev& p, const Seq& s, int64_t i, int64_t j, double slope,
                          double dot, double nq, double nk, double& t, double& mag) {
  double sc = p.scale * dot;
  if (p.softcap > 0) {
    t = tanh(sc / p.softcap);
    sc = p.softcap * t;
  }
  const int64_t diag = i + s.off;
  const int64_t dist = diag > j ? diag - j : j - diag;
  if (slope != 0) sc -= slope * static_cast<double>(dist);
  mag = fmax(mag, fabs(p.scale) * nq * nk + fabs(slope) * static_cast<double>(dist));
  return sc;
}

// Transformed, masked scores of the tile (query rows i0.., keys j0.. of sequence s, query head
// h): s_rc = TransformScore(scale q.k) where Visible, -inf elsewhere (reference/problem/mask.h);
// th_rc = tanh(scale q.k / cap) with softcap (th may be null). rn and cn: the tile's q and k
// norms (for the score magnitude statistic of every visible entry, into the thread's `mag`).
// lo, hi and range: TileRowBounds(i0). Ends with __syncthreads().
__device__ void Scores(const Dev& p, const Seq& s, int64_t h, int64_t i0, int64_t j0,
                       const int64_t* lo, const int64_t* hi, const int64_t* range,
                       const double* sq_tile, const double* sk_tile, const double* rn,
                       const double* cn, double* ss, double* th, double& mag) {
  const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;
  const int64_t sd = Stride(p.d, p.frag), st = Stride(p.tk, p.frag);
  const bool whole = WholeTile(p, s, i0, j0, range);
  auto visible = [&](int64_t r, int64_t c) {
    const int64_t j = j0 + c;
    return whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i0 + r, j));
  };
  // Entry (r, c) from its dot product q.k (by one thread).
  auto entry = [&](int64_t r, int64_t c, double dot, bool vis) {
    double sc = -INFINITY, t = 0;
    if (vis) sc = ScoreOf(p, s, i0 + r, j0 + c, slope, dot, rn[r], cn[c], t, mag);
    ss[r * st + c] = sc;
    if (th != nullptr) th[r * st + c] = t;
  };
  if (p.mma) {  // Q K^T, each entry in the product's epilogue (2 x 2 blocks per warp if tq >= 64)
    auto out = [&](int64_t r, int64_t c, double dot) { entry(r, c, dot, visible(r, c)); };
    if (p.tq >= 64) {
      MmaProduct<2, 2>(p.m16, p.tq, p.tk, p.d, sq_tile, sd, 1, sk_tile, 1, sd, out);
    } else {
      MmaProduct<1, 2>(p.m16, p.tq, p.tk, p.d, sq_tile, sd, 1, sk_tile, 1, sd, out);
    }
  } else {
    const int lane = threadIdx.x % 32, warps = static_cast<int>(blockDim.x / 32);
    for (int r = threadIdx.x / 32; r < p.tq; r += warps) {
      for (int c = lane; c < p.tk; c += 32) {
        const bool vis = visible(r, c);
        double dot = 0;
        if (vis) {
          const double* qr = sq_tile + r * sd;
          const double* kr = sk_tile + c * sd;
          for (int64_t d = 0; d < p.d; ++d) dot = fma(qr[d], kr[d], dot);
        }
        entry(r, c, dot, vis);
      }
    }
  }
  __syncthreads();
}

// The backward's scores and gradients of the tile on the mma path, in one pass: S = Q K^T and
// dP = dO V^T as two products side by side (MmaProducts), and in their epilogue, per entry by
// the lane that holds it, what Scores and then BackwardTile compute: s (ScoreOf) where
// Visible, P = exp(s - lse) and dS = P (dP - delta) [(1 - t^2) with softcap] where s > -inf,
// else P = -0.0 and dS = 0, into ss and ds. P >= +0 where s > -inf, so the sign bit of P tells
// which entries count (DkDvKernel's per-key counts), and -0.0 adds nothing to a product or a sum
// that +0.0 would not (x + -0 = x for every x, +0 + -0 = +0 when rounding to nearest; IEEE
// 754-2019, 6.3). Ends with __syncthreads().
__device__ void ScoresBackwardMma(const Dev& p, const Seq& s, int64_t h, int64_t i0,
                                  int64_t j0, const int64_t* lo, const int64_t* hi,
                                  const int64_t* range, const double* sq_tile,
                                  const double* sk_tile, const double* sdo_tile,
                                  const double* sv_tile, const double* rn, const double* cn,
                                  const double* row_lse, const double* row_delta, double* ss,
                                  double* ds, double& mag) {
  const double slope = p.slopes != nullptr ? p.slopes[h] : 0.0;
  const int64_t sd = Stride(p.d, p.frag), sdv = Stride(p.dv, p.frag), st = Stride(p.tk, p.frag);
  const bool whole = WholeTile(p, s, i0, j0, range);
  const MmaOperands ops[2] = {{sq_tile, sd, 1, sk_tile, 1, sd, p.d},
                              {sdo_tile, sdv, 1, sv_tile, 1, sdv, p.dv}};
  MmaProducts<1, 2>(p.m16, p.tq, p.tk, ops, [&](int64_t r, int64_t c, const double* v) {
    const int64_t i = i0 + r, j = j0 + c;
    double pr = -0.0, dsv = 0;
    if (whole || (j >= lo[r] && j < hi[r] && Visible(p, s, i, j))) {
      double t = 0;
      const double sc = ScoreOf(p, s, i, j, slope, v[0], rn[r], cn[c], t, mag);
      if (sc > -INFINITY) {
        pr = exp(sc - row_lse[r]);
        dsv = pr * (v[1] - row_delta[r]);
        if (p.softcap > 0 && pr != 0.0) dsv *= 1.0 - t * t;
      }
    }
    ss[r * st + c] = pr;
    ds[r * st + c] = dsv;
  });
  __syncthreads();
}

}  // namespace
