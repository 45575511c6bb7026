// SPDX-License-Identifier: Apache-2.0
// Exported driver entry points: one line each into the handlers. They are reached through the PLT
// (programs linked with -lcuda), through the dlsym hook and through cuGetProcAddress routing
// (cudart, PyTorch's DriverAPI and NCCL get every driver function that way: real-driver.md s.5).
#include "handlers.h"

using namespace cmg::shim;
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
  return vmm_import(h, os, type, CMG_REAL_R(cuMemImportFromShareableHandle));
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

// The wrappers cuGetProcAddress routing and handle-scoped dlsym answers hand out (Route::Given).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void *const cmg::shim::kGivenDriverWrappers[] = {
#define CMG_DRV(n, b, t) reinterpret_cast<void *>(&hook_##n<Route::Given>),
#include "api_driver.def"
#undef CMG_DRV
};
#pragma GCC diagnostic pop
