// The CUDA float64 oracle from ordinary C++ (no CUDA header, no link-time CUDA dependency):
// loads libattest_oracle_cuda.so (oracle_cuda.cu, built by nvcc when ATTEST_CUDA is on) with
// dlopen and returns what the CPU oracle returns (reference/oracle/oracle.h ForwardOut,
// BackwardOut), computed on the GPU. Semantics, layouts and the certification bound
// (ErrorBound with the returned statistics) are the CPU oracle's; oracle_cuda.cu says why
// the bound holds.
//
// The library is looked up in this order: $ATTEST_ORACLE_CUDA (a file path), next to the
// running executable, the build directory it was built in, then the dynamic loader's path.
#pragma once

#include <cstdint>
#include <string>

#include "reference/oracle/oracle.h"

namespace attest {

struct CudaOracleOptions {
  // Products on the FP64 tensor cores (mma.sync m8n8k4 f64) instead of fma chains: the same
  // expressions and bound (any summation order), faster; the FMA path is the plain one.
  bool mma = false;
  // Library file; empty: the search above.
  std::string library;
  // If set, receives the kernels' wall time in seconds (CUDA events, without copies).
  double* kernel_seconds = nullptr;
};

// Learnable sinks (Problem::sink) are declined: CudaForward / CudaBackward throw
// std::invalid_argument naming problem.sink, and OracleForwardOn / OracleBackwardOn run a
// problem with a sink on the CPU oracle (with cpu.sink) even when `cuda` is set. Learnable
// relative biases (Problem::rel_bias) likewise, naming problem.rel_bias.
//
// Throw std::invalid_argument (naming the field or tensor) on a bad problem or inputs, and
// std::runtime_error when the library cannot be loaded, there is no GPU, or CUDA fails.
ForwardOut CudaForward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                       const CudaOracleOptions& options = {});
BackwardOut CudaBackward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& dout, const CudaOracleOptions& options = {});

// The float64 oracle where `cuda` says: on the GPU (CudaForward / CudaBackward with *cuda), or,
// when it is null, on the CPU (Forward<double> / Backward<double> with `cpu`; the GPU computes
// every row, whatever cpu.query_rows and key_rows flag).
ForwardOut OracleForwardOn(const CudaOracleOptions* cuda, const Problem& p, const Tensor& q,
                           const Tensor& k, const Tensor& v, const OracleOptions& cpu);
BackwardOut OracleBackwardOn(const CudaOracleOptions* cuda, const Problem& p, const Tensor& q,
                             const Tensor& k, const Tensor& v, const Tensor& dout,
                             const OracleOptions& cpu);

// The path of the loaded library (loads it; throws std::runtime_error when it cannot).
std::string CudaOracleLibrary(const CudaOracleOptions& options = {});
// The number of CUDA devices (loads the library; 0 with the reason in *why when there is none).
int CudaDeviceCount(std::string* why = nullptr, const CudaOracleOptions& options = {});
// Seconds of one n x n x n cuBLAS dgemm on the GPU (best of `repeats`), the bench's yardstick.
double CudaDgemmSeconds(int64_t n, int repeats, const CudaOracleOptions& options = {});

}  // namespace attest
