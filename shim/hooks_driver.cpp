// SPDX-License-Identifier: Apache-2.0
// Exported driver entry points: one line each into the handlers. They are reached through the PLT
// (programs linked with -lcuda), through the dlsym hook and through cuGetProcAddress routing
// (cudart, PyTorch's DriverAPI and NCCL get every driver function that way: real-driver.md s.5).
#include "handlers.h"

using namespace cmg::shim;
using cmg::MemKind;

CMG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  auto real = CMG_REAL(cuGetProcAddress);
  return real ? route_after(real(symbol, pfn, version, flags), symbol, pfn) : CUDA_ERROR_NOT_INITIALIZED;
}

CMG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                        cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
  auto real = CMG_REAL(cuGetProcAddress_v2);
  return real ? route_after(real(symbol, pfn, version, flags, status), symbol, pfn)
              : CUDA_ERROR_NOT_INITIALIZED;
}

CMG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  return linear_alloc<CUresult>(Api::cuMemAlloc_v2, MemKind::Linear, n,
                                [&] { return CMG_REAL(cuMemAlloc_v2)(p, n); }, [&] { return *p; });
}

CMG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                       unsigned int elem) {
  return linear_alloc<CUresult>(Api::cuMemAllocPitch_v2, MemKind::Linear,
                                [&] { return std::uint64_t(*pitch) * h; },
                                [&] { return CMG_REAL(cuMemAllocPitch_v2)(p, pitch, w, h, elem); },
                                [&] { return *p; });
}

CMG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) {
  return linear_alloc<CUresult>(Api::cuMemAllocManaged, MemKind::Managed, n,
                                [&] { return CMG_REAL(cuMemAllocManaged)(p, n, flags); },
                                [&] { return *p; });
}

CMG_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  return linear_free<CUresult>(Api::cuMemFree_v2, kDeviceFrees, p,
                               [&] { return CMG_REAL(cuMemFree_v2)(p); });
}

CMG_EXPORT CUresult cuMemAllocHost_v2(void **p, size_t n) {
  return linear_alloc<CUresult>(Api::cuMemAllocHost_v2, MemKind::Host, n,
                                [&] { return CMG_REAL(cuMemAllocHost_v2)(p, n); },
                                [&] { return reinterpret_cast<std::uintptr_t>(*p); });
}

CMG_EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
  return linear_alloc<CUresult>(Api::cuMemHostAlloc, MemKind::Host, n,
                                [&] { return CMG_REAL(cuMemHostAlloc)(p, n, flags); },
                                [&] { return reinterpret_cast<std::uintptr_t>(*p); });
}

CMG_EXPORT CUresult cuMemFreeHost(void *p) {
  return linear_free<CUresult>(Api::cuMemFreeHost, kHostFrees, reinterpret_cast<std::uintptr_t>(p),
                               [&] { return CMG_REAL(cuMemFreeHost)(p); });
}

CMG_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  return linear_alloc<CUresult>(Api::cuMemAllocAsync, MemKind::Async, n,
                                [&] { return CMG_REAL(cuMemAllocAsync)(p, n, s); }, [&] { return *p; });
}

CMG_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
  return linear_alloc<CUresult>(Api::cuMemAllocAsync_ptsz, MemKind::Async, n,
                                [&] { return CMG_REAL(cuMemAllocAsync_ptsz)(p, n, s); },
                                [&] { return *p; });
}

CMG_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
  return linear_alloc<CUresult>(Api::cuMemAllocFromPoolAsync, MemKind::Async, n,
                                [&] { return CMG_REAL(cuMemAllocFromPoolAsync)(p, n, pool, s); },
                                [&] { return *p; });
}

CMG_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool,
                                                 CUstream s) {
  return linear_alloc<CUresult>(Api::cuMemAllocFromPoolAsync_ptsz, MemKind::Async, n,
                                [&] { return CMG_REAL(cuMemAllocFromPoolAsync_ptsz)(p, n, pool, s); },
                                [&] { return *p; });
}

CMG_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  return linear_free<CUresult>(Api::cuMemFreeAsync, kDeviceFrees, p,
                               [&] { return CMG_REAL(cuMemFreeAsync)(p, s); });
}

CMG_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  return linear_free<CUresult>(Api::cuMemFreeAsync_ptsz, kDeviceFrees, p,
                               [&] { return CMG_REAL(cuMemFreeAsync_ptsz)(p, s); });
}

CMG_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  return pool_trim(Api::cuMemPoolTrimTo, pool, keep);
}

CMG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
                                const CUmemAllocationProp *prop, unsigned long long flags) {
  return vmm_create(h, n, prop, flags);
}

CMG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return vmm_release(h); }

CMG_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr,
                                        unsigned long long flags) {
  return vmm_reserve(p, n, align, addr, flags);
}

CMG_EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { return vmm_address_free(p, n); }

CMG_EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
                             unsigned long long flags) {
  return vmm_map(p, n, off, h, flags);
}

CMG_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) { return vmm_unmap(p, n); }

CMG_EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *desc,
                                   size_t count) {
  return vmm_set_access(p, n, desc, count);
}

CMG_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
  return vmm_retain(h, addr);
}

CMG_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
                                                 CUmemAllocationHandleType type,
                                                 unsigned long long flags) {
  return vmm_export(out, h, type, flags);
}

CMG_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
                                                   CUmemAllocationHandleType type) {
  return vmm_import(h, os, type);
}

// Legacy IPC answers in the driver's codes (docs/ipc-bridge.md, "Errors").
namespace {
constexpr bridge::Codes kIpcCodes{CUDA_SUCCESS,          CUDA_ERROR_INVALID_VALUE,
                                  CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_MAP_FAILED,
                                  CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_OUT_OF_MEMORY};
IpcApi ipc_api(Api a) { return IpcApi{a, kIpcCodes, false}; }
}  // namespace

CMG_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  return static_cast<CUresult>(ipc_get(ipc_api(Api::cuIpcGetMemHandle), h ? h->reserved : nullptr, p,
                                       [&] { return static_cast<int>(CMG_REAL(cuIpcGetMemHandle)(h, p)); }));
}

CMG_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  return static_cast<CUresult>(
      ipc_open(ipc_api(Api::cuIpcOpenMemHandle), h.reserved, flags, p != nullptr,
               [&] { return static_cast<int>(CMG_REAL(cuIpcOpenMemHandle)(p, h, flags)); },
               [&] { return static_cast<std::uint64_t>(*p); },
               [&](std::uint64_t v) { *p = static_cast<CUdeviceptr>(v); }));
}

CMG_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  return static_cast<CUresult>(
      ipc_open(ipc_api(Api::cuIpcOpenMemHandle_v2), h.reserved, flags, p != nullptr,
               [&] { return static_cast<int>(CMG_REAL(cuIpcOpenMemHandle_v2)(p, h, flags)); },
               [&] { return static_cast<std::uint64_t>(*p); },
               [&](std::uint64_t v) { *p = static_cast<CUdeviceptr>(v); }));
}

CMG_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  return static_cast<CUresult>(
      ipc_close(ipc_api(Api::cuIpcCloseMemHandle), p,
                [&] { return static_cast<int>(CMG_REAL(cuIpcCloseMemHandle)(p)); }));
}
