// fp64_rates: the ceilings the CUDA float64 oracle (reference/oracle/cuda/) works against, measured
// on the GPU it runs on: the FP64 tensor-core rate of each mma.sync shape with .f64 operands
// (m8n8k4 from sm_80; m16n8k4, m16n8k8, m16n8k16 from sm_90: PTX ISA, "Warp Level Matrix Multiply-
// Accumulate Instructions: mma"), with the A and B fragments in registers (the instruction's own
// rate) and loaded from shared memory each step (one 8-byte load per fragment element, as the
// oracle's MmaProducts does); the FP64 fma rate; the rate of exp(double). Each shape's fragment
// layout is first checked against a product computed by fma on the same GPU (exit 1 if it
// differs).
//   nvcc -O3 -arch=sm_90 -o fp64_rates bench/fp64_rates.cu && ./fp64_rates
// (tools/device/pack_oracle_cuda.sh builds it, tools/device/oracle_cuda_profile.sh runs it).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                        \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

// One mma of shape M x 8 x K on f64: a[KA], b[KB] fragments, c[MC] accumulators.
template <int M, int K>
struct Shape;
template <>
struct Shape<8, 4> {
  static constexpr int KA = 1, KB = 1, MC = 2;
  static constexpr const char* name = "m8n8k4";
  __device__ static void Mma(double* c, const double* a, const double* b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a[0]), "d"(b[0]));
  }
  // Element (row, col) of A held by lane l as a[i]: returns true and sets i if so.
  __device__ static bool AHas(int l, int row, int col, int& i) {
    i = 0;
    return (l >> 2) == row && (l & 3) == col;
  }
  __device__ static bool BHas(int l, int row, int col, int& i) {
    i = 0;
    return (l & 3) == row && (l >> 2) == col;
  }
  __device__ static void CAt(int l, int i, int& row, int& col) {
    row = l >> 2;
    col = 2 * (l & 3) + i;
  }
};
// m16n8kK (K = 4, 8, 16): a[x] = A[g + 8 (x & 1)][t + 4 (x >> 1)], b[x] = B[t + 4x][g],
// c[x] = C[g + 8 (x >> 1)][2t + (x & 1)] (the layout of the tf32 shapes, which the f64 ones share
// in the PTX ISA's figures).
template <int K>
struct Shape16 {
  static constexpr int KA = K / 2, KB = K / 4, MC = 4;
  __device__ static bool AHas(int l, int row, int col, int& i) {
    const int g = l >> 2, t = l & 3;
    for (i = 0; i < KA; ++i) {
      if (g + 8 * (i & 1) == row && t + 4 * (i >> 1) == col) return true;
    }
    return false;
  }
  __device__ static bool BHas(int l, int row, int col, int& i) {
    const int g = l >> 2, t = l & 3;
    for (i = 0; i < KB; ++i) {
      if (t + 4 * i == row && g == col) return true;
    }
    return false;
  }
  __device__ static void CAt(int l, int i, int& row, int& col) {
    row = (l >> 2) + 8 * (i >> 1);
    col = 2 * (l & 3) + (i & 1);
  }
};
template <>
struct Shape<16, 4> : Shape16<4> {
  static constexpr const char* name = "m16n8k4";
  __device__ static void Mma(double* c, const double* a, const double* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(b[0]));
  }
};
template <>
struct Shape<16, 8> : Shape16<8> {
  static constexpr const char* name = "m16n8k8";
  __device__ static void Mma(double* c, const double* a, const double* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
  }
};
template <>
struct Shape<16, 16> : Shape16<16> {
  static constexpr const char* name = "m16n8k16";
  __device__ static void Mma(double* c, const double* a, const double* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
          "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
  }
};

// One warp: C = A B for A[M][K], B[K][8] of small integers (exact), against fma; mismatches
// counted into *bad.
template <int M, int K>
__global__ void LayoutKernel(int* bad) {
  using S = Shape<M, K>;
  const int l = threadIdx.x;
  double a[S::KA > 0 ? S::KA : 1], b[S::KB], c[S::MC] = {};
  auto av = [](int r, int k) { return static_cast<double>((r * 7 + k * 3) % 11 - 5); };
  auto bv = [](int k, int n) { return static_cast<double>((k * 5 + n * 13) % 9 - 4); };
  for (int r = 0; r < M; ++r) {
    for (int k = 0; k < K; ++k) {
      int i;
      if (S::AHas(l, r, k, i)) a[i] = av(r, k);
    }
  }
  for (int k = 0; k < K; ++k) {
    for (int n = 0; n < 8; ++n) {
      int i;
      if (S::BHas(l, k, n, i)) b[i] = bv(k, n);
    }
  }
  S::Mma(c, a, b);
  for (int i = 0; i < S::MC; ++i) {
    int r, n;
    S::CAt(l, i, r, n);
    double want = 0;
    for (int k = 0; k < K; ++k) want = fma(av(r, k), bv(k, n), want);
    if (c[i] != want) atomicAdd(bad, 1);
  }
}

constexpr int kChains = 8;  // independent accumulators per warp

// Fragments in registers: the instruction's rate. Eight independent chains per warp.
template <int M, int K>
__global__ void MmaRegKernel(int iters, double* sink) {
  using S = Shape<M, K>;
  double a[S::KA], b[S::KB], c[kChains][S::MC] = {};
  for (int i = 0; i < S::KA; ++i) a[i] = 1e-3 * (threadIdx.x + i);
  for (int i = 0; i < S::KB; ++i) b[i] = 1e-3 * (threadIdx.x - i);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int x = 0; x < kChains; ++x) S::Mma(c[x], a, b);
  }
  double s = 0;
  for (int x = 0; x < kChains; ++x) {
    for (int i = 0; i < S::MC; ++i) s += c[x][i];
  }
  if (s == 12345.0) *sink = s;
}

// Fragments loaded from shared memory each step (conflict-free addresses), chains as in
// MmaRegKernel: two A fragments and four B fragments per step for 2 x 4 mma (the oracle's
// MmaProducts<2, 4> reuse).
template <int M, int K>
__global__ void MmaSmemKernel(int iters, double* sink) {
  using S = Shape<M, K>;
  __shared__ double tile[8 * 32 * 16];
  for (int i = threadIdx.x; i < 8 * 32 * 16; i += blockDim.x) tile[i] = 1e-3 * i;
  __syncthreads();
  const int l = threadIdx.x % 32;
  const double* base = tile + (threadIdx.x / 32) * 32 * 16;
  double c[2][4][S::MC] = {};
  for (int it = 0; it < iters; ++it) {
    double a[2][S::KA], b[4][S::KB];
    const int off = (it & 7) * 64;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
#pragma unroll
      for (int i = 0; i < S::KA; ++i) a[x][i] = base[(off + (x * 8 + i) * 32 + l) % 512];
    }
#pragma unroll
    for (int y = 0; y < 4; ++y) {
#pragma unroll
      for (int i = 0; i < S::KB; ++i) b[y][i] = base[(off + 256 + (y * 4 + i) * 32 + l) % 512];
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
#pragma unroll
      for (int y = 0; y < 4; ++y) S::Mma(c[x][y], a[x], b[y]);
    }
  }
  double s = 0;
  for (int x = 0; x < 2; ++x) {
    for (int y = 0; y < 4; ++y) {
      for (int i = 0; i < S::MC; ++i) s += c[x][y][i];
    }
  }
  if (s == 12345.0) *sink = s;
}

__global__ void FmaKernel(int iters, double* sink) {
  double c[8];
  const double a = 1 + 1e-9 * threadIdx.x, b = 1e-9;
  for (int x = 0; x < 8; ++x) c[x] = x;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int x = 0; x < 8; ++x) c[x] = fma(c[x], a, b);
  }
  double s = 0;
  for (int x = 0; x < 8; ++x) s += c[x];
  if (s == 12345.0) *sink = s;
}

__global__ void ExpKernel(int iters, double* sink) {
  double x[4], s = 0;
  for (int u = 0; u < 4; ++u) x[u] = -1e-3 * (threadIdx.x + u);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      s += exp(x[u]);
      x[u] -= 1e-7;
    }
  }
  if (s == 12345.0) *sink = s;
}

template <class F>
double Seconds(F launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  launch();  // warm-up
  CK(cudaDeviceSynchronize());
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::fmin(best, ms * 1e-3);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return best;
}

int sms = 0;
double* sink = nullptr;

template <int M, int K>
bool Shapes() {
  using S = Shape<M, K>;
  int* bad = nullptr;
  CK(cudaMalloc(&bad, sizeof(int)));
  CK(cudaMemset(bad, 0, sizeof(int)));
  LayoutKernel<M, K><<<1, 32>>>(bad);
  CK(cudaGetLastError());
  int h = 0;
  CK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaFree(bad));
  const int iters = 4096, blocks = sms * 4, threads = 256;
  const double flops_per_step = 2.0 * M * 8 * K;
  const double warps = blocks * threads / 32.0;
  const double reg = Seconds([&] { MmaRegKernel<M, K><<<blocks, threads>>>(iters, sink); });
  const double smem = Seconds([&] { MmaSmemKernel<M, K><<<blocks, threads>>>(iters, sink); });
  const double reg_gf = warps * iters * kChains * flops_per_step / reg * 1e-9;
  const double smem_gf = warps * iters * 8 * flops_per_step / smem * 1e-9;
  std::printf("%-9s layout %-4s  registers %8.0f GFLOP/s  shared-memory fragments %8.0f GFLOP/s\n",
              S::name, h == 0 ? "ok" : "BAD", reg_gf, smem_gf);
  return h == 0;
}

int main() {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, sm_%d%d\n", prop.name, sms, prop.major, prop.minor);
  CK(cudaMalloc(&sink, sizeof(double)));
  bool ok = Shapes<8, 4>();
  ok = Shapes<16, 4>() && ok;
  ok = Shapes<16, 8>() && ok;
  ok = Shapes<16, 16>() && ok;
  const int iters = 8192, blocks = sms * 8, threads = 256;
  const double fma_s = Seconds([&] { FmaKernel<<<blocks, threads>>>(iters, sink); });
  std::printf("fma       %8.0f GFLOP/s\n",
              2.0 * blocks * threads * iters * 8 / fma_s * 1e-9);
  const double exp_s = Seconds([&] { ExpKernel<<<blocks, threads>>>(iters / 4, sink); });
  std::printf("exp       %8.1f G exp/s\n", 1.0 * blocks * threads * (iters / 4) * 4 / exp_s * 1e-9);
  return ok ? 0 : 1;
}
