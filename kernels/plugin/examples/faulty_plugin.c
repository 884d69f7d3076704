/* faulty_plugin.c — plugins that misbehave, for the loader's and the isolation's tests
 * (kernels/plugin/plugin_test.cc). One source, several libraries by define:
 *   (none)                 kernels that crash or lie at call time: segfault, abort, hang,
 *                          error, bad-status, writes-input
 *   -DFAULTY_BAD_VERSION   attest_kernel_abi_version() returns 999
 *   -DFAULTY_MISSING_GET   no attest_kernel_get symbol
 *   -DFAULTY_BAD_STRUCT    a descriptor whose struct_size is wrong
 *   -DFAULTY_BAD_CAPS      a descriptor whose capabilities name an unknown dtype
 *   -DFAULTY_NO_LSE        capabilities with "lse": false, which the C ABI cannot carry
 *   -DFAULTY_SINK          capabilities with "sink": true, which the C ABI cannot carry
 *   -DFAULTY_REL_BIAS      capabilities with "rel_bias": true, likewise
 *   -DFAULTY_PAGED         capabilities with "paged": true (no page table in the C ABI)
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/plugin/attest_kernel.h"

enum Mode { kSegfault, kAbort, kHang, kError, kBadStatus, kWritesInput, kModeCount };

#ifndef FAULTY_MISSING_GET /* everything below serves attest_kernel_get */
static const char* const kNames[kModeCount] = {"segfault", "abort",        "hang",
                                               "error",    "bad-status",   "writes-input"};
static volatile uintptr_t g_bad_address = 16;
static int kModes[kModeCount] = {kSegfault, kAbort, kHang, kError, kBadStatus, kWritesInput};

static int32_t Forward(void* self, const attest_forward_args* args, char* message,
                       size_t message_size) {
  switch (*(const int*)self) {
    case kSegfault:
      /* A write to page zero (SIGSEGV); the address is read at run time so that the
       * compiler neither warns about nor removes the store. */
      *(volatile int*)g_bad_address = 1;
      return ATTEST_OK;
    case kAbort:
      abort();
    case kHang:
      for (;;) sleep(1);
    case kError:
      snprintf(message, message_size, "cudaErrorIllegalAddress (simulated)");
      return ATTEST_ERROR;
    case kBadStatus:
      return 7;
    case kWritesInput:
      ((float*)args->q.data)[0] += 1.0f;
      return ATTEST_OK;
  }
  return ATTEST_ERROR;
}

#define FAULTY_CAPS "{\"dtypes\":[\"f32\"],\"causal\":true,\"profile\":\"f32\"}"

static attest_kernel_desc g_descs[kModeCount];

ATTEST_KERNEL_EXPORT const attest_kernel_desc* attest_kernel_get(int32_t index) {
  if (index < 0 || index >= kModeCount) return NULL;
  attest_kernel_desc* d = &g_descs[index];
  d->abi_version = ATTEST_KERNEL_ABI_VERSION;
  d->struct_size = sizeof(attest_kernel_desc);
#ifdef FAULTY_BAD_STRUCT
  d->struct_size -= 8;
#endif
  d->name = kNames[index];
#ifdef FAULTY_BAD_CAPS
  d->capabilities_json = "{\"dtypes\":[\"bf17\"]}";
#elif defined(FAULTY_NO_LSE)
  d->capabilities_json = "{\"dtypes\":[\"f32\"],\"lse\":false}";
#elif defined(FAULTY_SINK)
  d->capabilities_json = "{\"dtypes\":[\"f32\"],\"sink\":true}";
#elif defined(FAULTY_REL_BIAS)
  d->capabilities_json = "{\"dtypes\":[\"f32\"],\"rel_bias\":true}";
#elif defined(FAULTY_PAGED)
  d->capabilities_json = "{\"dtypes\":[\"f32\"],\"paged\":true}";
#else
  d->capabilities_json = FAULTY_CAPS;
#endif
  d->device_type = ATTEST_DEVICE_HOST;
  d->forward = Forward;
  d->backward = NULL;
  d->self = &kModes[index];
  return d;
}
#endif

ATTEST_KERNEL_EXPORT uint32_t attest_kernel_abi_version(void) {
#ifdef FAULTY_BAD_VERSION
  return 999u;
#else
  return ATTEST_KERNEL_ABI_VERSION;
#endif
}

ATTEST_KERNEL_EXPORT int32_t attest_kernel_count(void) { return kModeCount; }
