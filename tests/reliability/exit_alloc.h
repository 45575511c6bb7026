// SPDX-License-Identifier: Apache-2.0
// A test allocator for the exit cases (exit_cases.cpp). A thread that arms it (exit_alloc_arm(),
// from the SIGTERM handler right before it calls exit()) may not allocate or free through the
// shim any more: the thread the signal interrupted may hold the allocator's lock (a block over
// 1 KiB is not served from glibc's per-thread cache; the sanitizer allocators have region and
// quarantine locks), and an allocation on it after exit began would wait for that lock forever.
// The first one the shim makes prints what it was and the stack that asked, then aborts: a hang
// that shows 1 run in 20 becomes a failure every time the shim's path allocates.
//  * Whose allocation: the innermost frame of the stack outside the executable, the loader and
//    the libraries the shim itself links (libc, libm; a sanitized shim's libstdc++ and sanitizer
//    runtime) decides. The shim's frame there: the shim's allocation (abort). Another library's
//    (libcudart, libcuda): not the shim's, counted and let through. On the H200 libcudart.so.13's
//    own destructors free blocks from __cxa_finalize after exit began, with and without the shim
//    (docs/gpu/run-5.txt: 20 of 30 runs "failed" on them); what the driver's libraries do at exit
//    is the same with or without the shim. A frame the unwinder cannot see (a tail call from the
//    shim into free) is missed; the shim's own caller frame above it is not.
//  * Plain build: the program's own malloc family and operator new/delete, which every library of
//    the process reaches (the executable comes first in the loader's lookup order, before the
//    shim), forwarding to the next definition (glibc's).
//  * Sanitized build: the runtime's allocator hooks (__sanitizer_install_malloc_and_free_hooks),
//    called on every malloc, free and operator new of the process. A malloc of the program's own
//    would run instrumented code before the runtime is initialised (the runtime's own start-up
//    looks symbols up, and the loader allocates for it).
//
// Include in exactly one translation unit of a program.
#pragma once

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EXIT_ALLOC_HOOKS 1
// The sanitizer runtimes' allocator hooks (sanitizer/allocator_interface.h, which gcc 12 does not
// install): called on the allocating thread for every block the runtime's allocator hands out or
// takes back.
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *,
                                                                             std::size_t),
                                                         void (*free_hook)(const volatile void *));
#endif

namespace exit_alloc {

using MallocFn = void *(*)(std::size_t);
using FreeFn = void (*)(void *);
using CallocFn = void *(*)(std::size_t, std::size_t);
using ReallocFn = void *(*)(void *, std::size_t);
using MemalignFn = void *(*)(std::size_t, std::size_t);
using PosixMemalignFn = int (*)(void **, std::size_t, std::size_t);

inline MallocFn g_malloc;
inline FreeFn g_free;
inline CallocFn g_calloc;
inline ReallocFn g_realloc;
inline MemalignFn g_memalign, g_aligned_alloc;
inline PosixMemalignFn g_posix_memalign;
inline std::atomic<int> g_ready{0};  // 0 not looked up, 1 looking up, 2 ready

// Armed threads: initial-exec TLS of the executable, readable from a signal handler.
inline thread_local int t_armed __attribute__((tls_model("initial-exec"))) = 0;
inline thread_local int t_resolving __attribute__((tls_model("initial-exec"))) = 0;
inline std::atomic<long> g_after_exit{0};  // allocator calls on armed threads (for the report)

// dlsym() allocates (its error state) while the real functions are looked up: those requests are
// served from here and never freed.
alignas(16) inline unsigned char g_boot[256 * 1024];
inline std::atomic<std::size_t> g_boot_used{0};

inline bool in_boot(const void *p) {
  auto *c = static_cast<const unsigned char *>(p);
  return c >= g_boot && c < g_boot + sizeof g_boot;
}

inline void *boot_alloc(std::size_t n, std::size_t align = 16) {
  // A 16-byte header keeps the size for realloc.
  std::size_t at = g_boot_used.load();
  for (;;) {
    std::size_t start = (at + 16 + align - 1) / align * align;
    std::size_t end = start + n;
    if (end > sizeof g_boot) return nullptr;
    if (g_boot_used.compare_exchange_weak(at, end)) {
      std::memcpy(g_boot + start - 16, &n, sizeof n);
      return g_boot + start;
    }
  }
}

inline std::size_t boot_size(const void *p) {
  std::size_t n;
  std::memcpy(&n, static_cast<const unsigned char *>(p) - 16, sizeof n);
  return n;
}

inline void resolve() {
  int expected = 0;
  if (!g_ready.compare_exchange_strong(expected, 1)) {
    while (g_ready.load() != 2) {
    }
    return;
  }
  t_resolving = 1;
  g_malloc = reinterpret_cast<MallocFn>(dlsym(RTLD_NEXT, "malloc"));
  g_free = reinterpret_cast<FreeFn>(dlsym(RTLD_NEXT, "free"));
  g_calloc = reinterpret_cast<CallocFn>(dlsym(RTLD_NEXT, "calloc"));
  g_realloc = reinterpret_cast<ReallocFn>(dlsym(RTLD_NEXT, "realloc"));
  g_memalign = reinterpret_cast<MemalignFn>(dlsym(RTLD_NEXT, "memalign"));
  g_aligned_alloc = reinterpret_cast<MemalignFn>(dlsym(RTLD_NEXT, "aligned_alloc"));
  g_posix_memalign = reinterpret_cast<PosixMemalignFn>(dlsym(RTLD_NEXT, "posix_memalign"));
  t_resolving = 0;
  g_ready.store(2);
}

inline bool ready() {
  if (g_ready.load(std::memory_order_acquire) == 2) return true;
  if (t_resolving) return false;
  resolve();
  return true;
}

inline void say(const char *s) {
  ssize_t n = ::write(2, s, strlen(s));
  (void)n;
}

// An allocator call on an armed thread: named with its stack, then abort (the test counts it as a
// failure). backtrace() was called once at start, so its unwinder is loaded and it allocates
// nothing now; backtrace_symbols_fd() writes without allocating.
[[noreturn]] inline void fail(const char *what, std::size_t n) {
  t_armed = 0;
  g_after_exit.fetch_add(1);
  char line[160];
  char num[24];
  int k = 0;
  do {
    num[k++] = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n && k < 23);
  std::size_t len = 0;
  auto put = [&](const char *s) {
    while (*s && len + 1 < sizeof line) line[len++] = *s++;
  };
  put("exit-alloc: ");
  put(what);
  put("(");
  while (k && len + 1 < sizeof line) line[len++] = num[--k];
  put(") by the shim on a thread that began exit; called from:\n");
  ssize_t w = ::write(2, line, len);
  (void)w;
  void *pcs[48];
  const int frames = backtrace(pcs, 48);
  backtrace_symbols_fd(pcs, frames, 2);
  abort();
}

// The shim's link map and the link maps whose frames are passed over when finding whose
// allocation it is (see the top of this file), found at warm_up() while allocating is allowed.
inline const link_map *g_shim = nullptr;
inline const link_map *g_through[32];
inline int g_through_n = 0;
inline std::atomic<long> g_foreign{0};  // allocations on armed threads by other libraries
inline thread_local int t_checking __attribute__((tls_model("initial-exec"))) = 0;

inline bool passed_over(const link_map *m) {
  for (int i = 0; i < g_through_n; ++i)
    if (g_through[i] == m) return true;
  return false;
}

inline void add_through(const link_map *m) {
  if (m && m != g_shim && !passed_over(m) && g_through_n < 32) g_through[g_through_n++] = m;
}

// The libraries a link map names as DT_NEEDED, added with theirs in turn (libc needs the loader).
inline void add_needed(const link_map *m) {
  const char *strtab = nullptr;
  for (const ElfW(Dyn) *d = m->l_ld; d->d_tag != DT_NULL; ++d)
    if (d->d_tag == DT_STRTAB) {
      // glibc relocates the dynamic section's addresses in place; a loader that does not leaves
      // them as offsets from the load address.
      const ElfW(Addr) a = d->d_un.d_ptr;
      strtab = reinterpret_cast<const char *>(a < m->l_addr ? a + m->l_addr : a);
    }
  if (!strtab) return;
  for (const ElfW(Dyn) *d = m->l_ld; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag != DT_NEEDED) continue;
    void *h = dlopen(strtab + d->d_un.d_val, RTLD_LAZY | RTLD_NOLOAD);
    link_map *dep = nullptr;
    if (!h || dlinfo(h, RTLD_DI_LINKMAP, &dep) != 0 || !dep) continue;
    const bool fresh = dep != g_shim && !passed_over(dep);
    add_through(dep);
    if (fresh) add_needed(dep);
    dlclose(h);
  }
}

// The shim found by one of its exported functions, when it is loaded; the executable is always
// passed over (its malloc, its operator new, its own destructors).
inline void find_shim() {
  void *exe = dlopen(nullptr, RTLD_LAZY);
  link_map *m = nullptr;
  if (exe && dlinfo(exe, RTLD_DI_LINKMAP, &m) == 0) add_through(m);
  void *sym = dlsym(RTLD_DEFAULT, "cumemguard_version");
  Dl_info info;
  void *extra = nullptr;
  if (!sym || !dladdr1(sym, &info, &extra, RTLD_DL_LINKMAP) || !extra) return;
  g_shim = static_cast<const link_map *>(extra);
  add_needed(g_shim);
}

// The link map of the first frame of `pcs` (innermost first) outside those passed over: the
// library whose allocation it is (null: none, the program's or libc's own).
inline const link_map *owner(void *const *pcs, int frames) {
  for (int i = 0; i < frames; ++i) {
    Dl_info info;
    void *extra = nullptr;
    // A return address points after the call: one byte back is inside the calling function.
    void *pc = static_cast<char *>(pcs[i]) - 1;
    if (!dladdr1(pc, &info, &extra, RTLD_DL_LINKMAP) || !extra) continue;
    const auto *m = static_cast<const link_map *>(extra);
    if (!passed_over(m)) return m;
  }
  return nullptr;
}

inline void check(const char *what, std::size_t n) {
  if (!t_armed || t_checking) [[likely]]
    return;
  t_checking = 1;  // backtrace() and dladdr1() on this thread are not checked themselves
  void *pcs[48];
  const int frames = backtrace(pcs, 48);
  const link_map *m = owner(pcs, frames);
  t_checking = 0;
  if (m && m == g_shim) fail(what, n);
  if (m) g_foreign.fetch_add(1);
}

#ifdef EXIT_ALLOC_HOOKS
inline void on_malloc(const volatile void *, std::size_t n) {
  check("malloc", n);
}
inline void on_free(const volatile void *) {
  check("free", 0);
}
#endif

// Called once at start: loads backtrace()'s unwinder while allocating is still allowed.
inline void warm_up() {
  void *pcs[4];
  (void)backtrace(pcs, 4);
  find_shim();
#ifdef EXIT_ALLOC_HOOKS
  __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
#else
  (void)ready();
#endif
}

}  // namespace exit_alloc

// From now on this thread may not allocate or free (async-signal-safe: one TLS store).
inline void exit_alloc_arm() {
  exit_alloc::t_armed = 1;
}

inline void exit_alloc_disarm() {
  exit_alloc::t_armed = 0;
}

#ifndef EXIT_ALLOC_HOOKS
extern "C" {
void *malloc(std::size_t n) {
  if (!exit_alloc::ready()) return exit_alloc::boot_alloc(n);
  exit_alloc::check("malloc", n);
  return exit_alloc::g_malloc(n);
}
void free(void *p) {
  if (!p || exit_alloc::in_boot(p)) return;
  exit_alloc::check("free", 0);
  if (exit_alloc::ready()) exit_alloc::g_free(p);
}
void *calloc(std::size_t n, std::size_t size) {
  if (!exit_alloc::ready()) {
    if (size && n > SIZE_MAX / size) return nullptr;
    void *p = exit_alloc::boot_alloc(n * size);
    if (p) std::memset(p, 0, n * size);  // the arena is zero, but say so
    return p;
  }
  exit_alloc::check("calloc", n * size);
  return exit_alloc::g_calloc(n, size);
}
void *realloc(void *p, std::size_t n) {
  if (p && exit_alloc::in_boot(p)) {
    void *q = malloc(n);
    const std::size_t old = exit_alloc::boot_size(p);
    if (q) std::memcpy(q, p, old < n ? old : n);
    return q;
  }
  if (!exit_alloc::ready()) return exit_alloc::boot_alloc(n);  // p is null here
  exit_alloc::check("realloc", n);
  return exit_alloc::g_realloc(p, n);
}
void *memalign(std::size_t align, std::size_t n) {
  if (!exit_alloc::ready()) return exit_alloc::boot_alloc(n, align < 16 ? 16 : align);
  exit_alloc::check("memalign", n);
  return exit_alloc::g_memalign(align, n);
}
void *aligned_alloc(std::size_t align, std::size_t n) {
  if (!exit_alloc::ready()) return exit_alloc::boot_alloc(n, align < 16 ? 16 : align);
  exit_alloc::check("aligned_alloc", n);
  return exit_alloc::g_aligned_alloc(align, n);
}
int posix_memalign(void **out, std::size_t align, std::size_t n) {
  if (!exit_alloc::ready()) {
    *out = exit_alloc::boot_alloc(n, align < 16 ? 16 : align);
    return *out ? 0 : 12;
  }
  exit_alloc::check("posix_memalign", n);
  return exit_alloc::g_posix_memalign(out, align, n);
}
}

// operator new and delete as well: a sanitizer runtime serves them itself, without passing
// through malloc (and a sanitized shim links libstdc++ dynamically), so they are routed through
// the functions above.
namespace exit_alloc {
inline void *new_block(std::size_t n) {
  if (void *p = malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
inline void *new_aligned(std::size_t n, std::align_val_t a) {
  void *p = nullptr;
  const std::size_t align =
      static_cast<std::size_t>(a) < sizeof(void *) ? sizeof(void *) : static_cast<std::size_t>(a);
  if (posix_memalign(&p, align, n ? n : 1) != 0) throw std::bad_alloc();
  return p;
}
}  // namespace exit_alloc

void *operator new(std::size_t n) {
  return exit_alloc::new_block(n);
}
void *operator new[](std::size_t n) {
  return exit_alloc::new_block(n);
}
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
  return malloc(n ? n : 1);
}
void *operator new[](std::size_t n, const std::nothrow_t &) noexcept {
  return malloc(n ? n : 1);
}
void *operator new(std::size_t n, std::align_val_t a) {
  return exit_alloc::new_aligned(n, a);
}
void *operator new[](std::size_t n, std::align_val_t a) {
  return exit_alloc::new_aligned(n, a);
}
void operator delete(void *p) noexcept {
  free(p);
}
void operator delete[](void *p) noexcept {
  free(p);
}
void operator delete(void *p, std::size_t) noexcept {
  free(p);
}
void operator delete[](void *p, std::size_t) noexcept {
  free(p);
}
void operator delete(void *p, std::align_val_t) noexcept {
  free(p);
}
void operator delete[](void *p, std::align_val_t) noexcept {
  free(p);
}
void operator delete(void *p, std::size_t, std::align_val_t) noexcept {
  free(p);
}
void operator delete[](void *p, std::size_t, std::align_val_t) noexcept {
  free(p);
}
#endif  // EXIT_ALLOC_HOOKS
