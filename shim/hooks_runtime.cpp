// SPDX-License-Identifier: Apache-2.0
// Exported runtime entry points (unversioned: they interpose cudaMalloc@@libcudart.so.13 of a
// dynamic cudart, interposers.md 9.1). The driver calls cudart makes underneath are not recorded
// again: the re-entry guard is held for the whole runtime call.
#include "handlers.h"
#include "torch_host.h"

using namespace cmg::shim;
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

// The wrappers handle-scoped dlsym answers hand out (Route::Given).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void *const cmg::shim::kGivenRuntimeWrappers[] = {
#define CMG_RT(n, d) reinterpret_cast<void *>(&hook_##n<Route::Given>),
#include "api_runtime.def"
#undef CMG_RT
};
#pragma GCC diagnostic pop
