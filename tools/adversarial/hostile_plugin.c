/* hostile_plugin.c: tiny C ABI plugins (kernels/plugin/attest_kernel.h) that attack the
 * isolation of plugin: kernels, for tools/adversarial/run_adversarial.py:
 *   stop-reading  forward answers at once; a thread then waits for attest's next request to
 *                 start arriving and stops the child (SIGSTOP) in the middle of reading it:
 *                 the request (megabytes of inputs) fills the socket buffer, and a send(2)
 *                 without a deadline blocks forever.
 *   fork-escape   forward starts a grandchild that leaves the child's session and process
 *                 group (fork, setsid, fork) and spins, writing its pid to the file named by
 *                 $ATTEST_ADVERSARIAL_PID_FILE, then hangs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/plugin/attest_kernel.h"

enum Mode { kStopReading, kForkEscape, kModeCount };
static const char* const kNames[kModeCount] = {"stop-reading", "fork-escape"};
static int kModes[kModeCount] = {kStopReading, kForkEscape};
static attest_kernel_desc g_descs[kModeCount];

/* Waits until bytes of the next request are readable on the child's socket, then stops the
 * whole process, so that it never reads the rest. */
static void* StopOnNextRequest(void* unused) {
  (void)unused;
  int sock = -1;
  for (int fd = 3; fd < 1024 && sock < 0; ++fd) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) sock = fd;
  }
  if (sock < 0) return NULL;
  for (;;) {
    char byte;
    if (recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1) break;
    usleep(50);
  }
  kill(getpid(), SIGSTOP);
  return NULL;
}

static void EscapeAndSpin(void) {
  if (fork() == 0) {
    setsid();
    if (fork() == 0) {
      const char* path = getenv("ATTEST_ADVERSARIAL_PID_FILE");
      if (path != NULL) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE* f = fopen(tmp, "w");
        if (f != NULL) {
          fprintf(f, "%d", (int)getpid());
          fclose(f);
          rename(tmp, path);
        }
      }
      for (volatile uint64_t i = 0;; ++i) {
      }
    }
    _exit(0);
  }
}

static int32_t Forward(void* self, const attest_forward_args* args, char* message,
                       size_t message_size) {
  (void)args;
  (void)message;
  (void)message_size;
  static int started = 0;
  switch (*(const int*)self) {
    case kStopReading:
      if (!started) {
        started = 1;
        pthread_t t;
        pthread_create(&t, NULL, StopOnNextRequest, NULL);
        pthread_detach(t);
      }
      return ATTEST_OK;
    case kForkEscape:
      EscapeAndSpin();
      for (;;) sleep(1);
  }
  return ATTEST_ERROR;
}

ATTEST_KERNEL_EXPORT const attest_kernel_desc* attest_kernel_get(int32_t index) {
  if (index < 0 || index >= kModeCount) return NULL;
  attest_kernel_desc* d = &g_descs[index];
  d->abi_version = ATTEST_KERNEL_ABI_VERSION;
  d->struct_size = sizeof(attest_kernel_desc);
  d->name = kNames[index];
  d->capabilities_json = "{\"dtypes\":[\"f32\"],\"causal\":true,\"profile\":\"f32\"}";
  d->device_type = ATTEST_DEVICE_HOST;
  d->forward = Forward;
  d->backward = NULL;
  d->self = &kModes[index];
  return d;
}

ATTEST_KERNEL_EXPORT uint32_t attest_kernel_abi_version(void) { return ATTEST_KERNEL_ABI_VERSION; }

ATTEST_KERNEL_EXPORT int32_t attest_kernel_count(void) { return kModeCount; }
