/* attest_kernel.h — the versioned C ABI through which attest loads kernels from shared
 * libraries (`plugin:<path.so>[:<name>]`; docs/design.md "External kernels").
 *
 * A plugin is a shared library that exports three C symbols:
 *
 *   uint32_t attest_kernel_abi_version(void);          returns ATTEST_KERNEL_ABI_VERSION
 *   int32_t  attest_kernel_count(void);                 number of kernels it provides (>= 1)
 *   const attest_kernel_desc* attest_kernel_get(int32_t index);
 *
 * The loader refuses a library whose version differs from the one attest was built with, or
 * that lacks a symbol, with an error naming the library and the symbol (exit code 2).
 *
 * Calls. attest owns every buffer. Before a call it allocates the inputs and outputs on the
 * device the descriptor names (host memory, or CUDA / HIP device memory allocated and copied
 * by attest's device adapter), fills every output with NaN, and afterwards copies the
 * outputs back and checks them. A kernel writes only into the output tensors it is given.
 *
 * Layout and semantics are the flash_attn_func conventions of docs/design.md: q [B, Sq, Hq, D],
 * k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], o [B, Sq, Hq, Dv], lse [B, Hq, Sq] (natural log,
 * always F32); packed variable length: [total, H, D] with cu_seqlens, lse [Hq, total_q].
 * A plugin always returns lse: the loader refuses capabilities with "lse": false (a kernel
 * whose API returns no lse is adapted through an exec: worker, docs/protocol.md).
 * o, dq, dk, dv have the input dtype. Strides are in elements; attest passes contiguous
 * row-major tensors, but a kernel must read the strides it is given.
 *
 * Return codes: ATTEST_OK (outputs written), ATTEST_UNSUPPORTED (an honest refusal: nothing
 * was written; `message` says which feature), ATTEST_ERROR (a failure: `message` says what).
 * Anything else is a protocol violation. A call must not keep pointers after it returns.
 *
 * This header is C99 and C++ compatible and has no dependencies beyond <stdint.h>/<stddef.h>.
 */
#ifndef ATTEST_KERNEL_H_
#define ATTEST_KERNEL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on every incompatible change to the structs or functions below. */
#define ATTEST_KERNEL_ABI_VERSION 1u

#if defined(_WIN32)
#define ATTEST_KERNEL_EXPORT __declspec(dllexport)
#else
#define ATTEST_KERNEL_EXPORT __attribute__((visibility("default")))
#endif

/* Element types; the names follow the safetensors dtype spellings. */
typedef enum attest_dtype {
  ATTEST_DTYPE_F64 = 0,
  ATTEST_DTYPE_F32 = 1,
  ATTEST_DTYPE_BF16 = 2,
  ATTEST_DTYPE_F16 = 3,
  ATTEST_DTYPE_F8_E4M3 = 4, /* e4m3fn */
  ATTEST_DTYPE_F8_E5M2 = 5,
  ATTEST_DTYPE_I32 = 6
} attest_dtype;

/* Where a tensor's data lives. */
typedef enum attest_device_type {
  ATTEST_DEVICE_HOST = 0,
  ATTEST_DEVICE_CUDA = 1,
  ATTEST_DEVICE_HIP = 2
} attest_device_type;

typedef enum attest_status {
  ATTEST_OK = 0,
  ATTEST_UNSUPPORTED = 1,
  ATTEST_ERROR = 2
} attest_status;

/* A strided view of at most 4 dimensions. Unused dimensions have shape 1, stride 0. */
typedef struct attest_tensor {
  void* data;
  int32_t dtype;       /* attest_dtype */
  int32_t ndim;        /* 1..4 */
  int64_t shape[4];
  int64_t strides[4];  /* in elements, not bytes */
  int32_t device_type; /* attest_device_type */
  int32_t device_id;
} attest_tensor;

/* The problem, field for field the case-file `problem` object of docs/design.md. Host memory. */
typedef struct attest_problem {
  int64_t batch;    /* number of sequences (packed: entries of cu_seqlens minus one) */
  int64_t heads_q;
  int64_t heads_kv;
  int64_t seqlen_q; /* per sequence (packed: the maximum) */
  int64_t seqlen_k;
  int64_t head_dim;
  int64_t head_dim_v;
  int32_t dtype;    /* attest_dtype of q, k, v, do */
  int32_t causal;   /* 0 or 1 */
  int32_t causal_top_left; /* 0: bottom-right (default), 1: top-left */
  int32_t reserved0;
  int64_t window_left;  /* -1 = unbounded */
  int64_t window_right; /* -1 = unbounded */
  double scale;         /* the resolved score scale (1/sqrt(head_dim) when the case said null) */
  double softcap;       /* 0 = none */
  const double* alibi_slopes; /* [heads_q] or NULL */
  const int32_t* cu_seqlens_q; /* [batch + 1] or NULL (not packed) */
  const int32_t* cu_seqlens_k; /* [batch + 1] or NULL */
  /* The whole problem as case-file JSON (NUL-terminated), for features the fields above do
   * not carry (document ids, prefix-LM, block-sparse masks). A kernel that sees a feature it
   * does not implement must answer ATTEST_UNSUPPORTED. */
  const char* problem_json;
} attest_problem;

typedef struct attest_forward_args {
  uint32_t struct_size; /* sizeof(attest_forward_args) of the caller */
  const attest_problem* problem;
  attest_tensor q, k, v; /* inputs */
  attest_tensor o, lse;  /* outputs, NaN-filled */
  void* stream;          /* cudaStream_t / hipStream_t for device kernels, else NULL */
} attest_forward_args;

typedef struct attest_backward_args {
  uint32_t struct_size; /* sizeof(attest_backward_args) of the caller */
  const attest_problem* problem;
  attest_tensor q, k, v, o, lse, dout; /* inputs: o, lse from this kernel's forward */
  attest_tensor dq, dk, dv;            /* outputs, NaN-filled */
  void* stream;
} attest_backward_args;

/* `message` has room for `message_size` bytes (including the NUL); write a NUL-terminated
 * explanation there for ATTEST_UNSUPPORTED and ATTEST_ERROR. */
typedef int32_t (*attest_forward_fn)(void* self, const attest_forward_args* args, char* message,
                                     size_t message_size);
typedef int32_t (*attest_backward_fn)(void* self, const attest_backward_args* args,
                                      char* message, size_t message_size);

typedef struct attest_kernel_desc {
  uint32_t abi_version; /* ATTEST_KERNEL_ABI_VERSION */
  uint32_t struct_size; /* sizeof(attest_kernel_desc) */
  const char* name;     /* unique within the library, e.g. "flash-bf16" */
  /* The `capabilities` JSON object of the exec protocol (docs/design.md), e.g.
   * {"dtypes":["bf16","f16"],"head_dims":[64,128],"causal":true,"backward":true,
   *  "deterministic":true,"profile":"bf16"}. */
  const char* capabilities_json;
  int32_t device_type; /* where the tensors passed to forward/backward live */
  int32_t reserved0;
  attest_forward_fn forward;
  attest_backward_fn backward; /* NULL for forward-only kernels */
  void* self;                  /* passed back as the first argument */
} attest_kernel_desc;

/* The three symbols a plugin exports (declared here so a plugin gets their types checked). */
ATTEST_KERNEL_EXPORT uint32_t attest_kernel_abi_version(void);
ATTEST_KERNEL_EXPORT int32_t attest_kernel_count(void);
ATTEST_KERNEL_EXPORT const attest_kernel_desc* attest_kernel_get(int32_t index);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ATTEST_KERNEL_H_ */
