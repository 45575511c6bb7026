// SPDX-License-Identifier: Apache-2.0
// LD_PRELOAD logger of how a process reaches libcuda (the method of interposers.md 9.1/9.2): every
// dlsym, and every cuGetProcAddress request, tagged by the pointer it came through.
//
// GPA_LOG=path receives lines
//   dlsym <calling object> <name>
//   D <symbol> <version> <flags>    through the pointer dlsym returned for cuGetProcAddress_v2
//   G <symbol> <version> <flags>    through the pointer handed out for ("cuGetProcAddress", >= 12000)
//   G4 <symbol> <version> <flags>   through the one handed out for ("cuGetProcAddress", 11030)
// The logger substitutes its own wrappers for those pointers, as an interposer would, so a caller
// that keeps using the dlsym'd pointer shows up as D lines.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int log_fd() {
  static int fd = [] {
    const char *p = getenv("GPA_LOG");
    return p ? open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }();
  return fd;
}

void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_line(const char *fmt, ...) {
  if (log_fd() < 0) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(log_fd(), buf, static_cast<size_t>(n));
  (void)w;
}

using dlsym_fn = void *(*)(void *, const char *);
// No function-local static: its guard (__cxa_guard_acquire) is intercepted by ThreadSanitizer,
// which may not be initialised yet when its own start-up reaches this dlsym.
dlsym_fn g_real_dlsym = nullptr;
dlsym_fn real_dlsym() {
  dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
  if (!f) {
    f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (!f) f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
  }
  return f;
}

PFN_cuGetProcAddress_v12000 g_boot, g_gpa12;
PFN_cuGetProcAddress_v11030 g_gpa11;

CUresult CUDAAPI gpa12_wrapper(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult CUDAAPI gpa11_wrapper(const char *, void **, int, cuuint64_t);

const char *show(const char *s) { return !s ? "(null)" : *s ? s : "\"\""; }

// A request for "cuGetProcAddress" gets the logger's wrapper of the matching arity.
void substitute(const char *sym, void **pfn, int version) {
  if (!sym || std::strcmp(sym, "cuGetProcAddress") != 0 || !pfn || !*pfn) return;
  if (version >= 12000) {
    g_gpa12 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(*pfn);
    *pfn = reinterpret_cast<void *>(&gpa12_wrapper);
  } else {
    g_gpa11 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(*pfn);
    *pfn = reinterpret_cast<void *>(&gpa11_wrapper);
  }
}

CUresult CUDAAPI boot_wrapper(const char *sym, void **pfn, int version, cuuint64_t flags,
                              CUdriverProcAddressQueryResult *st) {
  log_line("D %s %d %llu", show(sym), version, static_cast<unsigned long long>(flags));
  CUresult r = g_boot(sym, pfn, version, flags, st);
  if (r == CUDA_SUCCESS) substitute(sym, pfn, version);
  return r;
}

CUresult CUDAAPI gpa12_wrapper(const char *sym, void **pfn, int version, cuuint64_t flags,
                               CUdriverProcAddressQueryResult *st) {
  log_line("G %s %d %llu", show(sym), version, static_cast<unsigned long long>(flags));
  CUresult r = g_gpa12(sym, pfn, version, flags, st);
  if (r == CUDA_SUCCESS) substitute(sym, pfn, version);
  return r;
}

CUresult CUDAAPI gpa11_wrapper(const char *sym, void **pfn, int version, cuuint64_t flags) {
  log_line("G4 %s %d %llu", show(sym), version, static_cast<unsigned long long>(flags));
  CUresult r = g_gpa11(sym, pfn, version, flags);
  if (r == CUDA_SUCCESS) substitute(sym, pfn, version);
  return r;
}

// A sanitizer runtime preloaded before the logger (tools/dev sanitize) looks up its own functions
// with dlsym while it initialises, before its interceptors of strcmp and friends work: until the
// logger's constructor has run, lookups are only forwarded.
bool g_ready = false;
__attribute__((constructor)) void logger_ready() { g_ready = true; }

}  // namespace

extern "C" __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
  void *r = real_dlsym()(handle, name);
  if (!g_ready) return r;
  Dl_info info{};
  const char *who = "?";
  if (dladdr(__builtin_return_address(0), &info) && info.dli_fname) {
    who = std::strrchr(info.dli_fname, '/') ? std::strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
    if (!*who) who = "?";
  }
  log_line("dlsym %s %s", who, name);
  if (r && std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    g_boot = reinterpret_cast<PFN_cuGetProcAddress_v12000>(r);
    return reinterpret_cast<void *>(&boot_wrapper);
  }
  return r;
}
