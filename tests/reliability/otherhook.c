/* SPDX-License-Identifier: Apache-2.0 */
/* Another LD_PRELOAD interposer, written the way most are (HAMi-core, vgpu-manager, nvshare): it
   defines cudaMalloc, cuMemAlloc_v2 and cuMemCreate and forwards each to dlsym(RTLD_NEXT, name).
   Preloaded before or after cumemguard, every call must pass through both exactly once and reach
   the real library; it prints its call counts at exit for run_life.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

typedef int (*fn2)(void *, size_t);
typedef int (*fn4)(void *, size_t, const void *, unsigned long long);

static unsigned long calls_malloc, calls_alloc, calls_create;

#define NEXT(type, name)                                   \
  static type next_ = 0;                                   \
  if (!next_) next_ = (type)dlsym(RTLD_NEXT, name);        \
  if (!next_) return 999; /* nothing after us: a wiring error the test sees */

__attribute__((visibility("default"))) int cudaMalloc(void **p, size_t n) {
  NEXT(fn2, "cudaMalloc");
  __atomic_add_fetch(&calls_malloc, 1, __ATOMIC_RELAXED);
  return next_(p, n);
}

__attribute__((visibility("default"))) int cuMemAlloc_v2(unsigned long long *p, size_t n) {
  NEXT(fn2, "cuMemAlloc_v2");
  __atomic_add_fetch(&calls_alloc, 1, __ATOMIC_RELAXED);
  return next_(p, n);
}

__attribute__((visibility("default"))) int cuMemCreate(unsigned long long *h, size_t n,
                                                       const void *prop, unsigned long long f) {
  NEXT(fn4, "cuMemCreate");
  __atomic_add_fetch(&calls_create, 1, __ATOMIC_RELAXED);
  return next_(h, n, prop, f);
}

__attribute__((destructor)) static void report(void) {
  char buf[160];
  int n = snprintf(buf, sizeof buf, "otherhook cudaMalloc %lu cuMemAlloc_v2 %lu cuMemCreate %lu\n",
                   calls_malloc, calls_alloc, calls_create);
  if (n > 0) {
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
  }
}
