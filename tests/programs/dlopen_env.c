// SPDX-License-Identifier: Apache-2.0
// A program that dlopen()s the shim, with a second thread reading the environment meanwhile or
// without one, and prints what the environment holds after the shim's constructor ran:
//   dlopen_env SHIM threads|single
// Writing the environment while another thread reads it races with that thread's getenv (glibc's
// setenv may reallocate `environ`); the shim writes it only when it is the only thread.
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_stop, g_started;

static void *reader(void *arg) {
  (void)arg;
  atomic_store(&g_started, 1);
  unsigned long n = 0;
  while (!atomic_load(&g_stop))
    if (getenv("HOME")) ++n;
  return (void *)n;
}

static const char *shown(const char *v) {
  return v ? v : "(unset)";
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: dlopen_env SHIM threads|single\n");
    return 64;
  }
  pthread_t t;
  const int threads = strcmp(argv[2], "threads") == 0;
  if (threads) {
    if (pthread_create(&t, NULL, reader, NULL) != 0) return 70;
    while (!atomic_load(&g_started)) {
    }
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 70;
  }
  if (threads) {
    atomic_store(&g_stop, 1);
    pthread_join(t, NULL);
  }
  printf("PYTORCH_CUDA_ALLOC_CONF=%s\n", shown(getenv("PYTORCH_CUDA_ALLOC_CONF")));
  printf("PYTORCH_ALLOC_CONF=%s\n", shown(getenv("PYTORCH_ALLOC_CONF")));
  printf("CUMEMGUARD_SAID=%s\n", shown(getenv("CUMEMGUARD_SAID")));
  return 0;
}
