// SPDX-License-Identifier: Apache-2.0
// Stack capture at the bottom of a 48-frame call chain, 8/16/32 frames kept: libgcc's
// _Unwind_Backtrace (what the shim linked before), glibc backtrace() (libgcc_s underneath), the
// shim's cached walker (shim/stackwalk.cpp, what it uses now), libunwind's unw_backtrace (loaded
// with dlopen, RTLD_LOCAL: linked, libunwind.so.8 would replace _Unwind_Backtrace and backtrace()
// of the others), and a frame-pointer walk (only correct where every frame keeps a frame pointer,
// which PyTorch and CPython wheels do not: the lower bound of what any walker could cost).
#include <benchmark/benchmark.h>
#include <execinfo.h>
#include <pthread.h>
#include <unwind.h>

#include <cstdint>

#include <dlfcn.h>

#include "stackwalk.h"

// libunwind, for comparison only: Debian's static libunwind.a is not position-independent
// (R_X86_64_32 relocations) and needs liblzma, so the shim cannot link it (docs/performance.md).
using unw_backtrace_fn = int (*)(void **, int);
unw_backtrace_fn libunwind_backtrace() {
  static unw_backtrace_fn f = [] {
    void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    return h ? reinterpret_cast<unw_backtrace_fn>(dlsym(h, "unw_backtrace")) : nullptr;
  }();
  return f;
}

namespace {

struct Frames {
  std::uintptr_t pc[64];
  int n = 0, max = 0;
};

_Unwind_Reason_Code on_frame(_Unwind_Context *uc, void *arg) {
  auto *f = static_cast<Frames *>(arg);
  std::uintptr_t pc = _Unwind_GetIP(uc);
  if (!pc) return _URC_END_OF_STACK;
  f->pc[f->n++] = pc;
  return f->n >= f->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

__attribute__((noinline)) int capture_libgcc(int max) {
  Frames f;
  f.max = max;
  _Unwind_Backtrace(on_frame, &f);
  return f.n;
}

__attribute__((noinline)) int capture_glibc(int max) {
  void *pcs[64];
  return backtrace(pcs, max);
}

__attribute__((noinline)) int capture_libunwind(int max) {
  void *pcs[64];
  return libunwind_backtrace()(pcs, max);
}

__attribute__((noinline)) int capture_cached(int max) {
  std::uintptr_t pcs[64];
  return cmg::shim::cached_backtrace(pcs, max, nullptr);
}

// Follows saved rbp values, checked against this thread's stack bounds.
__attribute__((noinline)) int capture_fp(int max) {
  thread_local std::uintptr_t lo = 0, hi = 0;
  if (!hi) {
    pthread_attr_t a;
    void *addr;
    std::size_t size;
    pthread_getattr_np(pthread_self(), &a);
    pthread_attr_getstack(&a, &addr, &size);
    pthread_attr_destroy(&a);
    lo = reinterpret_cast<std::uintptr_t>(addr);
    hi = lo + size;
  }
  std::uintptr_t pcs[64];
  int n = 0;
  auto *fp = static_cast<std::uintptr_t *>(__builtin_frame_address(0));
  while (n < max) {
    auto a = reinterpret_cast<std::uintptr_t>(fp);
    if (a < lo || a + 16 > hi || (a & 7)) break;
    pcs[n++] = fp[1];
    auto *next = reinterpret_cast<std::uintptr_t *>(fp[0]);
    if (next <= fp) break;
    fp = next;
  }
  benchmark::DoNotOptimize(pcs);
  return n;
}

template <int (*Capture)(int)>
__attribute__((noinline)) void descend(benchmark::State &st, int depth) {
  if (depth > 0) {
    descend<Capture>(st, depth - 1);
    benchmark::ClobberMemory();  // keeps the recursion a real call chain
    return;
  }
  const int frames = static_cast<int>(st.range(0));
  int got = 0;
  for (auto _ : st) got = Capture(frames);
  st.counters["frames"] = got;
}

template <int (*Capture)(int)>
void BM_capture(benchmark::State &st) {
  if (Capture == capture_libunwind && !libunwind_backtrace()) {
    st.SkipWithError("libunwind.so.8 not installed");
    return;
  }
  descend<Capture>(st, 48);
}

BENCHMARK_TEMPLATE(BM_capture, capture_libgcc)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK_TEMPLATE(BM_capture, capture_glibc)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK_TEMPLATE(BM_capture, capture_fp)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK_TEMPLATE(BM_capture, capture_cached)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK_TEMPLATE(BM_capture, capture_libunwind)->Arg(8)->Arg(16)->Arg(32);

}  // namespace

BENCHMARK_MAIN();
