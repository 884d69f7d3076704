// The subset of CUDA that oracle_cuda.cu uses, emulated on the CPU, so that the kernels and the
// host code around them run (and are tested) on a machine without a GPU: compiled with a C++
// compiler and -DATTEST_ORACLE_CUDA_EMULATE, oracle_cuda.cu becomes
// libattest_oracle_cuda_emulated.so with the same C interface (oracle_cuda.h).
//
// A launch runs the grid's blocks one after another, each thread of a block a fiber (a stack of
// its own, switched with swapcontext) on the calling thread: a thread runs until it reaches a
// barrier (__syncthreads, or a warp primitive: __shfl_xor_sync of double and long long,
// __ballot_sync, __syncwarp, the mma fragments' exchange), then the next thread in index order
// runs. So a run does not depend on the OS scheduler or on what else the machine runs (OS
// threads meeting at a std::barrier per warp primitive took 15 s alone and 546 s beside a
// compile on a 2-core machine), and is the same every time. cp.async copies wait in a
// per-thread queue (CopyAsync below). A kernel whose threads reach a different number of
// barriers (undefined on a GPU) stops the process with a message.
// "Device" memory is host memory filled with 0xff bytes (NaN doubles) on allocation, and shared
// memory is NaN at the start of each block, so that a read before a write shows in the outputs.
// Not emulated: timing (events measure nothing), cuBLAS, streams, and any memory model weaker
// than the barriers' (the emulation is sequentially consistent where a GPU need not be).
#pragma once

#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define ATTEST_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTEST_EMU_ASAN 1
#endif
#endif
#ifdef ATTEST_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace attest_emu {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "oracle_cuda CPU emulation: %s\n", what);
  std::abort();
}

// cp.async (oracle_cuda_device.cuh's CopyAsync, CopyCommit, CopyWait) per thread: a copy is
// queued and done when a CopyWait lets fewer groups than its own stay pending, so a kernel that
// reads a tile before waiting for it reads what was there before (NaN, or the previous tile),
// as the GPU may.
struct PendingCopy {
  double* dst;
  const double* src;
};

// One thread of the block: its context, its stack (a guard page below it) and its copy queue.
struct Fiber {
  ucontext_t context;
  char* stack = nullptr;  // the usable stack, above the guard page
  size_t stack_bytes = 0;
  void* asan_fake_stack = nullptr;
  bool done = false;
  std::vector<std::vector<PendingCopy>> copy_groups;  // committed, oldest first
  std::vector<PendingCopy> copy_open;                 // not yet committed
};

// One launch at a time in the process (the state below is the launch's).
inline std::mutex launch_mutex;
inline Index thread_index;  // the running thread's
inline unsigned current = 0;
inline Index block_index;  // one block at a time
inline Index block_dim;
inline std::vector<std::unique_ptr<Fiber>> fibers;
inline ucontext_t host_context;
inline void* host_fake_stack = nullptr;
inline const void* host_stack = nullptr;
inline size_t host_stack_bytes = 0;
inline std::function<void()> fiber_body;
// Yields since a thread last arrived at a barrier or ended: past 2 per thread, every thread is
// waiting for one that never comes.
inline size_t idle_yields = 0;
inline std::vector<double> warp_doubles;
inline std::vector<double> warp_fragments;  // the mma fragments, 6 a thread
inline std::vector<long long> warp_ints;
inline std::vector<unsigned> warp_flags;
inline std::vector<double> dynamic_shared;
inline std::mutex atomic_mutex;

inline Fiber& Me() { return *fibers[current]; }

// Switches from the running fiber (or the host, from == nullptr) to fiber `to` (or the host,
// to == nullptr); `from_ends` when the running fiber never runs again. AddressSanitizer is told
// of each switch (sanitizer/common_interface_defs.h: __sanitizer_start_switch_fiber).
inline void Switch(Fiber* from, Fiber* to, bool from_ends = false) {
  void** save = from == nullptr ? &host_fake_stack : &from->asan_fake_stack;
#ifdef ATTEST_EMU_ASAN
  __sanitizer_start_switch_fiber(from_ends ? nullptr : save,
                                 to == nullptr ? host_stack : to->stack,
                                 to == nullptr ? host_stack_bytes : to->stack_bytes);
#endif
  ucontext_t* from_context = from == nullptr ? &host_context : &from->context;
  if (swapcontext(from_context, to == nullptr ? &host_context : &to->context) != 0) {
    Fail("swapcontext failed");
  }
#ifdef ATTEST_EMU_ASAN
  __sanitizer_finish_switch_fiber(*save, nullptr, nullptr);
#else
  (void)save;
  (void)from_ends;
#endif
}

// The next thread after the running one, in index order, that has not ended (or none).
inline Fiber* NextLive() {
  const size_t n = fibers.size();
  for (size_t i = 1; i <= n; ++i) {
    const size_t at = (current + i) % n;
    if (!fibers[at]->done) {
      current = static_cast<unsigned>(at);
      thread_index = {current, 0, 0};
      return fibers[at].get();
    }
  }
  return nullptr;
}

inline void Yield() {
  if (++idle_yields > 2 * fibers.size() + 2) {
    Fail("deadlock: the threads of a block wait at different barriers");
  }
  Fiber* me = &Me();
  Fiber* next = NextLive();
  if (next != me) Switch(me, next);
}

// A barrier over `count` threads: the last to arrive goes on; the others wait for it.
class Barrier {
 public:
  explicit Barrier(unsigned count = 1) : count_(count) {}
  void ArriveAndWait() {
    idle_yields = 0;
    const unsigned long long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      return;
    }
    while (generation_ == generation) Yield();
  }

 private:
  unsigned count_;
  unsigned arrived_ = 0;
  unsigned long long generation_ = 0;
};
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;

inline unsigned Lane() { return thread_index.x % 32; }
inline unsigned WarpBase() { return thread_index.x / 32 * 32; }
inline Barrier& WarpBarrier() { return warp_barriers[thread_index.x / 32]; }

inline void CopyAsync(double* dst, const double* src) { Me().copy_open.push_back({dst, src}); }
inline void CopyCommit() {
  Fiber& me = Me();
  me.copy_groups.push_back(std::move(me.copy_open));
  me.copy_open.clear();
}
inline void CopyWait(int pending) {
  // cp.async.wait_group n: all but the newest n committed groups are complete (copies not yet
  // committed belong to no group and are not waited for).
  Fiber& me = Me();
  while (static_cast<int>(me.copy_groups.size()) > pending) {
    for (const PendingCopy& c : me.copy_groups.front()) *c.dst = *c.src;
    me.copy_groups.erase(me.copy_groups.begin());
  }
}

// A fiber's first and only frame: the launch's body, then on to the next live thread, or back
// to the host after the last.
inline void FiberMain() {
#ifdef ATTEST_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  fiber_body();
  Fiber* me = &Me();
  me->done = true;
  idle_yields = 0;
  Fiber* next = NextLive();
  Switch(me, next, true);
  Fail("a thread that ended was resumed");
}

// A thread's stack: the kernels' deepest use measured 15 KiB (11 KiB under AddressSanitizer,
// whose swapcontext interceptor clears the shadow of the whole stack at every switch: 2 minutes
// for the ctest problems with 1 MiB stacks, 10 s with these). The guard page below turns an
// overflow into a fault.
constexpr size_t kStackBytes = size_t{64} << 10;

// Fibers (stacks kept from launch to launch) for `block` threads, each about to enter FiberMain.
inline void MakeFibers(unsigned block) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (fibers.size() < block) {
    auto f = std::make_unique<Fiber>();
    void* map = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (map == MAP_FAILED) Fail("mmap of a thread's stack failed");
    if (mprotect(map, page, PROT_NONE) != 0) Fail("mprotect of a stack's guard page failed");
    f->stack = static_cast<char*>(map) + page;
    f->stack_bytes = kStackBytes;
    fibers.push_back(std::move(f));
  }
  while (fibers.size() > block) {
    Fiber& f = *fibers.back();
    munmap(f.stack - page, f.stack_bytes + page);
    fibers.pop_back();
  }
  for (auto& f : fibers) {
    if (getcontext(&f->context) != 0) Fail("getcontext failed");
    f->context.uc_stack.ss_sp = f->stack;
    f->context.uc_stack.ss_size = f->stack_bytes;
    f->context.uc_link = nullptr;
    makecontext(&f->context, &FiberMain, 0);
    f->done = false;
    f->asan_fake_stack = nullptr;
    f->copy_groups.clear();
    f->copy_open.clear();
  }
}

template <class... P, class... A>
void Launch(void (*kernel)(P...), dim3 grid, unsigned block, size_t shared, A... args) {
  if (block == 0 || block % 32 != 0) std::abort();  // the kernels assume whole warps
  std::lock_guard<std::mutex> lock(launch_mutex);
  dynamic_shared.assign(shared / sizeof(double) + 1, std::numeric_limits<double>::quiet_NaN());
  block_dim = {block, 1, 1};
  warp_doubles.assign(block, 0.0);
  warp_fragments.assign(6 * size_t{block}, 0.0);
  warp_ints.assign(block, 0);
  warp_flags.assign(block, 0);
  block_barrier = Barrier(block);
  warp_barriers.assign(block / 32, Barrier(32));
  // Every thread runs the whole grid; thread 0 sets up each block between two barriers (NaN
  // shared memory, the block index).
  const unsigned blocks = grid.x * grid.y * grid.z;
  fiber_body = [&] {
    const unsigned t = thread_index.x;
    for (unsigned n = 0; n < blocks; ++n) {
      if (t == 0) {
        block_index = {n % grid.x, n / grid.x % grid.y, n / grid.x / grid.y};
        std::fill(dynamic_shared.begin(), dynamic_shared.end(),
                  std::numeric_limits<double>::quiet_NaN());
      }
      block_barrier.ArriveAndWait();
      kernel(args...);
      Fiber& me = Me();
      if (!me.copy_groups.empty() || !me.copy_open.empty()) Fail("a copy never waited for");
      block_barrier.ArriveAndWait();
    }
  };
  MakeFibers(block);
#ifdef ATTEST_EMU_ASAN
  {
    // The host's stack, for the switches back to it (AddressSanitizer asks for its bounds).
    pthread_attr_t attr;
    void* base = nullptr;
    size_t bytes = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstack(&attr, &base, &bytes);
      pthread_attr_destroy(&attr);
    }
    host_stack = base;
    host_stack_bytes = bytes;
  }
#endif
  current = 0;
  thread_index = {0, 0, 0};
  idle_yields = 0;
  Switch(nullptr, fibers[0].get());  // back here when every thread has ended
  fiber_body = nullptr;
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

inline void __syncthreads() { attest_emu::block_barrier.ArriveAndWait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { attest_emu::WarpBarrier().ArriveAndWait(); }
// Memory fences: the emulation is sequentially consistent (blocks run one after another).
inline void __threadfence() {}
inline double __shfl_xor_sync(unsigned, double v, int lane_mask) {
  using namespace attest_emu;
  warp_doubles[thread_index.x] = v;
  WarpBarrier().ArriveAndWait();
  const double r = warp_doubles[WarpBase() + (Lane() ^ static_cast<unsigned>(lane_mask))];
  WarpBarrier().ArriveAndWait();
  return r;
}
inline long long __shfl_xor_sync(unsigned, long long v, int lane_mask) {
  using namespace attest_emu;
  warp_ints[thread_index.x] = v;
  WarpBarrier().ArriveAndWait();
  const long long r = warp_ints[WarpBase() + (Lane() ^ static_cast<unsigned>(lane_mask))];
  WarpBarrier().ArriveAndWait();
  return r;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  using namespace attest_emu;
  warp_flags[thread_index.x] = pred ? 1u : 0u;
  WarpBarrier().ArriveAndWait();
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= warp_flags[WarpBase() + l] << l;
  WarpBarrier().ArriveAndWait();
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
  cudaDevAttrComputeCapabilityMinor = 76,
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
  // ATTEST_ORACLE_CUDA_EMULATE_CC="M.m" stands for another GPU's compute capability (tests of
  // attest_oracle_cuda_device_count's refusal of an older GPU).
  int major = 9, minor = 0;
  if (const char* cc = std::getenv("ATTEST_ORACLE_CUDA_EMULATE_CC"); cc != nullptr) {
    std::sscanf(cc, "%d.%d", &major, &minor);
  }
  *value = attr == cudaDevAttrComputeCapabilityMajor   ? major
           : attr == cudaDevAttrComputeCapabilityMinor ? minor
                                                       : 232448;
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
  // Both fragments of every lane in one exchange (two barriers).
  warp_fragments[2 * thread_index.x] = a;
  warp_fragments[2 * thread_index.x + 1] = b;
  WarpBarrier().ArriveAndWait();
  double as[32], bs[32];
  for (unsigned l = 0; l < 32; ++l) {
    as[l] = warp_fragments[2 * (WarpBase() + l)];
    bs[l] = warp_fragments[2 * (WarpBase() + l) + 1];
  }
  WarpBarrier().ArriveAndWait();
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
  // All six fragments of every lane in one exchange (two barriers).
  double* mine = &warp_fragments[6 * thread_index.x];
  for (int x = 0; x < 4; ++x) mine[x] = a[x];
  for (int x = 0; x < 2; ++x) mine[4 + x] = b[x];
  WarpBarrier().ArriveAndWait();
  double as[4][32], bs[2][32];
  for (unsigned l = 0; l < 32; ++l) {
    const double* theirs = &warp_fragments[6 * (WarpBase() + l)];
    for (int x = 0; x < 4; ++x) as[x][l] = theirs[x];
    for (int x = 0; x < 2; ++x) bs[x][l] = theirs[4 + x];
  }
  WarpBarrier().ArriveAndWait();
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
