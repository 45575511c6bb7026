// SPDX-License-Identifier: Apache-2.0
// How the shim finds the real functions and hands out its wrappers: the real dlsym, one real-pointer
// slot per exact export, and the cuGetProcAddress routing by the pointer the driver returned.
#pragma once

#include <atomic>

#include "cuda_api.h"

namespace cmg::shim {

// The libc dlsym (found with dlvsym, GLIBC_2.34 then 2.2.5). The shim never calls the public dlsym:
// that is its own hook.
void *real_dlsym(void *handle, const char *name);
void ensure_dlsym_ready();

// True when p lies in the shim's own text (a lookup that returns one of our exports must go on to
// the next definition, or a wrapper would call itself).
bool in_self(const void *p);

// The real function behind an API, resolved on first use (RTLD_NEXT, then the loaded libcuda /
// libcudart / libnccl). May be nullptr when the program has no such library. Inline: every hook
// calls it once per call.
extern std::atomic<void *> g_real[kApiCount];
void *real_ptr_slow(Api a);
inline void *real_ptr(Api a) {
  void *p = g_real[static_cast<std::size_t>(a)].load(std::memory_order_acquire);
  return p ? p : real_ptr_slow(a);
}
// Remembers p as the real function of a if none is known yet; false when another is known already.
bool adopt_real(Api a, void *p);
void *wrapper_ptr(Api a);

// How a call reached the shim's wrapper, which decides what the wrapper calls: the definition the
// caller would have reached without the shim on the same way (a limiter or profiler preloaded
// after the shim stays in the chain, and sees what it saw without the shim).
//  Next:  by symbol (the PLT, dlsym finding the export in the global scope): the next definition
//         after the shim in load order (RTLD_NEXT from the shim's own position), real_ptr();
//  Given: by a lookup the shim answered with a wrapper (cuGetProcAddress and
//         cudaGetDriverEntryPoint* routing, a dlsym with a library's handle): what that lookup
//         returned, given_ptr().
enum class Route : std::uint8_t { Next, Given };
extern std::atomic<void *> g_given[kApiCount];
// Remembers p as what the lookups return for a; false when another is remembered already (the
// caller then hands out p itself, unwrapped).
bool adopt_given(Api a, void *p);
// The wrapper to hand out for a lookup whose answer adopt_given() remembered.
void *given_wrapper_ptr(Api a);
template <Route R>
inline void *route_real(Api a) {
  if constexpr (R == Route::Given) {
    if (void *p = g_given[static_cast<std::size_t>(a)].load(std::memory_order_acquire)) return p;
  }
  return real_ptr(a);
}
// The Given wrappers, defined where the hooks are (hooks_driver.cpp, hooks_runtime.cpp,
// hooks_nccl.cpp), in the .def files' order.
extern void *const kGivenDriverWrappers[];
extern void *const kGivenRuntimeWrappers[];
extern void *const kGivenNcclWrappers[];
// Once per family (driver, runtime, NCCL) and process: the line naming what stands after the shim
// when a function of it resolved outside its library (another interposer preloaded after the
// shim), or nullptr. The caller prints it (never from inside a lookup); the check is inline
// because every tracked call makes it.
extern std::atomic<int> g_origin_pending;
const char *take_origin_note_slow();
inline const char *take_origin_note() {
  if (!g_origin_pending.load(std::memory_order_relaxed)) return nullptr;
  return take_origin_note_slow();
}
// The NCCL wrappers, defined where nccl.h is included (hooks_nccl.cpp), in api_nccl.def order.
extern void *const kNcclWrappers[];

// cuGetProcAddress/cudaGetDriverEntryPoint* answered p for `symbol`: returns our wrapper of exactly
// that export, or p itself when we do not wrap it (zero cost for everything we do not intercept).
void *route_proc(void *p, const char *symbol);

// fork(): the routing table's lock is held across it (see state.cpp for the order).
void loader_fork_prepare();
void loader_fork_parent();
void loader_fork_child();

// Reads (and so clears) the runtime's last error, after the shim retried a failed allocation.
void clear_runtime_error();

// The loaded libcuda.so.1 (no load is triggered), or nullptr.
void *libcuda_handle();

// The driver's own export `name` (never a wrapper of the shim), looked up once into `slot`: the one
// way shim code calls the driver for itself (the device of a context, error names, attributes).
// Returns nullptr while the driver is not loaded (tried again on the next call).
void *driver_export(std::atomic<void *> &slot, const char *name);
template <class F>
F driver_fn(std::atomic<void *> &slot, const char *name) {
  return reinterpret_cast<F>(driver_export(slot, name));
}

// CUMEMGUARD_LOG_LEVEL=debug: one raw stderr line per lookup the shim answers or routes.
bool trace_lookups();
void trace_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// CUMEMGUARD_DISABLE, read cheaply (getenv) so it also holds before the options are parsed.
extern std::atomic<int> g_disabled;  // -1 not read yet, 0, 1
bool disabled_slow();
inline bool disabled() {
  int v = g_disabled.load(std::memory_order_relaxed);
  return v < 0 ? disabled_slow() : v == 1;
}

}  // namespace cmg::shim

#define CMG_REAL(name) \
  (reinterpret_cast<decltype(&::name)>(::cmg::shim::real_ptr(::cmg::shim::Api::name)))

// Inside a hook (CMG_HOOK): the real function of the route the call came by.
#define CMG_REAL_R(name) \
  (reinterpret_cast<decltype(&::name)>(::cmg::shim::route_real<kRoute>(::cmg::shim::Api::name)))

// One hook, two entry points: the export `name` (Route::Next) and hook_name<Route::Given>, the
// wrapper lookups hand out. The body is written once, with kRoute in scope; always inlined into
// the export, so __builtin_return_address(0) in it is the program's caller in both.
#define CMG_HOOK(ret, name, params, args)                       \
  template <::cmg::shim::Route kRoute>                          \
  __attribute__((always_inline)) inline ret hook_##name params; \
  CMG_EXPORT ret name params {                                  \
    return hook_##name<::cmg::shim::Route::Next> args;          \
  }                                                             \
  template <::cmg::shim::Route kRoute>                          \
  __attribute__((always_inline)) inline ret hook_##name params
