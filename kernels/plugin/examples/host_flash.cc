/* host_flash.cc — an example attest plugin on the host (kernels/plugin/attest_kernel.h):
 * attention forward and backward in fp32 arithmetic for f32, bf16 and f16 inputs. It runs
 * the row functions of flash_rows.h, the same code the CUDA plugin (cuda_flash.cu) runs one
 * thread per row, in the same order; so attest's gate on this library checks the CUDA
 * kernel's arithmetic on any machine. Built with -DATTEST_EXAMPLE_MUTANT it is the mutant
 * library instead: the same kernels with a seeded bug each, which the gate must catch.
 *
 * Kernels: flash-f32, flash-bf16, flash-f16 (mutant build: mutant-causal-off-by-one,
 * mutant-no-rescale, both bf16).
 */
#include <vector>

#include "flash_plugin.h"

namespace {

using attest_example::KernelConfig;
using attest_example::Params;

int32_t Forward(void* self, const attest_forward_args* args, char* message, size_t size) {
  const KernelConfig& config = *static_cast<const KernelConfig*>(self);
  Params p;
  const int32_t s = attest_example::ParamsFromForward(args, config, &p, message, size);
  if (s != ATTEST_OK) return s;
  const std::vector<float> slopes = attest_example::SlopesF32(args->problem);
  p.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
  p.cu_seqlens_q = args->problem->cu_seqlens_q;
  p.cu_seqlens_k = args->problem->cu_seqlens_k;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) attest_example::ForwardRow(p, b, h, i);
    }
  }
  return ATTEST_OK;
}

int32_t Backward(void* self, const attest_backward_args* args, char* message, size_t size) {
  const KernelConfig& config = *static_cast<const KernelConfig*>(self);
  Params p;
  const int32_t s = attest_example::ParamsFromBackward(args, config, &p, message, size);
  if (s != ATTEST_OK) return s;
  const std::vector<float> slopes = attest_example::SlopesF32(args->problem);
  p.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
  p.cu_seqlens_q = args->problem->cu_seqlens_q;
  p.cu_seqlens_k = args->problem->cu_seqlens_k;
  const attest_problem* pr = args->problem;
  std::vector<float> delta(static_cast<size_t>(p.heads_q * attest_example::TotalQ(pr)));
  std::vector<float> dk_part(static_cast<size_t>(p.heads_q * attest_example::TotalK(pr) * p.head_dim));
  std::vector<float> dv_part(static_cast<size_t>(p.heads_q * attest_example::TotalK(pr) * p.head_dim_v));
  p.delta = delta.data();
  p.dk_part = dk_part.data();
  p.dv_part = dv_part.data();
  // 1. D = rowsum(dO o O); 2. dq per query row; 3. each query head's dk, dv per key row;
  // 4. dk, dv folded over each GQA group.
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) attest_example::DeltaRow(p, b, h, i);
    }
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) attest_example::DqRow(p, b, h, i);
      for (int64_t j = 0; j < p.seqlen_k; ++j) attest_example::DkDvPartRow(p, b, h, j);
    }
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      for (int64_t j = 0; j < p.seqlen_k; ++j) attest_example::DkDvReduceRow(p, b, hk, j);
    }
  }
  return ATTEST_OK;
}

#ifndef ATTEST_EXAMPLE_MUTANT
KernelConfig kConfig{ATTEST_DEVICE_HOST, attest_example::kFaultNone};
const attest_kernel_desc kKernels[] = {
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "flash-f32",
     ATTEST_EXAMPLE_CAPS("f32", "f32"), ATTEST_DEVICE_HOST, 0, Forward, Backward, &kConfig},
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "flash-bf16",
     ATTEST_EXAMPLE_CAPS("bf16", "bf16"), ATTEST_DEVICE_HOST, 0, Forward, Backward, &kConfig},
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "flash-f16",
     ATTEST_EXAMPLE_CAPS("f16", "f16"), ATTEST_DEVICE_HOST, 0, Forward, Backward, &kConfig},
};
#else
KernelConfig kOffByOne{ATTEST_DEVICE_HOST, attest_example::kFaultCausalOffByOne};
KernelConfig kNoRescale{ATTEST_DEVICE_HOST, attest_example::kFaultNoRescale};
const attest_kernel_desc kKernels[] = {
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "mutant-causal-off-by-one",
     ATTEST_EXAMPLE_CAPS("bf16", "bf16"), ATTEST_DEVICE_HOST, 0, Forward, Backward, &kOffByOne},
    {ATTEST_KERNEL_ABI_VERSION, sizeof(attest_kernel_desc), "mutant-no-rescale",
     ATTEST_EXAMPLE_CAPS("bf16", "bf16"), ATTEST_DEVICE_HOST, 0, Forward, Backward, &kNoRescale},
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
