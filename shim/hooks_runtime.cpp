// SPDX-License-Identifier: Apache-2.0
// Exported runtime entry points (unversioned: they interpose cudaMalloc@@libcudart.so.13 of a
// dynamic cudart, interposers.md 9.1). The driver calls cudart makes underneath are not recorded
// again: the re-entry guard is held for the whole runtime call.
#include "handlers.h"
#include "hooks_capture.h"
#include "torch_host.h"

using namespace cmg::shim;
using namespace cmg::shim::capture_hooks;
using cmg::MemKind;

namespace {
std::uintptr_t addr(const void *p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
}  // namespace

CMG_HOOK(cudaError_t, cudaMalloc, (void **p, size_t n), (p, n)) {
  torch_path_check(__builtin_return_address(0), n);  // PyTorch's allocator on its asked path?
  return linear_alloc<cudaError_t>(
      Api::cudaMalloc, MemKind::Linear, n, [&] { return CMG_REAL_R(cudaMalloc)(p, n); },
      [&] { return addr(*p); });
}

CMG_HOOK(cudaError_t, cudaFree, (void *p), (p)) {
  return linear_free<cudaError_t>(Api::cudaFree, kDeviceFrees, addr(p),
                                  [&] { return CMG_REAL_R(cudaFree)(p); });
}

CMG_HOOK(cudaError_t, cudaMallocHost, (void **p, size_t n), (p, n)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocHost, MemKind::Host, n, [&] { return CMG_REAL_R(cudaMallocHost)(p, n); },
      [&] { return addr(*p); });
}

CMG_HOOK(cudaError_t, cudaHostAlloc, (void **p, size_t n, unsigned int flags), (p, n, flags)) {
  return linear_alloc<cudaError_t>(
      Api::cudaHostAlloc, MemKind::Host, n, [&] { return CMG_REAL_R(cudaHostAlloc)(p, n, flags); },
      [&] { return addr(*p); });
}

CMG_HOOK(cudaError_t, cudaFreeHost, (void *p), (p)) {
  return linear_free<cudaError_t>(Api::cudaFreeHost, kHostFrees, addr(p),
                                  [&] { return CMG_REAL_R(cudaFreeHost)(p); });
}

CMG_HOOK(cudaError_t, cudaMallocManaged, (void **p, size_t n, unsigned int flags), (p, n, flags)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocManaged, MemKind::Managed, n,
      [&] { return CMG_REAL_R(cudaMallocManaged)(p, n, flags); }, [&] { return addr(*p); });
}

CMG_HOOK(cudaError_t, cudaMallocPitch, (void **p, size_t *pitch, size_t w, size_t h),
         (p, pitch, w, h)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocPitch, MemKind::Linear, [&] { return std::uint64_t(*pitch) * h; },
      [&] { return CMG_REAL_R(cudaMallocPitch)(p, pitch, w, h); }, [&] { return addr(*p); });
}

CMG_HOOK(cudaError_t, cudaMallocAsync, (void **p, size_t n, cudaStream_t s), (p, n, s)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocAsync, MemKind::Async, n, [&] { return CMG_REAL_R(cudaMallocAsync)(p, n, s); },
      [&] { return addr(*p); }, addr(s));
}

CMG_HOOK(cudaError_t, cudaMallocAsync_ptsz, (void **p, size_t n, cudaStream_t s), (p, n, s)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocAsync_ptsz, MemKind::Async, n,
      [&] { return CMG_REAL_R(cudaMallocAsync_ptsz)(p, n, s); }, [&] { return addr(*p); }, addr(s),
      true);
}

CMG_HOOK(cudaError_t, cudaMallocFromPoolAsync,
         (void **p, size_t n, cudaMemPool_t pool, cudaStream_t s), (p, n, pool, s)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocFromPoolAsync, MemKind::Async, n,
      [&] { return CMG_REAL_R(cudaMallocFromPoolAsync)(p, n, pool, s); }, [&] { return addr(*p); },
      addr(s));
}

CMG_HOOK(cudaError_t, cudaMallocFromPoolAsync_ptsz,
         (void **p, size_t n, cudaMemPool_t pool, cudaStream_t s), (p, n, pool, s)) {
  return linear_alloc<cudaError_t>(
      Api::cudaMallocFromPoolAsync_ptsz, MemKind::Async, n,
      [&] { return CMG_REAL_R(cudaMallocFromPoolAsync_ptsz)(p, n, pool, s); },
      [&] { return addr(*p); }, addr(s), true);
}

CMG_HOOK(cudaError_t, cudaFreeAsync, (void *p, cudaStream_t s), (p, s)) {
  return linear_free<cudaError_t>(
      Api::cudaFreeAsync, kDeviceFrees, addr(p), [&] { return CMG_REAL_R(cudaFreeAsync)(p, s); },
      addr(s));
}

CMG_HOOK(cudaError_t, cudaFreeAsync_ptsz, (void *p, cudaStream_t s), (p, s)) {
  return linear_free<cudaError_t>(
      Api::cudaFreeAsync_ptsz, kDeviceFrees, addr(p),
      [&] { return CMG_REAL_R(cudaFreeAsync_ptsz)(p, s); }, addr(s), true);
}

CMG_HOOK(cudaError_t, cudaMemPoolTrimTo, (cudaMemPool_t pool, size_t keep), (pool, keep)) {
  return trim_pool<cudaError_t>(Api::cudaMemPoolTrimTo, addr(pool), keep,
                                [&] { return CMG_REAL_R(cudaMemPoolTrimTo)(pool, keep); });
}

// Legacy IPC answers in the runtime's codes (docs/ipc-bridge.md, "Errors").
namespace {
constexpr bridge::Codes kIpcCodes{
    cudaSuccess,
    cudaErrorInvalidValue,
    cudaErrorInvalidResourceHandle,
    cudaErrorMapBufferObjectFailed,
    cudaErrorDeviceUninitialized,  // CUDA_ERROR_INVALID_CONTEXT in cudart
    cudaErrorMemoryAllocation};
IpcApi ipc_api(Api a) {
  return IpcApi{a, kIpcCodes, true};
}
}  // namespace

CMG_HOOK(cudaError_t, cudaIpcGetMemHandle, (cudaIpcMemHandle_t * h, void *p), (h, p)) {
  return static_cast<cudaError_t>(
      ipc_get(ipc_api(Api::cudaIpcGetMemHandle), h ? h->reserved : nullptr, addr(p),
              [&] { return static_cast<int>(CMG_REAL_R(cudaIpcGetMemHandle)(h, p)); }));
}

CMG_HOOK(cudaError_t, cudaIpcOpenMemHandle, (void **p, cudaIpcMemHandle_t h, unsigned int flags),
         (p, h, flags)) {
  return static_cast<cudaError_t>(ipc_open(
      ipc_api(Api::cudaIpcOpenMemHandle), h.reserved, flags, p != nullptr,
      [&] { return static_cast<int>(CMG_REAL_R(cudaIpcOpenMemHandle)(p, h, flags)); },
      [&] { return static_cast<std::uint64_t>(addr(*p)); },
      [&](std::uint64_t v) { *p = reinterpret_cast<void *>(static_cast<std::uintptr_t>(v)); }));
}

CMG_HOOK(cudaError_t, cudaIpcCloseMemHandle, (void *p), (p)) {
  return static_cast<cudaError_t>(ipc_close(ipc_api(Api::cudaIpcCloseMemHandle), addr(p), [&] {
    return static_cast<int>(CMG_REAL_R(cudaIpcCloseMemHandle)(p));
  }));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
CMG_HOOK(cudaError_t, cudaGetDriverEntryPoint,
         (const char *symbol, void **fn, unsigned long long flags,
          cudaDriverEntryPointQueryResult *status),
         (symbol, fn, flags, status)) {
  return route_after(CMG_REAL_R(cudaGetDriverEntryPoint)(symbol, fn, flags, status), symbol, fn);
}

CMG_HOOK(cudaError_t, cudaGetDriverEntryPoint_ptsz,
         (const char *symbol, void **fn, unsigned long long flags,
          cudaDriverEntryPointQueryResult *status),
         (symbol, fn, flags, status)) {
  return route_after(CMG_REAL_R(cudaGetDriverEntryPoint_ptsz)(symbol, fn, flags, status), symbol,
                     fn);
}
#pragma GCC diagnostic pop

CMG_HOOK(cudaError_t, cudaGetDriverEntryPointByVersion,
         (const char *symbol, void **fn, unsigned int version, unsigned long long flags,
          cudaDriverEntryPointQueryResult *status),
         (symbol, fn, version, flags, status)) {
  return route_after(
      CMG_REAL_R(cudaGetDriverEntryPointByVersion)(symbol, fn, version, flags, status), symbol, fn);
}

CMG_HOOK(cudaError_t, cudaGetDriverEntryPointByVersion_ptsz,
         (const char *symbol, void **fn, unsigned int version, unsigned long long flags,
          cudaDriverEntryPointQueryResult *status),
         (symbol, fn, version, flags, status)) {
  return route_after(
      CMG_REAL_R(cudaGetDriverEntryPointByVersion_ptsz)(symbol, fn, version, flags, status), symbol,
      fn);
}

// Stream capture and graphs (hooks_capture.h).
CMG_HOOK(cudaError_t, cudaStreamBeginCapture, (cudaStream_t s, enum cudaStreamCaptureMode mode), (s, mode)) {
  return capture_begin<cudaError_t>(Api::cudaStreamBeginCapture, h(s), false, mode,
                                    [&] { return CMG_REAL_R(cudaStreamBeginCapture)(s, mode); });
}

CMG_HOOK(cudaError_t, cudaStreamBeginCapture_ptsz, (cudaStream_t s, enum cudaStreamCaptureMode mode), (s, mode)) {
  return capture_begin<cudaError_t>(Api::cudaStreamBeginCapture_ptsz, h(s), true, mode,
                                    [&] { return CMG_REAL_R(cudaStreamBeginCapture_ptsz)(s, mode); });
}

CMG_HOOK(cudaError_t, cudaStreamEndCapture, (cudaStream_t s, cudaGraph_t *g), (s, g)) {
  return capture_end<cudaError_t>(
      Api::cudaStreamEndCapture, h(s), false, [&] { return CMG_REAL_R(cudaStreamEndCapture)(s, g); },
      [&] { return g ? h(*g) : 0; });
}

CMG_HOOK(cudaError_t, cudaStreamEndCapture_ptsz, (cudaStream_t s, cudaGraph_t *g), (s, g)) {
  return capture_end<cudaError_t>(
      Api::cudaStreamEndCapture_ptsz, h(s), true,
      [&] { return CMG_REAL_R(cudaStreamEndCapture_ptsz)(s, g); }, [&] { return g ? h(*g) : 0; });
}

CMG_HOOK(cudaError_t, cudaThreadExchangeStreamCaptureMode, (enum cudaStreamCaptureMode *mode), (mode)) {
  const int asked = mode_at(mode);
  return graph_call<cudaError_t>(
      Api::cudaThreadExchangeStreamCaptureMode, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaThreadExchangeStreamCaptureMode)(mode); },
      [&](Call &c, int r) { capture_after_exchange(c, asked, mode_at(mode), r); });
}

CMG_HOOK(cudaError_t, cudaGraphInstantiate, (cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags), (e, g, flags)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiate, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphInstantiate)(e, g, flags); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(cudaError_t, cudaGraphInstantiateWithFlags, (cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags), (e, g, flags)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiateWithFlags, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphInstantiateWithFlags)(e, g, flags); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(cudaError_t, cudaGraphInstantiateWithParams, (cudaGraphExec_t *e, cudaGraph_t g, cudaGraphInstantiateParams *p), (e, g, p)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiateWithParams, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphInstantiateWithParams)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(cudaError_t, cudaGraphInstantiateWithParams_ptsz, (cudaGraphExec_t *e, cudaGraph_t g, cudaGraphInstantiateParams *p), (e, g, p)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiateWithParams_ptsz, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphInstantiateWithParams_ptsz)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(cudaError_t, cudaGraphLaunch, (cudaGraphExec_t e, cudaStream_t s), (e, s)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphLaunch, StackWhen::Never, [&] { return CMG_REAL_R(cudaGraphLaunch)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), false, r); });
}

CMG_HOOK(cudaError_t, cudaGraphLaunch_ptsz, (cudaGraphExec_t e, cudaStream_t s), (e, s)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphLaunch_ptsz, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphLaunch_ptsz)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), true, r); });
}

CMG_HOOK(cudaError_t, cudaGraphExecDestroy, (cudaGraphExec_t e), (e)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphExecDestroy, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphExecDestroy)(e); },
      [&](Call &c, int r) { graph_after_exec_destroy(c, h(e), r); });
}

CMG_HOOK(cudaError_t, cudaGraphDestroy, (cudaGraph_t g), (g)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphDestroy, StackWhen::Never, [&] { return CMG_REAL_R(cudaGraphDestroy)(g); },
      [&](Call &c, int r) { graph_after_destroy(c, h(g), r); });
}

CMG_HOOK(cudaError_t, cudaGraphAddMemAllocNode, (cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t n, struct cudaMemAllocNodeParams *p), (node, g, deps, n, p)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphAddMemAllocNode, StackWhen::Sampled,
      [&] { return CMG_REAL_R(cudaGraphAddMemAllocNode)(node, g, deps, n, p); },
      [&](Call &c, int r) {
        graph_after_alloc_node(c, h(g), p ? h(p->dptr) : 0, p ? p->bytesize : 0,
                               p ? p->poolProps.location.id : -1, r);
      });
}

CMG_HOOK(cudaError_t, cudaGraphAddMemFreeNode, (cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *deps, size_t n, void *p), (node, g, deps, n, p)) {
  return graph_call<cudaError_t>(
      Api::cudaGraphAddMemFreeNode, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaGraphAddMemFreeNode)(node, g, deps, n, p); },
      [&](Call &c, int r) { graph_after_free_node(c, h(g), h(p), r); });
}

CMG_HOOK(cudaError_t, cudaDeviceGraphMemTrim, (int dev), (dev)) {
  return graph_call<cudaError_t>(
      Api::cudaDeviceGraphMemTrim, StackWhen::Never,
      [&] { return CMG_REAL_R(cudaDeviceGraphMemTrim)(dev); },
      [&](Call &c, int r) { graph_after_mem_trim(c, dev, r); });
}

// The wrappers handle-scoped dlsym answers hand out (Route::Given).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void *const cmg::shim::kGivenRuntimeWrappers[] = {
#define CMG_RT(n, d) reinterpret_cast<void *>(&hook_##n<Route::Given>),
#include "api_runtime.def"
#undef CMG_RT
};
#pragma GCC diagnostic pop
