// The C interface of the CUDA float64 oracle (oracle_cuda.cu, built by nvcc into
// libattest_oracle_cuda.so and loaded with dlopen by oracle_cuda_host.cc). Plain C: no CUDA
// header, no C++ type crosses it, so the host side of attest never links CUDA.
//
// Semantics and layouts are those of reference/oracle/oracle.h (q [B,Sq,Hq,D], k [B,Sk,Hkv,D],
// v [B,Sk,Hkv,Dv], o [B,Sq,Hq,Dv], lse [B,Hq,Sq]; packed varlen [total,H,*] and lse [Hq,total_q]);
// every tensor is contiguous float64.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTEST_ORACLE_CUDA_ABI 1

// One attention problem (reference/problem/problem.h), already validated by the caller. The
// arrays are host memory and are read during the call only.
typedef struct AttestOracleCudaProblem {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v;
  double scale;    // the effective scale (Problem::EffectiveScale)
  double softcap;  // 0: off
  int32_t causal;
  int32_t causal_top_left;  // 1: CausalAlign::kTopLeft; 0: bottom-right
  int64_t window_left, window_right;  // -1: unbounded
  int64_t prefix_lm;                  // 0: off
  const double* alibi_slopes;         // [heads_q] or NULL
  const int32_t* cu_seqlens_q;        // [batch + 1] or NULL (both or neither)
  const int32_t* cu_seqlens_k;
  // Per-token document ids, flattened over the token rows: [batch * seqlen_q] and
  // [batch * seqlen_k] (row b * S + i), or NULL (both or neither).
  const int32_t* document_ids_q;
  const int32_t* document_ids_k;
  // Block-sparse: block_q > 0 turns it on; blocks_map[qb * key_blocks + kb] != 0 lists
  // (qb, kb), with query_blocks = ceil(seqlen_q / block_q), key_blocks = ceil(seqlen_k / block_k).
  int64_t block_q, block_k;
  const uint8_t* blocks_map;
} AttestOracleCudaProblem;

// The OracleStats fields (reference/oracle/oracle.h) this implementation computes, with the
// meaning stated there (for the GPU's own accumulation chains: sum_len_k, sum_len_q).
typedef struct AttestOracleCudaStats {
  double score_abs_max, v_abs_max, v_norm_max, k_abs_max, lse_abs_max;
  int64_t max_keys, sum_len_k, empty_rows;
  double q_abs_max, do_abs_max, do_norm_max, col_mass_max;
  int64_t max_queries, sum_len_q, unseen_keys;
  double kernel_seconds;  // wall time of the kernels (events), not of the copies
} AttestOracleCudaStats;

enum {
  ATTEST_ORACLE_CUDA_DEVICE_POINTERS = 1,  // q, k, v, dout and all outputs are device memory
  ATTEST_ORACLE_CUDA_MMA = 2,  // products on the FP64 tensor cores (mma.sync m8n8k4 f64)
};

// Forward (dout == NULL; dq, dk, dv, delta ignored) or forward + backward. Outputs: o, lse
// always; dq, dk, dv, delta with dout. Returns 0 on success, else a nonzero code with a
// NUL-terminated message in `message` (at most message_size bytes). Never aborts.
int attest_oracle_cuda_run(const AttestOracleCudaProblem* problem, const double* q,
                           const double* k, const double* v, const double* dout, double* o,
                           double* lse, double* dq, double* dk, double* dv, double* delta,
                           int flags, AttestOracleCudaStats* stats, char* message,
                           int64_t message_size);

// The number of CUDA devices (0 when none or no driver); *message says why when 0.
int attest_oracle_cuda_device_count(char* message, int64_t message_size);

// C = A B for n x n doubles with cuBLAS (dlopen'ed: libcublas.so.13, .12, or the path in
// ATTEST_CUBLAS), best of `repeats` timed calls after a warm-up: the bench's yardstick.
int attest_oracle_cuda_dgemm_seconds(int64_t n, int repeats, double* seconds, char* message,
                                     int64_t message_size);

#ifdef __cplusplus
}
#endif
