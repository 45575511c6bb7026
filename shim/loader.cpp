// SPDX-License-Identifier: Apache-2.0
// Finding real functions and handing out wrappers: the dlsym hook's C half, the real-pointer slots,
// and cuGetProcAddress routing by pointer identity (interposers.md 10.2: call the real lookup, then
// map the exact export it returned to the wrapper of that exact export).
#include "loader.h"
#include "stderr_out.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <mutex>
#include <string_view>

#include "objects.h"
#include "options.h"


namespace cmg::shim {

std::atomic<void *> g_real[kApiCount];
std::atomic<void *> g_given[kApiCount];
std::atomic<int> g_disabled{-1};

const ApiInfo kApis[kApiCount] = {
#define CMG_DRV(n, b, t) {#n, #b, Family::Driver, sizeof(#n) - 1},
#include "api_driver.def"
#undef CMG_DRV
#define CMG_RT(n, d) {#n, #d, Family::Runtime, sizeof(#n) - 1},
#include "api_runtime.def"
#undef CMG_RT
#define CMG_NCCL(n, e) {#n, #e, Family::Nccl, sizeof(#n) - 1},
#include "api_nccl.def"
#undef CMG_NCCL
};

namespace {

// Each row's wrapper must have exactly the type of the variant it stands for.
#define CMG_DRV(n, b, t) static_assert(std::is_same_v<decltype(&::n), t>, #n " has the wrong ABI");
#include "api_driver.def"
#undef CMG_DRV

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void *const kWrappers[] = {
#define CMG_DRV(n, b, t) reinterpret_cast<void *>(&::n),
#include "api_driver.def"
#undef CMG_DRV
#define CMG_RT(n, d) reinterpret_cast<void *>(&::n),
#include "api_runtime.def"
#undef CMG_RT
};
#pragma GCC diagnostic pop
constexpr std::size_t kFirstNccl = sizeof(kWrappers) / sizeof(kWrappers[0]);
constexpr std::size_t kFirstRuntime = 0
#define CMG_DRV(n, b, t) +1
#include "api_driver.def"
#undef CMG_DRV
    ;

// Names the dlsym hook answers itself, sorted at compile time for a binary search.
struct NameEntry {
  std::string_view name;
  Api api;
};
constexpr auto kSortedNames = [] {
  std::array<NameEntry, kApiCount> a{};
  std::size_t i = 0;
#define CMG_DRV(n, b, t) a[i++] = {#n, Api::n};
#include "api_driver.def"
#undef CMG_DRV
#define CMG_RT(n, d) a[i++] = {#n, Api::n};
#include "api_runtime.def"
#undef CMG_RT
#define CMG_NCCL(n, e) a[i++] = {#n, Api::n};
#include "api_nccl.def"
#undef CMG_NCCL
  std::sort(a.begin(), a.end(), [](const NameEntry &x, const NameEntry &y) { return x.name < y.name; });
  return a;
}();

const NameEntry *find_name(const char *name) {
  if (!name) return nullptr;
  std::string_view n(name);
  auto it = std::lower_bound(kSortedNames.begin(), kSortedNames.end(), n,
                             [](const NameEntry &e, std::string_view k) { return e.name < k; });
  return (it != kSortedNames.end() && it->name == n) ? &*it : nullptr;
}

// --- the shim's own address range ------------------------------------------------------------
extern "C" char __ehdr_start;  // start of our own ELF image (provided by the linker)
std::atomic<std::uintptr_t> g_self_lo{0}, g_self_hi{0};

void find_self() {
  struct Ctx {
    std::uintptr_t want, lo, hi;
  } ctx{reinterpret_cast<std::uintptr_t>(&__ehdr_start), 0, 0};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) -> int {
        auto *c = static_cast<Ctx *>(data);
        const auto [lo, hi] = load_range(info);
        if (c->want >= lo && c->want < hi) {
          c->lo = lo;
          c->hi = hi;
          return 1;
        }
        return 0;
      },
      &ctx);
  g_self_hi.store(ctx.hi);
  g_self_lo.store(ctx.lo);
}

// --- real dlsym ---------------------------------------------------------------------------
using dlsym_fn = void *(*)(void *, const char *);

}  // namespace
}  // namespace cmg::shim

// Used by the assembly trampoline (dlsym_x86_64.S): hidden, so it is reached without the GOT.
extern "C" {
__attribute__((visibility("hidden"))) cmg::shim::dlsym_fn cmg_real_dlsym_ptr = nullptr;

// A sanitizer runtime preloaded before the shim looks up its real functions with dlsym while it
// initialises, which reaches our dlsym before the sanitizer can run instrumented code (its shadow
// memory does not exist yet): until the shim's constructor has run, the trampoline goes straight
// to the real dlsym through cmg_dlsym_early, which is built without instrumentation. A normal build
// has no such runtime and answers from the first lookup on.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
__attribute__((visibility("hidden"))) int cmg_dlsym_ready = 0;
#else
__attribute__((visibility("hidden"))) int cmg_dlsym_ready = 1;
#endif

__attribute__((visibility("hidden"), no_sanitize("address", "thread", "undefined"))) void *
cmg_dlsym_early() {
  void *f = __atomic_load_n(reinterpret_cast<void **>(&cmg_real_dlsym_ptr), __ATOMIC_ACQUIRE);
  if (!f) {
    f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!f) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    __atomic_store_n(reinterpret_cast<void **>(&cmg_real_dlsym_ptr), f, __ATOMIC_RELEASE);
  }
  return f;
}
}

namespace cmg::shim {

namespace {
dlsym_fn ensure_real_dlsym() {
  dlsym_fn f = __atomic_load_n(&cmg_real_dlsym_ptr, __ATOMIC_ACQUIRE);
  if (!f) {
    // Newest version first: a program linked against dlsym@GLIBC_2.34 must not get the compat
    // symbol (vgpu-manager loader.c notes their RTLD_NEXT walks differ).
    f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (!f) f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    if (!f) f = reinterpret_cast<dlsym_fn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"));
    __atomic_store_n(&cmg_real_dlsym_ptr, f, __ATOMIC_RELEASE);
  }
  return f;
}
}  // namespace

void *real_dlsym(void *handle, const char *name) {
  dlsym_fn f = ensure_real_dlsym();
  return f ? f(handle, name) : nullptr;
}

void ensure_dlsym_ready() { (void)ensure_real_dlsym(); }

bool in_self(const void *p) {
  if (!g_self_lo.load(std::memory_order_relaxed)) find_self();
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return a >= g_self_lo.load(std::memory_order_relaxed) &&
         a < g_self_hi.load(std::memory_order_relaxed);
}

bool disabled_slow() {
  bool b = false;
  const char *e = std::getenv("CUMEMGUARD_DISABLE");
  if (e) parse_bool(e, b);
  g_disabled.store(b ? 1 : 0, std::memory_order_relaxed);
  return b;
}

bool trace_lookups() {
  static std::atomic<int> cached{-1};
  int v = cached.load(std::memory_order_relaxed);
  if (v < 0) {
    const char *e = std::getenv("CUMEMGUARD_LOG_LEVEL");
    v = (e && std::strcmp(e, "debug") == 0) ? 1 : 0;
    cached.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// A raw stderr line "cumemguard[PID]: " + fmt (the same prefix as diag.cpp's lines).
void trace_line(const char *fmt, ...) {
  char buf[512];
  int pre = std::snprintf(buf, sizeof buf, "cumemguard[%d]: ", static_cast<int>(getpid()));
  if (pre < 0) pre = 0;
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf + pre, sizeof buf - 1 - static_cast<std::size_t>(pre), fmt, ap);
  va_end(ap);
  if (n < 0) return;
  n += pre;
  std::size_t len = std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 2);
  buf[len++] = '\n';
  stderr_write(std::string_view(buf, len));  // raw: this runs inside dlsym and the driver's lookups
}

const char *module_of(const void *p) {
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fname) return "?";
  const char *slash = std::strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

void *libcuda_handle() {
  static std::atomic<void *> h{nullptr};
  void *v = h.load(std::memory_order_acquire);
  if (!v) {
    v = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (v) h.store(v, std::memory_order_release);
  }
  return v;
}

namespace {

// A handle for the object that contains addr, usable with dlsym. A link_map pointer is not: for
// objects loaded at startup glibc has not set up their own search list, and dlsym on it crashes.
// The reference taken here is kept, so the object (libcuda above all) is never unloaded under
// pointers the shim still holds.
void *handle_of(const void *addr) {
  Dl_info info;
  link_map *lm = nullptr;
  if (!dladdr1(addr, &info, reinterpret_cast<void **>(&lm), RTLD_DL_LINKMAP) || !lm) return nullptr;
  if (!lm->l_name || !lm->l_name[0]) return dlopen(nullptr, RTLD_LAZY);
  return dlopen(lm->l_name, RTLD_NOLOAD | RTLD_LAZY);
}

// Last resort: the first definition in any loaded object whose path contains `hint`.
void *in_any_object(const char *hint, const char *name) {
  struct Ctx {
    const char *hint, *name;
    void *found = nullptr;
  } ctx{hint, name};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) -> int {
        auto *c = static_cast<Ctx *>(data);
        if (!info->dlpi_name || !std::strstr(info->dlpi_name, c->hint)) return 0;
        void *h = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
        if (!h) return 0;
        void *p = real_dlsym(h, c->name);
        if (p && !in_self(p)) {
          c->found = p;
          return 1;
        }
        return 0;
      },
      &ctx);
  return ctx.found;
}

// What a hook calls when the real function cannot be found at all (a runtime loaded under a name
// and scope the shim cannot reach): every wrapped function returns an int-sized status, and 3 is
// CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError and ncclInternalError alike. Extra
// arguments are harmless to a function that takes none in the x86-64 and AArch64 calling conventions.
extern "C" int cmg_missing_real() { return 3; }
static_assert(CUDA_ERROR_NOT_INITIALIZED == 3 && cudaErrorInitializationError == 3);

void *next_definition(const char *name) {
  void *p = real_dlsym(RTLD_NEXT, name);
  return (p && !in_self(p)) ? p : nullptr;
}

void *in_library(const char *soname, const char *name) {
  void *h = dlopen(soname, RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return nullptr;
  void *p = real_dlsym(h, name);
  dlclose(h);  // only drops the reference NOLOAD added
  return (p && !in_self(p)) ? p : nullptr;
}

// Every object the shim holds a real pointer into stays loaded for the life of the process: a
// wrapper handed out earlier (by dlsym, cuGetProcAddress or the PLT) must never call into a library
// that dlclose() unmapped and a later dlopen() mapped elsewhere (tests/reliability dl-reload).
void pin_object_of(void *p) {
  static std::atomic<std::uintptr_t> pinned[8];
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fname || !info.dli_fbase) return;
  const auto base = reinterpret_cast<std::uintptr_t>(info.dli_fbase);
  for (auto &slot : pinned) {
    std::uintptr_t v = slot.load(std::memory_order_acquire);
    if (v == base) return;
    if (v == 0 && slot.compare_exchange_strong(v, base)) break;
    if (v == base) return;
  }
  // NOLOAD: never loads anything; NODELETE: the object outlives every dlclose. The reference this
  // returns is kept on purpose.
  (void)dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
}

// A function that does not live in its own library (libcuda, libcudart, libnccl) means another
// interposer stands after the shim (preloaded after it). The chain works: the shim calls it for
// every call that reached the shim by symbol. The user is told once per family, at the next call,
// what stands there, since the library's answers now reach the program through it.
// The main program is the first object dl_iterate_phdr() visits.
bool in_main_program(const void *p) {
  struct Ctx {
    std::uintptr_t a;
    bool in = false;
  } ctx{reinterpret_cast<std::uintptr_t>(p)};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) -> int {
        auto *c = static_cast<Ctx *>(data);
        const auto [lo, hi] = load_range(info);
        c->in = c->a >= lo && c->a < hi;
        return 1;  // the first object only
      },
      &ctx);
  return ctx.in;
}

std::atomic<bool> g_foreign_reported[3];
std::atomic<const char *> g_origin_note[3];

void check_origin(Api a, void *p) {
  const auto fam = static_cast<std::size_t>(kApis[static_cast<std::size_t>(a)].family);
  if (g_foreign_reported[fam].load(std::memory_order_relaxed)) return;
  Dl_info info;
  if (!dladdr(p, &info) || !info.dli_fname) return;
  const char *slash = std::strrchr(info.dli_fname, '/');
  const char *base = slash ? slash + 1 : info.dli_fname;
  static const char *const own[] = {"libcuda.so", "libcudart", "libnccl"};
  static const char *const what[] = {"the driver", "the CUDA runtime", "NCCL"};
  if (std::strncmp(base, own[fam], std::strlen(own[fam])) == 0) return;
  // A runtime or NCCL linked into the program itself (static cudart) is no interposer.
  if (fam != 0 && in_main_program(p)) return;
  if (g_foreign_reported[fam].exchange(true)) return;
  static char msg[3][768];
  std::snprintf(msg[fam], sizeof msg[fam],
                "%s resolves to %s, not %s: another interposer stands after the shim (preloaded "
                "after it); the shim calls it, and %s's answers reach the program through it",
                api_name(a), info.dli_fname, fam == 0 ? "libcuda" : own[fam], what[fam]);
  g_origin_note[fam].store(msg[fam], std::memory_order_release);
  g_origin_pending.fetch_add(1, std::memory_order_release);
}

void *resolve(Api a) {
  const ApiInfo &info = kApis[static_cast<std::size_t>(a)];
  void *p = nullptr;
  switch (info.family) {
    case Family::Driver:
      p = next_definition(info.name);
      if (!p) p = in_library("libcuda.so.1", info.name);
      if (!p) p = in_any_object("libcuda", info.name);
      break;
    case Family::Runtime:
      p = next_definition(info.name);
      if (!p) p = in_library("libcudart.so.13", info.name);
      if (!p) p = in_library("libcudart.so.12", info.name);
      // A runtime loaded RTLD_LOCAL under another name (libcudart.so.11.0, a wheel's renamed copy).
      if (!p) p = in_any_object("cudart", info.name);
      break;
    case Family::Nccl: {
      char strong[64] = "p";
      std::strncat(strong, info.name, sizeof strong - 2);
      p = next_definition(strong);
      if (!p) p = next_definition(info.name);
      if (!p) p = in_library("libnccl.so.2", strong);
      if (!p) p = in_any_object("nccl", strong);
      if (!p) p = in_any_object("nccl", info.name);
      break;
    }
  }
  if (!p) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      trace_line("warning: cannot find the real %s in this process; the shim answers "
                 "'not initialized' for it", info.name);
    p = reinterpret_cast<void *>(&cmg_missing_real);
  }
  return p;
}

// cuGetProcAddress routing table: real export address -> row, built from the object that answered.
struct RouteEntry {
  std::uintptr_t addr;
  Api api;
};
std::mutex g_route_mu;
std::atomic<bool> g_route_ready{false};
std::array<RouteEntry, kApiCount> g_route{};
std::size_t g_route_n = 0;

void build_routes(void *from) {
  // The lookups run without the lock: dlsym takes the loader's lock, and a dlopen whose
  // constructor asks cuGetProcAddress must not find this thread holding ours.
  void *h = handle_of(from);
  if (!h) h = libcuda_handle();
  if (!h) return;
  std::array<RouteEntry, kApiCount> table{};
  std::size_t n = 0;
#define CMG_DRV(nm, b, t)                                              \
  if (void *p = real_dlsym(h, #nm); p && !in_self(p))                  \
    table[n++] = RouteEntry{reinterpret_cast<std::uintptr_t>(p), Api::nm};
#include "api_driver.def"
#undef CMG_DRV
  // Aliases that share one address keep the first row: they share one ABI.
  std::stable_sort(table.begin(), table.begin() + static_cast<long>(n),
                   [](const RouteEntry &x, const RouteEntry &y) { return x.addr < y.addr; });
  std::lock_guard lk(g_route_mu);
  if (g_route_ready.load()) return;
  g_route = table;
  g_route_n = n;
  g_route_ready.store(true, std::memory_order_release);
}

// Base names that have a single ABI variant: a pointer the table does not know (an internal
// driver entry) can still be adopted for them without risk of a wrong signature. A row qualifies
// only when its export carries no suffix and no other row shares its base: cuMemAlloc, whose
// 32-bit v1 export the table does not list, must never get the _v2 wrapper.
bool single_variant(std::string_view base, Api &out) {
  int hits = 0;
  bool plain = false;
#define CMG_DRV(n, b, t)                 \
  if (base == #b) {                      \
    out = Api::n;                        \
    ++hits;                              \
    plain = std::string_view(#n) == #b;  \
  }
#include "api_driver.def"
#undef CMG_DRV
  return hits == 1 && plain;
}

}  // namespace

void *driver_export(std::atomic<void *> &slot, const char *name) {
  void *p = slot.load(std::memory_order_acquire);
  if (p) return p;
  void *h = libcuda_handle();
  if (!h) return nullptr;
  p = real_dlsym(h, name);
  if (p) slot.store(p, std::memory_order_release);
  return p;
}

void clear_runtime_error() {
  static std::atomic<void *> fn{nullptr};
  void *f = fn.load(std::memory_order_relaxed);
  if (!f) {
    f = next_definition("cudaGetLastError");
    if (!f) f = in_library("libcudart.so.13", "cudaGetLastError");
    if (!f) f = in_any_object("cudart", "cudaGetLastError");
    if (!f) return;
    fn.store(f, std::memory_order_relaxed);
  }
  (void)reinterpret_cast<cudaError_t (*)()>(f)();
}

void loader_fork_prepare() { g_route_mu.lock(); }
void loader_fork_parent() { g_route_mu.unlock(); }
void loader_fork_child() { g_route_mu.unlock(); }

void *real_ptr_slow(Api a) {
  auto &slot = g_real[static_cast<std::size_t>(a)];
  void *p = slot.load(std::memory_order_acquire);
  if (p) return p;
  p = resolve(a);
  if (!p) return nullptr;
  void *expected = nullptr;
  if (!slot.compare_exchange_strong(expected, p)) return expected;
  pin_object_of(p);
  check_origin(a, p);
  return p;
}

bool adopt_real(Api a, void *p) {
  if (!p || in_self(p)) return false;
  auto &slot = g_real[static_cast<std::size_t>(a)];
  void *expected = nullptr;
  if (slot.compare_exchange_strong(expected, p)) {
    pin_object_of(p);
    return true;
  }
  return expected == p;
}

bool adopt_given(Api a, void *p) {
  if (!p || in_self(p)) return false;
  auto &slot = g_given[static_cast<std::size_t>(a)];
  void *expected = nullptr;
  if (slot.compare_exchange_strong(expected, p)) {
    pin_object_of(p);
    return true;
  }
  return expected == p;
}

std::atomic<int> g_origin_pending{0};

const char *take_origin_note_slow() {
  for (auto &n : g_origin_note)
    if (n.load(std::memory_order_relaxed))
      if (const char *m = n.exchange(nullptr, std::memory_order_acquire)) {
        g_origin_pending.fetch_sub(1, std::memory_order_relaxed);
        return m;
      }
  return nullptr;
}

void *wrapper_ptr(Api a) {
  auto i = static_cast<std::size_t>(a);
  return i < kFirstNccl ? kWrappers[i] : kNcclWrappers[i - kFirstNccl];
}

void *given_wrapper_ptr(Api a) {
  auto i = static_cast<std::size_t>(a);
  switch (kApis[i].family) {
    case Family::Driver:
      return kGivenDriverWrappers[i];
    case Family::Runtime:
      return kGivenRuntimeWrappers[i - kFirstRuntime];
    case Family::Nccl:
      return kGivenNcclWrappers[i - kFirstNccl];
  }
  return nullptr;
}

void *route_proc(void *p, const char *symbol) {
  if (!p || disabled() || in_self(p)) return p;
  if (!g_route_ready.load(std::memory_order_acquire)) build_routes(p);
  auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto *end = g_route.begin() + static_cast<long>(g_route_n);
  auto it = std::lower_bound(g_route.begin(), end, addr,
                             [](const RouteEntry &e, std::uintptr_t k) { return e.addr < k; });
  void *out = p;
  Api a;
  // The wrapper handed out calls what the driver answered (Route::Given): a caller that reaches a
  // driver function this way would reach exactly that without the shim.
  if (it != end && it->addr == addr) {
    if (adopt_given(it->api, p)) out = given_wrapper_ptr(it->api);
  } else if (symbol && single_variant(symbol, a) && adopt_given(a, p)) {
    out = given_wrapper_ptr(a);
  }
  if (trace_lookups())
    trace_line("debug: lookup %s -> %p in %s%s", symbol ? symbol : "?", p,
               module_of(p), out != p ? " (wrapped)" : "");
  return out;
}

}  // namespace cmg::shim

// ---------------------------------------------------------------------------------------------
// The dlsym hook. The exported `dlsym` is an assembly trampoline (dlsym_x86_64.S): it asks
// cmg_dlsym_wanted(name) and, for every name we do not answer, *jumps* to the real dlsym so glibc
// still sees the caller's return address (RTLD_NEXT and RTLD_DEFAULT are resolved relative to the
// caller; a forwarding call would make them relative to the shim: the OpenMP ompt_start_tool loop
// seen under another interposer, interposers.md 10.3).
using cmg::shim::Api;

extern "C" __attribute__((visibility("hidden"))) int cmg_dlsym_wanted(void *handle,
                                                                      const char *name) {
  cmg::shim::ensure_dlsym_ready();  // the trampoline jumps through the pointer this sets
  if (!name || (name[0] != 'c' && name[0] != 'n')) return 0;
  // RTLD_NEXT keeps glibc's exact meaning for every name: the shim's exports sit in the global
  // search order, so a caller before the shim gets our wrapper and one after it gets the next
  // definition (another interposer chained after us, torch_memory_saver-style, must not be handed
  // its own function back).
  if (handle == RTLD_NEXT) return 0;
  if (cmg::shim::disabled()) return 0;
  return cmg::shim::find_name(name) ? 1 : 0;
}

// Only reached when the real dlsym could not be found at all (no dlvsym answer).
extern "C" __attribute__((visibility("hidden"))) void *cmg_dlsym_slow(void *handle,
                                                                       const char *name, void *) {
  return cmg::shim::real_dlsym(handle, name);
}

extern "C" __attribute__((visibility("hidden"))) void *cmg_dlsym_answer(void *handle,
                                                                         const char *name,
                                                                         void *caller) {
  using namespace cmg::shim;
  const NameEntry *e = find_name(name);
  void *p = real_dlsym(handle, name);
  void *out = p;
  if (p && in_self(p)) {
    // The global scope found our own export: the caller gets it, as it would by symbol, and it
    // calls the next definition in load order (Route::Next).
  } else {
    if (!p && handle == RTLD_DEFAULT && caller) {
      // The caller's own local scope (a library dlopen()ed RTLD_LOCAL with libcuda as a
      // dependency) is part of what RTLD_DEFAULT searches for it.
      if (void *h = handle_of(caller)) p = real_dlsym(h, name);
      if (p && in_self(p)) p = nullptr;
    }
    // A library's own definition (a handle's scope): the wrapper calls exactly it.
    out = (!p || !e) ? p : (adopt_given(e->api, p) ? given_wrapper_ptr(e->api) : p);
  }
  if (trace_lookups())
    trace_line("debug: dlsym(%p, %s) from %s -> %p in %s%s", handle, name,
               module_of(caller), p, module_of(p), out != p ? " (wrapped)" : "");
  return out;
}

#if !defined(__x86_64__)
// Without the trampoline a plain tail call is the best available: exact for handle-scoped lookups,
// which is what cudart, NCCL and ctypes do.
extern "C" __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
  if (cmg_dlsym_wanted(handle, name))
    return cmg_dlsym_answer(handle, name, __builtin_return_address(0));
  return cmg::shim::real_dlsym(handle, name);
}
#endif
