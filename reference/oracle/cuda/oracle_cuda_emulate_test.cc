// The CPU emulation of CUDA (oracle_cuda_emulate.h) on which oracle_cuda_check tests the CUDA
// oracle's kernels without a GPU: the warp primitives exchange what a GPU's do, a barrier
// orders shared memory, cp.async copies land only at their wait, blocks run in index order
// with their own indices, launches from several host threads do not mix, and threads that wait
// at different barriers stop the process with a message instead of hanging.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "reference/oracle/cuda/oracle_cuda_emulate.h"

namespace {

// out[block * threads + t]: lane^1's value, lane^16's, and the ballot of odd lanes.
__global__ void WarpKernel(long long* shfl1, double* shfl16, unsigned* ballot) {
  const unsigned t = threadIdx.x;
  const unsigned at = blockIdx.x * blockDim.x + t;
  shfl1[at] = __shfl_xor_sync(0xffffffffu, static_cast<long long>(1000 * blockIdx.x + t), 1);
  shfl16[at] = __shfl_xor_sync(0xffffffffu, 0.5 * t, 16);
  ballot[at] = __ballot_sync(0xffffffffu, t % 2 == 1 && t < 40);
}

TEST(OracleCudaEmulateTest, WarpPrimitivesExchangeWithinTheWarp) {
  constexpr unsigned kBlocks = 3, kThreads = 64;
  std::vector<long long> shfl1(kBlocks * kThreads);
  std::vector<double> shfl16(kBlocks * kThreads);
  std::vector<unsigned> ballot(kBlocks * kThreads);
  ATTEST_LAUNCH(WarpKernel, kBlocks, kThreads, 0, shfl1.data(), shfl16.data(), ballot.data());
  for (unsigned b = 0; b < kBlocks; ++b) {
    for (unsigned t = 0; t < kThreads; ++t) {
      const unsigned at = b * kThreads + t;
      EXPECT_EQ(shfl1[at], 1000 * b + (t ^ 1)) << at;
      EXPECT_EQ(shfl16[at], 0.5 * (t ^ 16)) << at;
      // Warp 0: odd lanes; warp 1: odd lanes below thread 40 (lanes 1, 3, 5, 7).
      EXPECT_EQ(ballot[at], t < 32 ? 0xaaaaaaaau : 0xaau) << at;
    }
  }
}

// Each thread writes its slot, waits at the barrier, then reads its neighbour's; the dynamic
// shared memory starts NaN in every block.
__global__ void BarrierKernel(double* out, double* first) {
  ATTEST_DYNAMIC_SHARED(shared);
  const unsigned t = threadIdx.x;
  first[blockIdx.x * blockDim.x + t] = shared[t];
  __syncthreads();
  shared[t] = 10.0 * blockIdx.x + t;
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = shared[(t + 1) % blockDim.x];
}

TEST(OracleCudaEmulateTest, SyncthreadsOrdersSharedMemoryAndBlocksStartNaN) {
  constexpr unsigned kBlocks = 2, kThreads = 96;
  std::vector<double> out(kBlocks * kThreads), first(kBlocks * kThreads);
  ATTEST_LAUNCH(BarrierKernel, kBlocks, kThreads, kThreads * sizeof(double), out.data(),
                first.data());
  for (unsigned b = 0; b < kBlocks; ++b) {
    for (unsigned t = 0; t < kThreads; ++t) {
      EXPECT_EQ(out[b * kThreads + t], 10.0 * b + (t + 1) % kThreads);
      EXPECT_TRUE(std::isnan(first[b * kThreads + t]));
    }
  }
}

// A copy is queued: before its wait the destination keeps its old value.
__global__ void CopyKernel(const double* src, double* before, double* after) {
  ATTEST_DYNAMIC_SHARED(shared);
  const unsigned t = threadIdx.x;
  shared[t] = -1.0;
  attest_emu::CopyAsync(&shared[t], &src[t]);
  attest_emu::CopyCommit();
  before[t] = shared[t];
  attest_emu::CopyWait(0);
  after[t] = shared[t];
}

TEST(OracleCudaEmulateTest, AsyncCopiesLandAtTheirWait) {
  constexpr unsigned kThreads = 32;
  std::vector<double> src(kThreads), before(kThreads), after(kThreads);
  for (unsigned t = 0; t < kThreads; ++t) src[t] = t + 0.25;
  ATTEST_LAUNCH(CopyKernel, 1, kThreads, kThreads * sizeof(double), src.data(), before.data(),
                after.data());
  for (unsigned t = 0; t < kThreads; ++t) {
    EXPECT_EQ(before[t], -1.0);
    EXPECT_EQ(after[t], src[t]);
  }
}

// Blocks in index order, x fastest: each block appends its (x, y, z) to a log.
__global__ void OrderKernel(unsigned* log, unsigned* count) {
  if (threadIdx.x == 0) {
    log[*count] = blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z;
    ++*count;
  }
  __syncthreads();
}

TEST(OracleCudaEmulateTest, BlocksRunInIndexOrder) {
  std::vector<unsigned> log(12);
  unsigned count = 0;
  ATTEST_LAUNCH(OrderKernel, dim3(2, 3, 2), 32, 0, log.data(), &count);
  ASSERT_EQ(count, 12u);
  unsigned n = 0;
  for (unsigned z = 0; z < 2; ++z) {
    for (unsigned y = 0; y < 3; ++y) {
      for (unsigned x = 0; x < 2; ++x) EXPECT_EQ(log[n++], x + 10 * y + 100 * z);
    }
  }
}

TEST(OracleCudaEmulateTest, LaunchesFromSeveralHostThreadsDoNotMix) {
  constexpr unsigned kBlocks = 4, kThreads = 64;
  constexpr int kHosts = 4;
  std::vector<std::vector<double>> out(kHosts, std::vector<double>(kBlocks * kThreads));
  std::vector<std::vector<double>> first(kHosts, std::vector<double>(kBlocks * kThreads));
  std::vector<std::thread> hosts;
  for (int h = 0; h < kHosts; ++h) {
    hosts.emplace_back([&, h] {
      for (int repeat = 0; repeat < 5; ++repeat) {
        ATTEST_LAUNCH(BarrierKernel, kBlocks, kThreads, kThreads * sizeof(double),
                      out[h].data(), first[h].data());
      }
    });
  }
  for (auto& th : hosts) th.join();
  for (int h = 0; h < kHosts; ++h) {
    for (unsigned b = 0; b < kBlocks; ++b) {
      for (unsigned t = 0; t < kThreads; ++t) {
        EXPECT_EQ(out[h][b * kThreads + t], 10.0 * b + (t + 1) % kThreads);
      }
    }
  }
}

// Thread 5 waits at a second barrier that no other thread reaches (its warp mates wait at a
// shuffle): undefined on a GPU, a message and an abort here.
__global__ void MismatchedKernel(double* out) {
  if (threadIdx.x == 5) __syncthreads();
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0 * threadIdx.x, 1);
}

TEST(OracleCudaEmulateTest, ThreadsWaitingAtDifferentBarriersStopWithAMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<double> out(64);
  EXPECT_DEATH(ATTEST_LAUNCH(MismatchedKernel, 1, 64, 0, out.data()),
               "deadlock: the threads of a block wait at different barriers");
}

}  // namespace
