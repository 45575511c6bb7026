// SPDX-License-Identifier: Apache-2.0
// How the shim finds the real functions and hands out its wrappers: the real dlsym, one real-pointer
// slot per exact export, and the cuGetProcAddress routing by the pointer the driver returned.
#pragma once

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
// libcudart / libnccl). May be nullptr when the program has no such library.
void *real_ptr(Api a);
// Remembers p as the real function of a if none is known yet; false when another is known already.
bool adopt_real(Api a, void *p);
void *wrapper_ptr(Api a);
// Once per process: the line saying a driver function resolved outside libcuda (another
// interposer after the shim), or nullptr. The caller prints it (never from inside a lookup).
const char *take_origin_note();
// The NCCL wrappers, defined where nccl.h is included (hooks_nccl.cpp), in api_nccl.def order.
extern void *const kNcclWrappers[];

// cuGetProcAddress/cudaGetDriverEntryPoint* answered p for `symbol`: returns our wrapper of exactly
// that export, or p itself when we do not wrap it (zero cost for everything we do not intercept).
void *route_proc(void *p, const char *symbol);

// The loaded libcuda.so.1 (no load is triggered), or nullptr.
void *libcuda_handle();

// CUMEMGUARD_LOG_LEVEL=debug: one raw stderr line per lookup the shim answers or routes.
bool trace_lookups();
void trace_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// CUMEMGUARD_DISABLE, read cheaply (getenv) so it also holds before the options are parsed.
bool disabled();

}  // namespace cmg::shim

#define CMG_REAL(name) \
  (reinterpret_cast<decltype(&::name)>(::cmg::shim::real_ptr(::cmg::shim::Api::name)))
