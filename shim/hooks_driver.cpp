// SPDX-License-Identifier: Apache-2.0
// Exported driver entry points: one line each into the handlers. They are reached through the PLT
// (programs linked with -lcuda), through the dlsym hook and through cuGetProcAddress routing
// (cudart, PyTorch's DriverAPI and NCCL get every driver function that way: real-driver.md s.5).
#include "handlers.h"
#include "hooks_capture.h"
#include "hooks_context.h"
#include "resident.h"

using namespace cmg::shim;
using namespace cmg::shim::capture_hooks;
using cmg::MemKind;

namespace {
std::uint64_t stream_value(CUstream s) {
  return reinterpret_cast<std::uintptr_t>(s);
}
}  // namespace

CMG_HOOK(CUresult, cuGetProcAddress,
         (const char *symbol, void **pfn, int version, cuuint64_t flags),
         (symbol, pfn, version, flags)) {
  auto real = CMG_REAL_R(cuGetProcAddress);
  return real ? route_after(real(symbol, pfn, version, flags), symbol, pfn)
              : CUDA_ERROR_NOT_INITIALIZED;
}

CMG_HOOK(CUresult, cuGetProcAddress_v2,
         (const char *symbol, void **pfn, int version, cuuint64_t flags,
          CUdriverProcAddressQueryResult *status),
         (symbol, pfn, version, flags, status)) {
  auto real = CMG_REAL_R(cuGetProcAddress_v2);
  return real ? route_after(real(symbol, pfn, version, flags, status), symbol, pfn)
              : CUDA_ERROR_NOT_INITIALIZED;
}

CMG_HOOK(CUresult, cuMemAlloc_v2, (CUdeviceptr * p, size_t n), (p, n)) {
  return linear_alloc<CUresult>(
      Api::cuMemAlloc_v2, MemKind::Linear, n, [&] { return CMG_REAL_R(cuMemAlloc_v2)(p, n); },
      [&] { return *p; });
}

CMG_HOOK(CUresult, cuMemAllocPitch_v2,
         (CUdeviceptr * p, size_t *pitch, size_t w, size_t h, unsigned int elem),
         (p, pitch, w, h, elem)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocPitch_v2, MemKind::Linear, [&] { return std::uint64_t(*pitch) * h; },
      [&] { return CMG_REAL_R(cuMemAllocPitch_v2)(p, pitch, w, h, elem); }, [&] { return *p; });
}

CMG_HOOK(CUresult, cuMemAllocManaged, (CUdeviceptr * p, size_t n, unsigned int flags),
         (p, n, flags)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocManaged, MemKind::Managed, n,
      [&] { return CMG_REAL_R(cuMemAllocManaged)(p, n, flags); }, [&] { return *p; });
}

CMG_HOOK(CUresult, cuMemFree_v2, (CUdeviceptr p), (p)) {
  return linear_free<CUresult>(Api::cuMemFree_v2, kDeviceFrees, p,
                               [&] { return CMG_REAL_R(cuMemFree_v2)(p); });
}

CMG_HOOK(CUresult, cuMemAllocHost_v2, (void **p, size_t n), (p, n)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocHost_v2, MemKind::Host, n, [&] { return CMG_REAL_R(cuMemAllocHost_v2)(p, n); },
      [&] { return reinterpret_cast<std::uintptr_t>(*p); });
}

CMG_HOOK(CUresult, cuMemHostAlloc, (void **p, size_t n, unsigned int flags), (p, n, flags)) {
  return linear_alloc<CUresult>(
      Api::cuMemHostAlloc, MemKind::Host, n,
      [&] { return CMG_REAL_R(cuMemHostAlloc)(p, n, flags); },
      [&] { return reinterpret_cast<std::uintptr_t>(*p); });
}

CMG_HOOK(CUresult, cuMemFreeHost, (void *p), (p)) {
  return linear_free<CUresult>(Api::cuMemFreeHost, kHostFrees, reinterpret_cast<std::uintptr_t>(p),
                               [&] { return CMG_REAL_R(cuMemFreeHost)(p); });
}

CMG_HOOK(CUresult, cuMemAllocAsync, (CUdeviceptr * p, size_t n, CUstream s), (p, n, s)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocAsync, MemKind::Async, n, [&] { return CMG_REAL_R(cuMemAllocAsync)(p, n, s); },
      [&] { return *p; }, stream_value(s));
}

CMG_HOOK(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * p, size_t n, CUstream s), (p, n, s)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocAsync_ptsz, MemKind::Async, n,
      [&] { return CMG_REAL_R(cuMemAllocAsync_ptsz)(p, n, s); }, [&] { return *p; },
      stream_value(s), true);
}

CMG_HOOK(CUresult, cuMemAllocFromPoolAsync,
         (CUdeviceptr * p, size_t n, CUmemoryPool pool, CUstream s), (p, n, pool, s)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocFromPoolAsync, MemKind::Async, n,
      [&] { return CMG_REAL_R(cuMemAllocFromPoolAsync)(p, n, pool, s); }, [&] { return *p; },
      stream_value(s));
}

CMG_HOOK(CUresult, cuMemAllocFromPoolAsync_ptsz,
         (CUdeviceptr * p, size_t n, CUmemoryPool pool, CUstream s), (p, n, pool, s)) {
  return linear_alloc<CUresult>(
      Api::cuMemAllocFromPoolAsync_ptsz, MemKind::Async, n,
      [&] { return CMG_REAL_R(cuMemAllocFromPoolAsync_ptsz)(p, n, pool, s); }, [&] { return *p; },
      stream_value(s), true);
}

CMG_HOOK(CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s)) {
  return linear_free<CUresult>(
      Api::cuMemFreeAsync, kDeviceFrees, p, [&] { return CMG_REAL_R(cuMemFreeAsync)(p, s); },
      stream_value(s));
}

CMG_HOOK(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s), (p, s)) {
  return linear_free<CUresult>(
      Api::cuMemFreeAsync_ptsz, kDeviceFrees, p,
      [&] { return CMG_REAL_R(cuMemFreeAsync_ptsz)(p, s); }, stream_value(s), true);
}

CMG_HOOK(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep), (pool, keep)) {
  return pool_trim(Api::cuMemPoolTrimTo, pool, keep, CMG_REAL_R(cuMemPoolTrimTo));
}

CMG_HOOK(CUresult, cuMemCreate,
         (CUmemGenericAllocationHandle * h, size_t n, const CUmemAllocationProp *prop,
          unsigned long long flags),
         (h, n, prop, flags)) {
  return vmm_create(h, n, prop, flags, CMG_REAL_R(cuMemCreate));
}

CMG_HOOK(CUresult, cuMemRelease, (CUmemGenericAllocationHandle h), (h)) {
  return vmm_release(h, CMG_REAL_R(cuMemRelease));
}

CMG_HOOK(CUresult, cuMemAddressReserve,
         (CUdeviceptr * p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags),
         (p, n, align, addr, flags)) {
  return vmm_reserve(p, n, align, addr, flags, CMG_REAL_R(cuMemAddressReserve));
}

CMG_HOOK(CUresult, cuMemAddressFree, (CUdeviceptr p, size_t n), (p, n)) {
  return vmm_address_free(p, n, CMG_REAL_R(cuMemAddressFree));
}

CMG_HOOK(CUresult, cuMemMap,
         (CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
          unsigned long long flags),
         (p, n, off, h, flags)) {
  return vmm_map(p, n, off, h, flags, CMG_REAL_R(cuMemMap));
}

CMG_HOOK(CUresult, cuMemUnmap, (CUdeviceptr p, size_t n), (p, n)) {
  return vmm_unmap(p, n, CMG_REAL_R(cuMemUnmap));
}

CMG_HOOK(CUresult, cuMemSetAccess,
         (CUdeviceptr p, size_t n, const CUmemAccessDesc *desc, size_t count),
         (p, n, desc, count)) {
  return vmm_set_access(p, n, desc, count, CMG_REAL_R(cuMemSetAccess));
}

CMG_HOOK(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle * h, void *addr),
         (h, addr)) {
  return vmm_retain(h, addr, CMG_REAL_R(cuMemRetainAllocationHandle));
}

CMG_HOOK(CUresult, cuMemExportToShareableHandle,
         (void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
          unsigned long long flags),
         (out, h, type, flags)) {
  return vmm_export(out, h, type, flags, CMG_REAL_R(cuMemExportToShareableHandle));
}

CMG_HOOK(CUresult, cuMemImportFromShareableHandle,
         (CUmemGenericAllocationHandle * h, void *os, CUmemAllocationHandleType type),
         (h, os, type)) {
  // The caller: NCCL's imports of its peers' memory are told apart by where they come from.
  return vmm_import(h, os, type, CMG_REAL_R(cuMemImportFromShareableHandle),
                    __builtin_return_address(0));
}

CMG_HOOK(CUresult, cuMulticastCreate,
         (CUmemGenericAllocationHandle * mc, const CUmulticastObjectProp *prop), (mc, prop)) {
  return mc_create(mc, prop, CMG_REAL_R(cuMulticastCreate));
}

CMG_HOOK(CUresult, cuMulticastAddDevice, (CUmemGenericAllocationHandle mc, CUdevice dev),
         (mc, dev)) {
  return mc_add_device(mc, dev, CMG_REAL_R(cuMulticastAddDevice));
}

CMG_HOOK(CUresult, cuMulticastBindMem,
         (CUmemGenericAllocationHandle mc, size_t mc_offset, CUmemGenericAllocationHandle mem,
          size_t mem_offset, size_t size, unsigned long long flags),
         (mc, mc_offset, mem, mem_offset, size, flags)) {
  return mc_bind_mem(mc, mc_offset, mem, mem_offset, size, flags, CMG_REAL_R(cuMulticastBindMem));
}

CMG_HOOK(CUresult, cuMulticastBindAddr,
         (CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr va, size_t size,
          unsigned long long flags),
         (mc, mc_offset, va, size, flags)) {
  return mc_bind_addr(mc, mc_offset, va, size, flags, CMG_REAL_R(cuMulticastBindAddr));
}

CMG_HOOK(CUresult, cuMulticastUnbind,
         (CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size),
         (mc, dev, mc_offset, size)) {
  return mc_unbind(mc, dev, mc_offset, size, CMG_REAL_R(cuMulticastUnbind));
}

// Legacy IPC answers in the driver's codes (docs/ipc-bridge.md, "Errors").
namespace {
constexpr bridge::Codes kIpcCodes{
    CUDA_SUCCESS,          CUDA_ERROR_INVALID_VALUE,   CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_MAP_FAILED, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_OUT_OF_MEMORY};
IpcApi ipc_api(Api a) {
  return IpcApi{a, kIpcCodes, false};
}
}  // namespace

CMG_HOOK(CUresult, cuIpcGetMemHandle, (CUipcMemHandle * h, CUdeviceptr p), (h, p)) {
  return static_cast<CUresult>(
      ipc_get(ipc_api(Api::cuIpcGetMemHandle), h ? h->reserved : nullptr, p,
              [&] { return static_cast<int>(CMG_REAL_R(cuIpcGetMemHandle)(h, p)); }));
}

CMG_HOOK(CUresult, cuIpcOpenMemHandle, (CUdeviceptr * p, CUipcMemHandle h, unsigned int flags),
         (p, h, flags)) {
  return static_cast<CUresult>(ipc_open(
      ipc_api(Api::cuIpcOpenMemHandle), h.reserved, flags, p != nullptr,
      [&] { return static_cast<int>(CMG_REAL_R(cuIpcOpenMemHandle)(p, h, flags)); },
      [&] { return static_cast<std::uint64_t>(*p); },
      [&](std::uint64_t v) { *p = static_cast<CUdeviceptr>(v); }));
}

CMG_HOOK(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr * p, CUipcMemHandle h, unsigned int flags),
         (p, h, flags)) {
  return static_cast<CUresult>(ipc_open(
      ipc_api(Api::cuIpcOpenMemHandle_v2), h.reserved, flags, p != nullptr,
      [&] { return static_cast<int>(CMG_REAL_R(cuIpcOpenMemHandle_v2)(p, h, flags)); },
      [&] { return static_cast<std::uint64_t>(*p); },
      [&](std::uint64_t v) { *p = static_cast<CUdeviceptr>(v); }));
}

CMG_HOOK(CUresult, cuIpcCloseMemHandle, (CUdeviceptr p), (p)) {
  return static_cast<CUresult>(ipc_close(ipc_api(Api::cuIpcCloseMemHandle), p, [&] {
    return static_cast<int>(CMG_REAL_R(cuIpcCloseMemHandle)(p));
  }));
}

// Stream capture and graphs (hooks_capture.h).
// The CUDA 10.0 entry points take no mode: they begin a global-mode capture.
CMG_HOOK(CUresult, cuStreamBeginCapture, (CUstream s), (s)) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture, h(s), false, kGlobal,
                                 [&] { return CMG_REAL_R(cuStreamBeginCapture)(s); });
}

CMG_HOOK(CUresult, cuStreamBeginCapture_ptsz, (CUstream s), (s)) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture_ptsz, h(s), true, kGlobal,
                                 [&] { return CMG_REAL_R(cuStreamBeginCapture_ptsz)(s); });
}

CMG_HOOK(CUresult, cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode), (s, mode)) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture_v2, h(s), false, mode,
                                 [&] { return CMG_REAL_R(cuStreamBeginCapture_v2)(s, mode); });
}

CMG_HOOK(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode mode), (s, mode)) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture_v2_ptsz, h(s), true, mode,
                                 [&] { return CMG_REAL_R(cuStreamBeginCapture_v2_ptsz)(s, mode); });
}

CMG_HOOK(CUresult, cuStreamEndCapture, (CUstream s, CUgraph *g), (s, g)) {
  return capture_end<CUresult>(
      Api::cuStreamEndCapture, h(s), false, [&] { return CMG_REAL_R(cuStreamEndCapture)(s, g); },
      [&] { return g ? h(*g) : 0; });
}

CMG_HOOK(CUresult, cuStreamEndCapture_ptsz, (CUstream s, CUgraph *g), (s, g)) {
  return capture_end<CUresult>(
      Api::cuStreamEndCapture_ptsz, h(s), true,
      [&] { return CMG_REAL_R(cuStreamEndCapture_ptsz)(s, g); }, [&] { return g ? h(*g) : 0; });
}

CMG_HOOK(CUresult, cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode), (mode)) {
  const int asked = mode_at(mode);
  return graph_call<CUresult>(
      Api::cuThreadExchangeStreamCaptureMode, StackWhen::Never,
      [&] { return CMG_REAL_R(cuThreadExchangeStreamCaptureMode)(mode); },
      [&](Call &c, int r) { capture_after_exchange(c, asked, mode_at(mode), r); });
}

CMG_HOOK(CUresult, cuGraphInstantiate, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n), (e, g, err, log, n)) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiate, StackWhen::Never,
      [&] { return CMG_REAL_R(cuGraphInstantiate)(e, g, err, log, n); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(CUresult, cuGraphInstantiate_v2, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n), (e, g, err, log, n)) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiate_v2, StackWhen::Never,
      [&] { return CMG_REAL_R(cuGraphInstantiate_v2)(e, g, err, log, n); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *e, CUgraph g, unsigned long long flags), (e, g, flags)) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiateWithFlags, StackWhen::Never,
      [&] { return CMG_REAL_R(cuGraphInstantiateWithFlags)(e, g, flags); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(CUresult, cuGraphInstantiateWithParams, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p)) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiateWithParams, StackWhen::Never,
      [&] { return CMG_REAL_R(cuGraphInstantiateWithParams)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(CUresult, cuGraphInstantiateWithParams_ptsz, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p)) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiateWithParams_ptsz, StackWhen::Never,
      [&] { return CMG_REAL_R(cuGraphInstantiateWithParams_ptsz)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_HOOK(CUresult, cuGraphLaunch, (CUgraphExec e, CUstream s), (e, s)) {
  return graph_call<CUresult>(
      Api::cuGraphLaunch, StackWhen::Never, [&] { return CMG_REAL_R(cuGraphLaunch)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), false, r); });
}

CMG_HOOK(CUresult, cuGraphLaunch_ptsz, (CUgraphExec e, CUstream s), (e, s)) {
  return graph_call<CUresult>(
      Api::cuGraphLaunch_ptsz, StackWhen::Never, [&] { return CMG_REAL_R(cuGraphLaunch_ptsz)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), true, r); });
}

CMG_HOOK(CUresult, cuGraphExecDestroy, (CUgraphExec e), (e)) {
  return graph_call<CUresult>(
      Api::cuGraphExecDestroy, StackWhen::Never, [&] { return CMG_REAL_R(cuGraphExecDestroy)(e); },
      [&](Call &c, int r) { graph_after_exec_destroy(c, h(e), r); });
}

CMG_HOOK(CUresult, cuGraphDestroy, (CUgraph g), (g)) {
  return graph_call<CUresult>(
      Api::cuGraphDestroy, StackWhen::Never, [&] { return CMG_REAL_R(cuGraphDestroy)(g); },
      [&](Call &c, int r) { graph_after_destroy(c, h(g), r); });
}

CMG_HOOK(CUresult, cuGraphAddMemAllocNode, (CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUDA_MEM_ALLOC_NODE_PARAMS *p), (node, g, deps, n, p)) {
  return graph_call<CUresult>(
      Api::cuGraphAddMemAllocNode, StackWhen::Sampled,
      [&] { return CMG_REAL_R(cuGraphAddMemAllocNode)(node, g, deps, n, p); },
      [&](Call &c, int r) {
        graph_after_alloc_node(c, h(g), p ? p->dptr : 0, p ? p->bytesize : 0,
                               p ? p->poolProps.location.id : -1, r);
      });
}

CMG_HOOK(CUresult, cuGraphAddMemFreeNode, (CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr p), (node, g, deps, n, p)) {
  return graph_call<CUresult>(
      Api::cuGraphAddMemFreeNode, StackWhen::Never,
      [&] { return CMG_REAL_R(cuGraphAddMemFreeNode)(node, g, deps, n, p); },
      [&](Call &c, int r) { graph_after_free_node(c, h(g), p, r); });
}

CMG_HOOK(CUresult, cuDeviceGraphMemTrim, (CUdevice dev), (dev)) {
  return graph_call<CUresult>(
      Api::cuDeviceGraphMemTrim, StackWhen::Never,
      [&] { return CMG_REAL_R(cuDeviceGraphMemTrim)(dev); },
      [&](Call &c, int r) { graph_after_mem_trim(c, dev, r); });
}

// The runtime makes a device's primary context with it at a thread's first runtime call on that
// device (NCCL's static runtime likewise): the first context on each device is seen with the stack
// of the thread that made it (stray-device, policy/device_use.h).
CMG_HOOK(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev), (pctx, dev)) {
  return context_retain(dev, [&] { return CMG_REAL_R(cuDevicePrimaryCtxRetain)(pctx, dev); });
}

// The wrappers cuGetProcAddress routing and handle-scoped dlsym answers hand out (Route::Given).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void *const cmg::shim::kGivenDriverWrappers[] = {
#define CMG_DRV(n, b, t) reinterpret_cast<void *>(&hook_##n<Route::Given>),
#include "api_driver.def"
#undef CMG_DRV
};
#pragma GCC diagnostic pop
