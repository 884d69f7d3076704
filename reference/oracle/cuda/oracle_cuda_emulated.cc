// oracle_cuda.cu compiled by the C++ compiler with its kernels on the CPU
// (oracle_cuda_emulate.h): libattest_oracle_cuda_emulated.so, the same C interface as the
// nvcc build, for testing the kernels and the host code where there is no GPU.
#define ATTEST_ORACLE_CUDA_EMULATE 1
#include "reference/oracle/cuda/oracle_cuda.cu"  // NOLINT(bugprone-suspicious-include)
