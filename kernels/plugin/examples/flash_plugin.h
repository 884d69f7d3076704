/* flash_plugin.h — the host side shared by the example flash plugins (host_flash.cc on the
 * CPU, cuda_flash.cu on a GPU): checking the C ABI arguments (kernels/plugin/attest_kernel.h)
 * and turning them into the Params of flash_rows.h, and the capabilities each kernel
 * declares. A kernel author's plugin does the same three things: refuse honestly what it
 * does not implement, check what it was given, then run.
 */
#ifndef ATTEST_EXAMPLES_FLASH_PLUGIN_H_
#define ATTEST_EXAMPLES_FLASH_PLUGIN_H_

#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "flash_rows.h"
#include "kernels/plugin/attest_kernel.h"

namespace attest_example {

/* What one descriptor serves: its element types and device, and a seeded fault. */
struct KernelConfig {
  int32_t device_type;
  int32_t fault;
};

/* Head dims declared in the capabilities (every D in 1..256 is computed; the list says what
 * the suites should pick from). */
#define ATTEST_EXAMPLE_HEAD_DIMS \
  "[8,16,24,32,40,48,56,64,72,80,88,96,104,112,120,128,144,160,176,192,208,224,240,256]"

#define ATTEST_EXAMPLE_CAPS(dtype, profile)                                                  \
  "{\"dtypes\":[\"" dtype "\"],\"head_dims\":" ATTEST_EXAMPLE_HEAD_DIMS                     \
  ",\"head_dims_v\":" ATTEST_EXAMPLE_HEAD_DIMS                                               \
  ",\"causal\":true,\"window\":true,\"softcap\":true,\"alibi\":true,\"varlen\":true,"       \
  "\"gqa\":true,\"documents\":false,\"prefix_lm\":false,\"block_sparse\":false,"             \
  "\"backward\":true,\"deterministic\":true,\"profile\":\"" profile "\"}"

inline int32_t Fail(int32_t status, char* message, size_t size, const std::string& text) {
  if (message != nullptr && size > 0) snprintf(message, size, "%s", text.c_str());
  return status;
}

inline bool ElementTypeOk(int32_t dtype) {
  return dtype == kElemF32 || dtype == kElemBF16 || dtype == kElemF16;
}

/* Checks one tensor's dtype, rank and device; fills its TensorRef. */
inline int32_t TakeTensor(const attest_tensor& t, const char* name, int32_t dtype, int32_t ndim,
                          int32_t device_type, TensorRef* out, char* message, size_t size) {
  if (t.data == nullptr && t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3] > 0) {
    return Fail(ATTEST_ERROR, message, size, std::string("tensor ") + name + ": data is NULL");
  }
  if (t.dtype != dtype) {
    return Fail(ATTEST_ERROR, message, size,
                std::string("tensor ") + name + ": dtype " + std::to_string(t.dtype) +
                    ", expected " + std::to_string(dtype));
  }
  if (t.ndim != ndim) {
    return Fail(ATTEST_ERROR, message, size,
                std::string("tensor ") + name + ": ndim " + std::to_string(t.ndim) +
                    ", expected " + std::to_string(ndim));
  }
  if (t.device_type != device_type) {
    return Fail(ATTEST_ERROR, message, size,
                std::string("tensor ") + name + ": device_type " + std::to_string(t.device_type) +
                    ", expected " + std::to_string(device_type));
  }
  out->data = t.data;
  out->dtype = t.dtype;
  for (int d = 0; d < 4; ++d) out->stride[d] = t.strides[d];
  return ATTEST_OK;
}

/* The problem part of Params, or ATTEST_UNSUPPORTED naming the feature. Pointers to alibi
 * slopes and cu_seqlens are left null: the caller places them (host or device memory). */
inline int32_t TakeProblem(const attest_problem* pr, const KernelConfig& config, Params* p,
                           char* message, size_t size) {
  if (pr == nullptr) return Fail(ATTEST_ERROR, message, size, "problem is NULL");
  if (!ElementTypeOk(pr->dtype)) {
    return Fail(ATTEST_UNSUPPORTED, message, size,
                "dtype " + std::to_string(pr->dtype) + " (this kernel computes f32, bf16, f16)");
  }
  if (pr->head_dim < 1 || pr->head_dim > kMaxHeadDim || pr->head_dim_v < 1 ||
      pr->head_dim_v > kMaxHeadDim) {
    return Fail(ATTEST_UNSUPPORTED, message, size, "head dims above 256");
  }
  if (pr->heads_kv < 1 || pr->heads_q % pr->heads_kv != 0) {
    return Fail(ATTEST_ERROR, message, size, "heads_q is not a multiple of heads_kv");
  }
  if (pr->heads_q / pr->heads_kv > kMaxGroup) {
    return Fail(ATTEST_UNSUPPORTED, message, size, "GQA groups above 128 query heads");
  }
  /* Mask families the fields do not carry: only in problem_json (attest writes these keys
   * only when the feature is on). */
  const char* json = pr->problem_json != nullptr ? pr->problem_json : "";
  for (const char* key : {"\"document_ids_q\"", "\"prefix_lm\"", "\"block_sparse\""}) {
    if (strstr(json, key) != nullptr) {
      return Fail(ATTEST_UNSUPPORTED, message, size,
                  std::string("mask feature ") + key + " is not implemented");
    }
  }
  if ((pr->cu_seqlens_q == nullptr) != (pr->cu_seqlens_k == nullptr)) {
    return Fail(ATTEST_ERROR, message, size, "only one of cu_seqlens_q/k is set");
  }
  memset(p, 0, sizeof *p);
  p->batch = pr->batch;
  p->heads_q = pr->heads_q;
  p->heads_kv = pr->heads_kv;
  p->seqlen_q = pr->seqlen_q;
  p->seqlen_k = pr->seqlen_k;
  p->head_dim = pr->head_dim;
  p->head_dim_v = pr->head_dim_v;
  p->window_left = pr->window_left;
  p->window_right = pr->window_right;
  p->causal = pr->causal;
  p->top_left = pr->causal_top_left;
  p->fault = config.fault;
  p->scale = static_cast<float>(pr->scale);
  p->softcap = static_cast<float>(pr->softcap);
  return ATTEST_OK;
}

inline int32_t ParamsFromForward(const attest_forward_args* a, const KernelConfig& config,
                                 Params* p, char* message, size_t size) {
  if (a == nullptr || a->struct_size < sizeof(attest_forward_args)) {
    return Fail(ATTEST_ERROR, message, size, "attest_forward_args.struct_size too small");
  }
  int32_t s = TakeProblem(a->problem, config, p, message, size);
  if (s != ATTEST_OK) return s;
  const int32_t dt = a->problem->dtype;
  const int32_t rank = a->problem->cu_seqlens_q != nullptr ? 3 : 4;
  const int32_t dev = config.device_type;
  if ((s = TakeTensor(a->q, "q", dt, rank, dev, &p->q, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->k, "k", dt, rank, dev, &p->k, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->v, "v", dt, rank, dev, &p->v, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->o, "o", dt, rank, dev, &p->o, message, size)) != ATTEST_OK) return s;
  return TakeTensor(a->lse, "lse", kElemF32, rank - 1, dev, &p->lse, message, size);
}

inline int32_t ParamsFromBackward(const attest_backward_args* a, const KernelConfig& config,
                                  Params* p, char* message, size_t size) {
  if (a == nullptr || a->struct_size < sizeof(attest_backward_args)) {
    return Fail(ATTEST_ERROR, message, size, "attest_backward_args.struct_size too small");
  }
  int32_t s = TakeProblem(a->problem, config, p, message, size);
  if (s != ATTEST_OK) return s;
  const int32_t dt = a->problem->dtype;
  const int32_t rank = a->problem->cu_seqlens_q != nullptr ? 3 : 4;
  const int32_t dev = config.device_type;
  if ((s = TakeTensor(a->q, "q", dt, rank, dev, &p->q, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->k, "k", dt, rank, dev, &p->k, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->v, "v", dt, rank, dev, &p->v, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->o, "o", dt, rank, dev, &p->o, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->lse, "lse", kElemF32, rank - 1, dev, &p->lse, message, size)) !=
      ATTEST_OK) {
    return s;
  }
  if ((s = TakeTensor(a->dout, "dout", dt, rank, dev, &p->dout, message, size)) != ATTEST_OK) {
    return s;
  }
  if ((s = TakeTensor(a->dq, "dq", dt, rank, dev, &p->dq, message, size)) != ATTEST_OK) return s;
  if ((s = TakeTensor(a->dk, "dk", dt, rank, dev, &p->dk, message, size)) != ATTEST_OK) return s;
  return TakeTensor(a->dv, "dv", dt, rank, dev, &p->dv, message, size);
}

/* Rows of the query side (queries of every sequence padded to seqlen_q) and the key side. */
inline int64_t QueryRows(const Params& p) { return p.batch * p.heads_q * p.seqlen_q; }
inline int64_t KeyRows(const Params& p) { return p.batch * p.heads_kv * p.seqlen_k; }
inline int64_t KeyRowsPerQueryHead(const Params& p) { return p.batch * p.heads_q * p.seqlen_k; }
inline int64_t TotalK(const attest_problem* pr) {
  return pr->cu_seqlens_k != nullptr ? pr->cu_seqlens_k[pr->batch] : pr->batch * pr->seqlen_k;
}
inline int64_t TotalQ(const attest_problem* pr) {
  return pr->cu_seqlens_q != nullptr ? pr->cu_seqlens_q[pr->batch] : pr->batch * pr->seqlen_q;
}

/* Host copies of the slopes as float (the kernel computes scores in fp32). */
inline std::vector<float> SlopesF32(const attest_problem* pr) {
  std::vector<float> s;
  if (pr->alibi_slopes != nullptr) {
    for (int64_t h = 0; h < pr->heads_q; ++h) s.push_back(static_cast<float>(pr->alibi_slopes[h]));
  }
  return s;
}

}  // namespace attest_example

#endif /* ATTEST_EXAMPLES_FLASH_PLUGIN_H_ */
