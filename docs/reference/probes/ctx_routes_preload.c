// SPDX-License-Identifier: Apache-2.0
// Probe (preload half): counts the context-changing driver calls the CUDA runtime makes through the
// pointers it looked up with cuGetProcAddress, and lists every context function it looked up. With
// ctx_routes.cu it answers whether the runtime changes the thread's current context only through
// looked-up (hence interposable) entry points. Build:
//   gcc -O2 -shared -fPIC -o libctx_routes.so ctx_routes_preload.c -ldl -I/usr/local/cuda/include
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

typedef CUresult (*gpa5_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa4_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*ctx1_t)(CUcontext);
typedef CUresult (*ctxp_t)(CUcontext *);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);

static gpa5_t real_gpa5_sym, real_gpa5;  // from dlsym, and from the "cuGetProcAddress" self-lookup
static gpa4_t real_gpa4;
static ctx1_t real_set, real_push;
static ctxp_t real_pop;
static retain_t real_retain;
atomic_int cr_set, cr_push, cr_pop, cr_retain;  // read by the program through dlsym(RTLD_DEFAULT)

static CUresult w_set(CUcontext c) { atomic_fetch_add(&cr_set, 1); return real_set(c); }
static CUresult w_push(CUcontext c) { atomic_fetch_add(&cr_push, 1); return real_push(c); }
static CUresult w_pop(CUcontext *c) { atomic_fetch_add(&cr_pop, 1); return real_pop(c); }
static CUresult w_retain(CUcontext *c, CUdevice d) {
  atomic_fetch_add(&cr_retain, 1);
  return real_retain(c, d);
}

static CUresult w_gpa5(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static CUresult w_gpa4(const char *, void **, int, cuuint64_t);

// One wrapper per name; a name whose lookups return different pointers is reported, not wrapped.
static void route(const char *sym, void **pfn, int ver) {
  if (!pfn || !*pfn) return;
  if (strstr(sym, "Ctx")) fprintf(stderr, "lookup %s@%d\n", sym, ver);
#define WRAP(name, slot, w)                                                              \
  if (strcmp(sym, name) == 0) {                                                          \
    if (slot && (void *)slot != *pfn) {                                                  \
      fprintf(stderr, "lookup %s@%d: a second pointer, not wrapped\n", sym, ver);        \
      return;                                                                            \
    }                                                                                    \
    slot = *pfn;                                                                         \
    *pfn = (void *)w;                                                                    \
    return;                                                                              \
  }
  WRAP("cuCtxSetCurrent", real_set, w_set)
  WRAP("cuCtxPushCurrent", real_push, w_push)
  WRAP("cuCtxPopCurrent", real_pop, w_pop)
  WRAP("cuDevicePrimaryCtxRetain", real_retain, w_retain)
  if (strcmp(sym, "cuGetProcAddress") == 0) {
    if (ver >= 12000) { real_gpa5 = (gpa5_t)*pfn; *pfn = (void *)w_gpa5; }
    else { real_gpa4 = (gpa4_t)*pfn; *pfn = (void *)w_gpa4; }
  }
}

static CUresult w_gpa5(const char *sym, void **pfn, int ver, cuuint64_t fl,
                       CUdriverProcAddressQueryResult *st) {
  CUresult r = (real_gpa5 ? real_gpa5 : real_gpa5_sym)(sym, pfn, ver, fl, st);
  if (r == CUDA_SUCCESS && sym) route(sym, pfn, ver);
  return r;
}
static CUresult w_gpa4(const char *sym, void **pfn, int ver, cuuint64_t fl) {
  CUresult r = real_gpa4(sym, pfn, ver, fl);
  if (r == CUDA_SUCCESS && sym) route(sym, pfn, ver);
  return r;
}

void *dlsym(void *h, const char *name) {
  static void *(*real_dlsym)(void *, const char *);
  if (!real_dlsym) {
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  }
  void *p = real_dlsym(h, name);
  if (p && strcmp(name, "cuGetProcAddress_v2") == 0) {
    real_gpa5_sym = (gpa5_t)p;
    return (void *)w_gpa5;
  }
  return p;
}
