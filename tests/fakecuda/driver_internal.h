// SPDX-License-Identifier: Apache-2.0
// Internals shared by the fake driver's sources: export ids, the common call path, configuration.
#pragma once

// Built with __CUDA_API_VERSION_INTERNAL (meson.build) so that cuda.h declares every ABI variant
// (cuMemAlloc and cuMemAlloc_v2, cuMemAllocAsync and _ptsz, ...) under its exact name: each
// definition in this library is then checked by the compiler against NVIDIA's declaration.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>
#include <cstdint>

#define FC_EXPORT extern "C" __attribute__((visibility("default")))

namespace fc {

// ---- the export table (driver_exports.def) ---------------------------------------------------
enum class Fn : unsigned {
#define FC_FN(e, b, v) e,
#define FC_FN_PTSZ(e, b, v) e,
#define FC_FN_PTDS(e, b, v) e,
#include "driver_exports.def"
#undef FC_FN
#undef FC_FN_PTSZ
#undef FC_FN_PTDS
  kCount
};
inline constexpr unsigned kFnCount = static_cast<unsigned>(Fn::kCount);

struct FnInfo {
  const char *name;  // exact export name, "cuMemAlloc_v2"
  const char *base;  // the name cuGetProcAddress is asked for, "cuMemAlloc"
  int version;       // CUDA version of this ABI variant
  bool per_thread;   // a _ptsz/_ptds variant
  void *addr;        // the exported function itself
};
const FnInfo &fn_info(unsigned index);

// ---- configuration (FAKECUDA_* environment, read once) ---------------------------------------
inline constexpr int kMaxDevices = 16;
inline constexpr int kDriverVersion = 13000;  // real-driver.md: cuDriverGetVersion = 13000

struct Config {
  int devices = 1;                              // FAKECUDA_DEVICES
  std::size_t device_memory = std::size_t{16} << 30;  // FAKECUDA_DEVICE_MEMORY
  bool handle_reuse = true;                     // FAKECUDA_HANDLE_REUSE
  bool retain_same = true;                      // FAKECUDA_RETAIN_SAME
  bool fabric_accept = false;                   // FAKECUDA_FABRIC=accept
  bool multicast = false;                       // FAKECUDA_MULTICAST=1: an NVLink-switch system
  bool bench = false;                           // FAKECUDA_BENCH=1: see driver_bench.cpp
};
const Config &config();

// ---- the path every export takes (driver_core.cpp) -------------------------------------------
// Counts the call and applies fault injection: a non-success result means "fail without effect".
CUresult enter(Fn f);
// Remembers the call on this thread (fakecuda_thread_last_call) and counts injected faults.
void note_call(Fn f, CUresult r, bool injected);
bool tracing();
void trace_call(Fn f, CUresult r);
void trace_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

template <class Body>
inline CUresult call(Fn f, Body &&body) {
  CUresult r = enter(f);
  const bool injected = r != CUDA_SUCCESS;
  if (!injected) r = body();
  note_call(f, r, injected);
  if (tracing()) trace_call(f, r);
  return r;
}

// One exported function = one line: FC_CALL(name, implementation expression).
#define FC_CALL(fn, ...) ::fc::call(::fc::Fn::fn, [&]() -> CUresult { return __VA_ARGS__; })

// Shared by cuGetProcAddress and cuGetProcAddress_v2 (driver_gpa.cpp).
CUresult get_proc_address(Fn entry, const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status);

// ---- devices, contexts, the busy model (driver_device.cpp) -----------------------------------
CUresult require_init();                  // CUDA_ERROR_NOT_INITIALIZED before cuInit
bool valid_device(int dev);
CUresult current_device(int *dev);        // CUDA_ERROR_INVALID_CONTEXT without a current context
CUcontext primary_context(int dev);       // the device's primary context (not retained)
CUresult stream_device(CUstream s, int *dev);
unsigned long long live_streams();
// real-driver.md section 3: frees and synchronisations wait for the device's work to finish.
void wait_idle(int dev);                  // dev < 0: every device
void set_busy(int dev, unsigned long long ns);
const char *error_name(CUresult r);       // "CUDA_ERROR_INVALID_VALUE", nullptr when unknown
const char *error_string(CUresult r);     // "invalid argument", nullptr when unknown

// What a stream handle stands for (driver_device.cpp). `per_thread_default`: a null handle means
// the calling thread's per-thread default stream (the _ptsz/_ptds exports), not the legacy one.
struct StreamId {
  const void *key = nullptr;  // one value per stream: the legacy stream, this thread's
                              // per-thread stream, or the created stream itself
  int dev = 0;
  bool legacy = false;
  bool blocking = true;       // not created with CU_STREAM_NON_BLOCKING (the legacy rule)
};
CUresult resolve_stream(CUstream s, bool per_thread_default, StreamId *out);

// ---- stream capture and graphs (driver_capture.cpp) -------------------------------------------
// The documented rules (cuda.h 13.0 cuThreadExchangeStreamCaptureMode, cuStreamBeginCapture,
// cuStreamEndCapture, cuGraphAddMemAllocNode, cuGraphLaunch; CUDA programming guide 4.2.2.1.2,
// "Prohibited and Unhandled Operations" and "Invalidation"), not measured: docs/reference/
// real-driver.md section 7 lists them, and tests/programs/conformance checks them on the GPU.
//
// A potentially unsafe call (an allocation or free that is not stream-ordered): CUDA_SUCCESS, or
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED after invalidating every capture that prohibits it.
CUresult capture_unsafe_call();
// A synchronous copy or set on the legacy stream of `dev`: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
// after invalidating the captures of blocking streams of that device, when there are any.
CUresult capture_legacy_use(int dev);
// A synchronisation or query of stream `id`: an error (and the capture invalidated) when it is
// capturing, or when it is the legacy stream and a blocking stream of its device is capturing.
CUresult capture_stream_wait(const StreamId &id);
// A synchronisation of a whole context: an error while any stream of its device is capturing.
CUresult capture_context_wait(int dev);
// A stream-ordered operation on stream `id`: kNotCapturing to execute it now; CUDA_SUCCESS when
// it became a node of the capture; CUDA_ERROR_STREAM_CAPTURE_INVALIDATED when the capture is.
inline constexpr CUresult kNotCapturing = static_cast<CUresult>(-1);
CUresult capture_node(const StreamId &id);
CUresult capture_alloc_node(const StreamId &id, std::size_t size, std::uintptr_t *out);
CUresult capture_free_node(const StreamId &id, std::uintptr_t p);
// A free outside any graph (cuMemFree_v2, cuMemFreeAsync on a stream that is not capturing) of a
// graph allocation: the allocation's lifetime ends (cuda.h, cuGraphAddMemAllocNode).
CUresult graph_free_outside(std::uintptr_t p);
struct CaptureCounts {
  unsigned long long open = 0, graphs = 0, execs = 0, graph_allocs = 0, graph_live = 0,
                     graph_live_bytes = 0;
};
CaptureCounts capture_counts();

// ---- graph allocations' address space (driver_memory.cpp) --------------------------------------
// Carved from the device's arena segment when the node is made (the address is fixed then) and
// charged to the device only while the allocation is live (between a launch and its free).
CUresult graph_va_carve(int dev, std::size_t size, std::uintptr_t *out);
void graph_va_release(std::uintptr_t p);
bool graph_va_charge(std::uintptr_t p, bool live);  // false: not enough device memory
bool is_graph_va(std::uintptr_t p);

// ---- benchmark mode (driver_bench.cpp) ----------------------------------------------------------
// FAKECUDA_BENCH=1: linear memory without backing pages from a sharded table, so that the fake's
// own cost per call is small, stable and does not serialize threads (the shim's overhead is
// measured as a difference against it).
CUresult bench_linear_alloc(std::uintptr_t *out, std::size_t size, int dev);
CUresult bench_linear_free(std::uintptr_t p);

}  // namespace fc
