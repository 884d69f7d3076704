/* cuda_flash.cu — an example attest plugin on a CUDA device (kernels/plugin/attest_kernel.h):
 * plain attention forward and backward for bf16 and f16 (fp32 accumulation, online softmax,
 * lse; backward D = rowsum(dO o O), dq per query row, dk/dv per (query head, key row) folded
 * over the GQA group per key row; no atomics, so it is deterministic). One thread per row
 * runs the row functions of flash_rows.h, which the host
 * build (host_flash.cc) runs through attest's gate in CI. Correct and simple rather than
 * fast: the point is a GPU kernel whose every number attest can check.
 *
 * attest owns the buffers (device memory, outputs NaN-filled) and passes the stream; this
 * file allocates only the backward's scratch (D, the dk/dv shares) and device copies of the ALiBi slopes and
 * cu_seqlens, and checks every CUDA call. Built with -DATTEST_EXAMPLE_MUTANT it is the
 * mutant library (mutant-causal-off-by-one, mutant-no-rescale).
 */
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "flash_plugin.h"

namespace {

using attest_example::KernelConfig;
using attest_example::Params;

constexpr int kThreads = 128;

// Adjacent threads take adjacent rows of one (b, h): their key loads are the same address
// (a broadcast) at every step.
__global__ void ForwardKernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q) return;
  const int64_t i = idx % p.seqlen_q, h = (idx / p.seqlen_q) % p.heads_q;
  const int64_t b = idx / (p.seqlen_q * p.heads_q);
  attest_example::ForwardRow(p, b, h, i);
}

__global__ void DeltaKernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q) return;
  const int64_t i = idx % p.seqlen_q, h = (idx / p.seqlen_q) % p.heads_q;
  const int64_t b = idx / (p.seqlen_q * p.heads_q);
  attest_example::DeltaRow(p, b, h, i);
}

__global__ void DqKernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q) return;
  const int64_t i = idx % p.seqlen_q, h = (idx / p.seqlen_q) % p.heads_q;
  const int64_t b = idx / (p.seqlen_q * p.heads_q);
  attest_example::DqRow(p, b, h, i);
}

__global__ void DkDvPartKernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_k) return;
  const int64_t j = idx % p.seqlen_k, h = (idx / p.seqlen_k) % p.heads_q;
  const int64_t b = idx / (p.seqlen_k * p.heads_q);
  attest_example::DkDvPartRow(p, b, h, j);
}

__global__ void DkDvReduceKernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.heads_kv * p.seqlen_k) return;
  const int64_t j = idx % p.seqlen_k, hk = (idx / p.seqlen_k) % p.heads_kv;
  const int64_t b = idx / (p.seqlen_k * p.heads_kv);
  attest_example::DkDvReduceRow(p, b, hk, j);
}

unsigned Blocks(int64_t rows) { return static_cast<unsigned>((rows + kThreads - 1) / kThreads); }

// Device scratch that is freed on every path; the first failing CUDA call is kept.
class Call {
 public:
  Call(cudaStream_t stream, char* message, size_t size)
      : stream_(stream), message_(message), size_(size) {}
  // Early returns all go through Finish(); this only covers a path that did not.
  ~Call() {
    for (void* p : owned_) cudaFree(p);
  }
  bool Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess || failed_) return !failed_ && e == cudaSuccess;
    failed_ = true;
    attest_example::Fail(ATTEST_ERROR, message_, size_,
                         std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
    return false;
  }
  template <class T>
  T* Upload(const T* host, size_t count, const char* what) {
    if (failed_ || host == nullptr || count == 0) return nullptr;
    void* dev = nullptr;
    if (!Check(cudaMalloc(&dev, count * sizeof(T)), what)) return nullptr;
    owned_.push_back(dev);
    if (!Check(cudaMemcpyAsync(dev, host, count * sizeof(T), cudaMemcpyHostToDevice, stream_),
               what)) {
      return nullptr;
    }
    return static_cast<T*>(dev);
  }
  float* Scratch(size_t count, const char* what) {
    if (failed_) return nullptr;
    void* dev = nullptr;
    if (!Check(cudaMalloc(&dev, (count == 0 ? 1 : count) * sizeof(float)), what)) return nullptr;
    owned_.push_back(dev);
    return static_cast<float*>(dev);
  }
  bool Launched(const char* kernel) { return Check(cudaGetLastError(), kernel); }
  // Waits for the work (the uploads read host memory that must outlive them; the scratch is
  // freed after) and reports an execution fault.
  int32_t Finish() {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (void* p : owned_) Check(cudaFree(p), "cudaFree");
    owned_.clear();
    return failed_ ? ATTEST_ERROR : ATTEST_OK;
  }
  bool failed() const { return failed_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_;
  char* message_;
  size_t size_;
  bool failed_ = false;
  std::vector<void*> owned_;
};

// Slopes and cu_seqlens: host arrays in attest_problem, device arrays for the kernels.
bool PlaceProblemArrays(const attest_problem* pr, const std::vector<float>& slopes, Params* p,
                        Call* call) {
  p->alibi_slopes = call->Upload(slopes.data(), slopes.size(), "cudaMemcpyAsync(alibi_slopes)");
  if (pr->cu_seqlens_q != nullptr) {
    const size_t n = static_cast<size_t>(pr->batch + 1);
    p->cu_seqlens_q = call->Upload(pr->cu_seqlens_q, n, "cudaMemcpyAsync(cu_seqlens_q)");
    p->cu_seqlens_k = call->Upload(pr->cu_seqlens_k, n, "cudaMemcpyAsync(cu_seqlens_k)");
  }
  return !call->failed();
}

int32_t Forward(void* self, const attest_forward_args* args, char* message, size_t size) {
  const KernelConfig& config = *static_cast<const KernelConfig*>(self);
  Params p;
  const int32_t s = attest_example::ParamsFromForward(args, config, &p, message, size);
  if (s != ATTEST_OK) return s;
  Call call(static_cast<cudaStream_t>(args->stream), message, size);
  const std::vector<float> slopes = attest_example::SlopesF32(args->problem);
  if (!PlaceProblemArrays(args->problem, slopes, &p, &call)) return call.Finish();
  const int64_t rows = attest_example::QueryRows(p);
  if (rows > 0) {
    ForwardKernel<<<Blocks(rows), kThreads, 0, call.stream()>>>(p);
    call.Launched("ForwardKernel launch");
  }
  return call.Finish();
}

int32_t Backward(void* self, const attest_backward_args* args, char* message, size_t size) {
  const KernelConfig& config = *static_cast<const KernelConfig*>(self);
  Params p;
  const int32_t s = attest_example::ParamsFromBackward(args, config, &p, message, size);
  if (s != ATTEST_OK) return s;
  Call call(static_cast<cudaStream_t>(args->stream), message, size);
  const std::vector<float> slopes = attest_example::SlopesF32(args->problem);
  if (!PlaceProblemArrays(args->problem, slopes, &p, &call)) return call.Finish();
  const attest_problem* pr = args->problem;
  p.delta = call.Scratch(static_cast<size_t>(p.heads_q * attest_example::TotalQ(pr)),
                         "cudaMalloc(D scratch)");
  p.dk_part = call.Scratch(static_cast<size_t>(p.heads_q * attest_example::TotalK(pr) * p.head_dim),
                           "cudaMalloc(dk scratch)");
  p.dv_part = call.Scratch(
      static_cast<size_t>(p.heads_q * attest_example::TotalK(pr) * p.head_dim_v),
      "cudaMalloc(dv scratch)");
  if (call.failed()) return call.Finish();
  const int64_t qrows = attest_example::QueryRows(p), krows = attest_example::KeyRows(p);
  const int64_t prows = attest_example::KeyRowsPerQueryHead(p);
  // Stream order: D before dq and the dk/dv shares, the shares before their reduction.
  if (qrows > 0) {
    DeltaKernel<<<Blocks(qrows), kThreads, 0, call.stream()>>>(p);
    if (!call.Launched("DeltaKernel launch")) return call.Finish();
    DqKernel<<<Blocks(qrows), kThreads, 0, call.stream()>>>(p);
    if (!call.Launched("DqKernel launch")) return call.Finish();
  }
  if (krows > 0) {
    DkDvPartKernel<<<Blocks(prows), kThreads, 0, call.stream()>>>(p);
    if (!call.Launched("DkDvPartKernel launch")) return call.Finish();
    DkDvReduceKernel<<<Blocks(krows), kThreads, 0, call.stream()>>>(p);
    call.Launched("DkDvReduceKernel launch");
  }
  return call.Finish();
}

#ifndef ATTEST_EXAMPLE_MUTANT
KernelConfig kConfig{ATTEST_DEVICE_CUDA, attest_example::kFaultNone};
const attest_kernel_desc kKernels[] = {
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "flash-bf16",
     ATTEST_EXAMPLE_CAPS("bf16", "bf16"), ATTEST_DEVICE_CUDA, 0, Forward, Backward, &kConfig},
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "flash-f16",
     ATTEST_EXAMPLE_CAPS("f16", "f16"), ATTEST_DEVICE_CUDA, 0, Forward, Backward, &kConfig},
};
#else
KernelConfig kOffByOne{ATTEST_DEVICE_CUDA, attest_example::kFaultCausalOffByOne};
KernelConfig kNoRescale{ATTEST_DEVICE_CUDA, attest_example::kFaultNoRescale};
const attest_kernel_desc kKernels[] = {
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "mutant-causal-off-by-one",
     ATTEST_EXAMPLE_CAPS("bf16", "bf16"), ATTEST_DEVICE_CUDA, 0, Forward, Backward, &kOffByOne},
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "mutant-no-rescale",
     ATTEST_EXAMPLE_CAPS("bf16", "bf16"), ATTEST_DEVICE_CUDA, 0, Forward, Backward, &kNoRescale},
};
#endif

}  // namespace

extern "C" {

ATTEST_KERNEL_EXPORT uint32_t attest_kernel_abi_version(void) { return ATTEST_KERNEL_ABI_VERSION; }
ATTEST_KERNEL_EXPORT int32_t attest_kernel_count(void) {
  return static_cast<int32_t>(sizeof kKernels / sizeof kKernels[0]);
}
ATTEST_KERNEL_EXPORT const attest_kernel_desc* attest_kernel_get(int32_t index) {
  if (index < 0 || index >= attest_kernel_count()) return nullptr;
  return &kKernels[index];
}

}  // extern "C"
