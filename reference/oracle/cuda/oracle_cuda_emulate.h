// The subset of CUDA that oracle_cuda.cu uses, emulated on CPU threads, so that the kernels
// and the host code around them run (and are tested) on a machine without a GPU: compiled
// with a C++ compiler and -DATTEST_ORACLE_CUDA_EMULATE, oracle_cuda.cu becomes
// libattest_oracle_cuda_emulated.so with the same C interface (oracle_cuda.h).
//
// A launch runs the grid's blocks one after another on one set of std::threads (one per thread
// of a block), so __syncthreads is a std::barrier over the block and the warp primitives
// (__shfl_xor_sync of double and long long, __ballot_sync, __syncwarp) exchange values through
// a per-warp std::barrier; cp.async copies wait in a per-thread queue (CopyAsync below). A
// kernel whose threads reach a different number of barriers deadlocks here (it is undefined on
// a GPU).
// "Device" memory is host memory filled with 0xff bytes (NaN doubles) on allocation, and shared
// memory is NaN at the start of each block, so that a read before a write shows in the outputs.
// Not emulated: timing (events measure nothing), cuBLAS, streams, and any memory model weaker
// than the barriers' (the emulation is sequentially consistent where a GPU need not be).
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace attest_emu {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

inline thread_local Index thread_index;
inline Index block_index;  // one block at a time: read-only while its threads run
inline Index block_dim;
inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<double> warp_doubles;
inline std::vector<long long> warp_ints;
inline std::vector<unsigned> warp_flags;
inline std::vector<double> dynamic_shared;
inline std::mutex atomic_mutex;

inline unsigned Lane() { return thread_index.x % 32; }
inline unsigned WarpBase() { return thread_index.x / 32 * 32; }
inline std::barrier<>& WarpBarrier() { return *warp_barriers[thread_index.x / 32]; }

// cp.async (oracle_cuda_device.cuh's CopyAsync, CopyCommit, CopyWait) per thread: a copy is
// queued and done when a CopyWait lets fewer groups than its own stay pending, so a kernel that
// reads a tile before waiting for it reads what was there before (NaN, or the previous tile),
// as the GPU may.
struct PendingCopy {
  double* dst;
  const double* src;
};
inline thread_local std::vector<std::vector<PendingCopy>> copy_groups;  // committed, oldest first
inline thread_local std::vector<PendingCopy> copy_open;                // not yet committed

inline void CopyAsync(double* dst, const double* src) { copy_open.push_back({dst, src}); }
inline void CopyCommit() {
  copy_groups.push_back(std::move(copy_open));
  copy_open.clear();
}
inline void CopyWait(int pending) {
  // cp.async.wait_group n: all but the newest n committed groups are complete (copies not yet
  // committed belong to no group and are not waited for).
  while (static_cast<int>(copy_groups.size()) > pending) {
    for (const PendingCopy& c : copy_groups.front()) *c.dst = *c.src;
    copy_groups.erase(copy_groups.begin());
  }
}

template <class... P, class... A>
void Launch(void (*kernel)(P...), dim3 grid, unsigned block, size_t shared, A... args) {
  if (block == 0 || block % 32 != 0) std::abort();  // the kernels assume whole warps
  dynamic_shared.assign(shared / sizeof(double) + 1, std::numeric_limits<double>::quiet_NaN());
  block_dim = {block, 1, 1};
  warp_doubles.assign(block, 0.0);
  warp_ints.assign(block, 0);
  warp_flags.assign(block, 0);
  block_barrier = std::make_unique<std::barrier<>>(static_cast<std::ptrdiff_t>(block));
  warp_barriers.clear();
  for (unsigned w = 0; w < block / 32; ++w) {
    warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
  }
  // One thread per block thread for the whole grid; thread 0 sets up each block between two
  // barriers (NaN shared memory, the block index).
  const unsigned blocks = grid.x * grid.y * grid.z;
  std::vector<std::thread> threads;
  threads.reserve(block);
  for (unsigned t = 0; t < block; ++t) {
    threads.emplace_back([=] {
      thread_index = {t, 0, 0};
      for (unsigned n = 0; n < blocks; ++n) {
        if (t == 0) {
          block_index = {n % grid.x, n / grid.x % grid.y, n / grid.x / grid.y};
          std::fill(dynamic_shared.begin(), dynamic_shared.end(),
                    std::numeric_limits<double>::quiet_NaN());
        }
        block_barrier->arrive_and_wait();
        kernel(args...);
        if (!copy_groups.empty() || !copy_open.empty()) std::abort();  // a copy never waited for
        block_barrier->arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
}


}  // namespace attest_emu

#define threadIdx (attest_emu::thread_index)
#define blockIdx (attest_emu::block_index)
#define blockDim (attest_emu::block_dim)
#define ATTEST_LAUNCH(kernel, grid, block, shared, ...) \
  attest_emu::Launch(kernel, dim3(grid), static_cast<unsigned>(block), (shared), __VA_ARGS__)
#define ATTEST_DYNAMIC_SHARED(name) double* name = attest_emu::dynamic_shared.data()

using std::max;
using std::min;
using std::signbit;

inline void __syncthreads() { attest_emu::block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { attest_emu::WarpBarrier().arrive_and_wait(); }
// Memory fences: the emulation is sequentially consistent (blocks run one after another).
inline void __threadfence() {}
inline double __shfl_xor_sync(unsigned, double v, int lane_mask) {
  using namespace attest_emu;
  warp_doubles[thread_index.x] = v;
  WarpBarrier().arrive_and_wait();
  const double r = warp_doubles[WarpBase() + (Lane() ^ static_cast<unsigned>(lane_mask))];
  WarpBarrier().arrive_and_wait();
  return r;
}
inline long long __shfl_xor_sync(unsigned, long long v, int lane_mask) {
  using namespace attest_emu;
  warp_ints[thread_index.x] = v;
  WarpBarrier().arrive_and_wait();
  const long long r = warp_ints[WarpBase() + (Lane() ^ static_cast<unsigned>(lane_mask))];
  WarpBarrier().arrive_and_wait();
  return r;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  using namespace attest_emu;
  warp_flags[thread_index.x] = pred ? 1u : 0u;
  WarpBarrier().arrive_and_wait();
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= warp_flags[WarpBase() + l] << l;
  WarpBarrier().arrive_and_wait();
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline long long __double_as_longlong(double x) {
  long long r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline unsigned long long atomicMax(unsigned long long* at, unsigned long long v) {
  std::lock_guard<std::mutex> lock(attest_emu::atomic_mutex);
  const unsigned long long old = *at;
  if (v > old) *at = v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* at, unsigned long long v) {
  std::lock_guard<std::mutex> lock(attest_emu::atomic_mutex);
  const unsigned long long old = *at;
  *at = old + v;
  return old;
}

// The runtime API, on host memory.
using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
using cudaEvent_t = int*;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
enum cudaDeviceAttr {
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

inline const char* cudaGetErrorName(cudaError_t e) {
  return e == 0 ? "cudaSuccess" : "cudaErrorEmulated";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == 0 ? "no error" : "an error of the CPU emulation";
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return 0;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return 0;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  // H100 / H200: compute capability 9.0, 227 KiB of shared memory per block (opt-in).
  *value = attr == cudaDevAttrComputeCapabilityMajor ? 9 : 232448;
  return 0;
}
template <class F>
cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) {
  return 0;
}
inline cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = std::malloc(bytes);
  if (*ptr == nullptr) return 2;
  std::memset(*ptr, 0xff, bytes);
  return 0;
}
inline cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return 0;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memcpy(dst, src, bytes);
  return 0;
}
inline cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  std::memset(ptr, value, bytes);
  return 0;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = nullptr;
  return 0;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, int = 0) { return 0; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return 0; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;
  return 0;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return 0; }
inline cudaError_t cudaDeviceSynchronize() { return 0; }
inline cudaError_t cudaGetLastError() { return 0; }

namespace attest_emu {

// mma.sync.aligned.m8n8k4.row.col.f64 as oracle_cuda.cu's Mma884 reads the PTX ISA's fragment
// layout (g = lane >> 2, t = lane & 3: a = A[g][t], b = B[t][g], c = C[g][2t + {0, 1}]), with
// the four products accumulated by fma in k order (the hardware's order is unspecified; the
// bound assumes none). It checks that the kernels index the fragments as that layout says,
// not that the layout is the hardware's: the device check compares with the CPU oracle there.
inline void Mma884(double& c0, double& c1, double a, double b) {
  double as[32], bs[32];
  warp_doubles[thread_index.x] = a;
  WarpBarrier().arrive_and_wait();
  for (unsigned l = 0; l < 32; ++l) as[l] = warp_doubles[WarpBase() + l];
  WarpBarrier().arrive_and_wait();
  warp_doubles[thread_index.x] = b;
  WarpBarrier().arrive_and_wait();
  for (unsigned l = 0; l < 32; ++l) bs[l] = warp_doubles[WarpBase() + l];
  WarpBarrier().arrive_and_wait();
  const unsigned g = Lane() >> 2, t = Lane() & 3;
  for (unsigned k = 0; k < 4; ++k) {
    const double av = as[g * 4 + k];                 // A[g][k]: lane g * 4 + k holds it
    c0 = std::fma(av, bs[(2 * t) * 4 + k], c0);      // B[k][2t]: lane (2t) * 4 + k
    c1 = std::fma(av, bs[(2 * t + 1) * 4 + k], c1);  // B[k][2t + 1]
  }
}


// mma.sync.aligned.m16n8k8.row.col.f64 (sm_90) as oracle_cuda.cu's Mma1688 reads its fragment
// layout (a[x] = A[g + 8 (x & 1)][t + 4 (x >> 1)], b[x] = B[t + 4 x][g],
// c[x] = C[g + 8 (x >> 1)][2t + (x & 1)]), the eight products accumulated by fma in k order;
// what it checks is what Mma884's emulation checks.
inline void Mma1688(double (&c)[4], const double (&a)[4], const double (&b)[2]) {
  double as[4][32], bs[2][32];
  for (int x = 0; x < 4; ++x) {
    warp_doubles[thread_index.x] = a[x];
    WarpBarrier().arrive_and_wait();
    for (unsigned l = 0; l < 32; ++l) as[x][l] = warp_doubles[WarpBase() + l];
    WarpBarrier().arrive_and_wait();
  }
  for (int x = 0; x < 2; ++x) {
    warp_doubles[thread_index.x] = b[x];
    WarpBarrier().arrive_and_wait();
    for (unsigned l = 0; l < 32; ++l) bs[x][l] = warp_doubles[WarpBase() + l];
    WarpBarrier().arrive_and_wait();
  }
  // A[r][k]: lane (r mod 8) * 4 + k mod 4, its element (r >= 8) + 2 (k >= 4); B[k][n]: lane
  // n * 4 + k mod 4, its element k >= 4.
  auto av = [&](unsigned r, unsigned k) {
    return as[(r >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)][(r % 8) * 4 + k % 4];
  };
  auto bv = [&](unsigned k, unsigned n) { return bs[k >= 4 ? 1 : 0][n * 4 + k % 4]; };
  const unsigned g = Lane() >> 2, t = Lane() & 3;
  for (unsigned x = 0; x < 4; ++x) {
    const unsigned r = g + 8 * (x >> 1), n = 2 * t + (x & 1);
    for (unsigned k = 0; k < 8; ++k) c[x] = std::fma(av(r, k), bv(k, n), c[x]);
  }
}

}  // namespace attest_emu
