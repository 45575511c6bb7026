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
// Once per process: the line saying a driver function resolved outside libcuda (another
// interposer after the shim), or nullptr. The caller prints it (never from inside a lookup); the
// check is inline because every tracked call makes it.
extern std::atomic<const char *> g_origin_note;
inline const char *take_origin_note() {
  if (!g_origin_note.load(std::memory_order_relaxed)) return nullptr;
  return g_origin_note.exchange(nullptr, std::memory_order_acquire);
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
