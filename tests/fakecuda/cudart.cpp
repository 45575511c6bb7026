// SPDX-License-Identifier: Apache-2.0
// Fake CUDA runtime 13 (shared libcudart.so.13 and static): the memory, IPC, stream and entry-point
// calls, reaching libcuda.so.1 the way the real cudart does.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "driver_entry.h"

#define FCRT_EXPORT extern "C" __attribute__((visibility("default")))

// The per-thread-default-stream exports of libcudart.so.13 (interposers.md 10.1) have the type of
// their legacy twin; the header only declares them under CUDA_API_PER_THREAD_DEFAULT_STREAM.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
extern "C" {
decltype(cudaMallocAsync) cudaMallocAsync_ptsz;
decltype(cudaFreeAsync) cudaFreeAsync_ptsz;
decltype(cudaMallocFromPoolAsync) cudaMallocFromPoolAsync_ptsz;
decltype(cudaGetDriverEntryPoint) cudaGetDriverEntryPoint_ptsz;
decltype(cudaGetDriverEntryPointByVersion) cudaGetDriverEntryPointByVersion_ptsz;
decltype(cudaStreamBeginCapture) cudaStreamBeginCapture_ptsz;
decltype(cudaStreamEndCapture) cudaStreamEndCapture_ptsz;
decltype(cudaStreamIsCapturing) cudaStreamIsCapturing_ptsz;
decltype(cudaGraphLaunch) cudaGraphLaunch_ptsz;
decltype(cudaStreamQuery) cudaStreamQuery_ptsz;
}
#pragma GCC diagnostic pop

namespace fcrt {
namespace {

struct Driver {
  fakecuda_entry::DriverEntry entry;
  cudaError_t error = cudaSuccess;  // why the runtime cannot work, sticky like the real one's
#define FCRT_DRV(member, sym, ver, flags, pfn) pfn member = nullptr;
#include "cudart_driver.def"
#undef FCRT_DRV
};

// The real runtime maps driver results one to one where a runtime code of that number exists.
cudaError_t to_rt(CUresult r) {
  if (r == CUDA_SUCCESS) return cudaSuccess;
  switch (static_cast<int>(r)) {
#define FCRT_ERR(e, s) case e:
#include "cudart_errors.def"
#undef FCRT_ERR
    return static_cast<cudaError_t>(r);
    default: return cudaErrorUnknown;
  }
}

Driver &driver() {
  static Driver *d = [] {
    auto *drv = new Driver;  // leaked: runtime calls from static destructors still work
    using fakecuda_entry::EntryError;
    switch (fakecuda_entry::open_driver(&drv->entry)) {
      case EntryError::None: break;
      case EntryError::NoLibrary:
      case EntryError::NoEntryPoint: drv->error = cudaErrorInsufficientDriver; return drv;
      case EntryError::InitFailed:
        drv->error = drv->entry.init == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : to_rt(drv->entry.init);
        return drv;
    }
    // Everything else through the pointer answered for ("cuGetProcAddress", 12000).
#define FCRT_DRV(member, sym, ver, flags, pfn)                                     \
  drv->entry.gpa(sym, reinterpret_cast<void **>(&drv->member), ver, flags, nullptr); \
  if (!drv->member) drv->error = cudaErrorInsufficientDriver;
#include "cudart_driver.def"
#undef FCRT_DRV
    return drv;
  }();
  return *d;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;
thread_local bool t_context_ready = false;
std::atomic<CUcontext> g_primary[64];

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

cudaError_t ret(CUresult r) { return ret(to_rt(r)); }

CUresult primary(int dev, CUcontext *out) {
  Driver &d = driver();
  if (dev < 0 || dev >= 64) return CUDA_ERROR_INVALID_DEVICE;
  if (CUcontext c = g_primary[dev].load()) {
    *out = c;
    return CUDA_SUCCESS;
  }
  CUcontext c = nullptr;
  if (CUresult r = d.primaryCtxRetain(&c, dev)) return r;
  CUcontext expected = nullptr;
  if (!g_primary[dev].compare_exchange_strong(expected, c)) {
    d.primaryCtxRelease(dev);  // another thread retained it first
    c = expected;
  }
  *out = c;
  return CUDA_SUCCESS;
}

// Like the real runtime, the first runtime call of each thread makes the device's primary context
// current there, unless the thread already has a context (then that context's device is used).
cudaError_t ensure() {
  Driver &d = driver();
  if (d.error != cudaSuccess) return d.error;
  if (t_context_ready) return cudaSuccess;
  CUcontext cur = nullptr;
  if (CUresult r = d.ctxGetCurrent(&cur)) return to_rt(r);
  if (cur) {
    CUdevice dev;
    if (d.ctxGetDevice_v2(&dev, cur) == CUDA_SUCCESS) t_device = dev;
  } else {
    CUcontext c;
    if (CUresult r = primary(t_device, &c)) return to_rt(r);
    if (CUresult r = d.ctxSetCurrent(c)) return to_rt(r);
  }
  t_context_ready = true;
  return cudaSuccess;
}

// Body of every runtime call that needs the driver: ensure(), then the driver call, then the
// result mapped and remembered for cudaGetLastError.
#define FCRT_CALL(...)                                  \
  do {                                                  \
    if (cudaError_t e_ = ensure()) return ret(e_);      \
    return ret(__VA_ARGS__);                            \
  } while (0)

CUdeviceptr dptr(const void *p) { return reinterpret_cast<CUdeviceptr>(p); }

cudaError_t malloc_dev(void **p, size_t size) {
  if (!p) return cudaErrorInvalidValue;
  if (cudaError_t e = ensure()) return e;
  if (size == 0) {  // cudaMalloc(&p, 0) succeeds with NULL and does not reach the driver
    *p = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr d = 0;
  CUresult r = driver().memAlloc(&d, size);
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void *>(d);
  return to_rt(r);
}

template <class F>
cudaError_t alloc_out(void **p, F &&f) {
  if (!p) return cudaErrorInvalidValue;
  if (cudaError_t e = ensure()) return e;
  CUdeviceptr d = 0;
  CUresult r = f(&d);
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void *>(d);
  return to_rt(r);
}

cudaError_t entry_point(const char *symbol, void **fn, int version, unsigned long long flags,
                        cudaDriverEntryPointQueryResult *status) {
  if (!symbol || !fn) return cudaErrorInvalidValue;
  if (cudaError_t e = ensure()) return e;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  // Through the stored ("cuGetProcAddress", 12000) pointer, as the real runtime does: this is
  // how PyTorch and NCCL reach the VMM API (real-driver.md section 5).
  CUresult r = driver().entry.gpa(symbol, fn, version, flags, &st);
  if (status) *status = static_cast<cudaDriverEntryPointQueryResult>(st);
  return to_rt(r);
}

int rt_device() {
  Driver &d = driver();
  CUcontext cur = nullptr;
  CUdevice dev;
  if (d.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur && d.ctxGetDevice_v2(&dev, cur) == CUDA_SUCCESS)
    return dev;
  return t_device;
}

const char *error_text(cudaError_t e, bool name) {
  switch (e) {
#define FCRT_ERR(en, s) \
  case en: return name ? #en : s;
#include "cudart_errors.def"
#undef FCRT_ERR
    default: return name ? "cudaErrorUnknown" : "unrecognized error code";
  }
}

}  // namespace
}  // namespace fcrt

using namespace fcrt;

FCRT_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) { return ret(malloc_dev(devPtr, size)); }

// cudaFree(nullptr) initialises the context and returns without a driver call (it never blocks:
// real-driver.md section 3).
FCRT_EXPORT cudaError_t cudaFree(void *devPtr) {
  if (cudaError_t e = ensure()) return ret(e);
  if (!devPtr) return cudaSuccess;
  return ret(driver().memFree(dptr(devPtr)));
}

FCRT_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) {
  if (!ptr) return ret(cudaErrorInvalidValue);
  FCRT_CALL(driver().memHostAlloc(ptr, size, 0));
}

FCRT_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  if (!pHost) return ret(cudaErrorInvalidValue);
  FCRT_CALL(driver().memHostAlloc(pHost, size, flags));
}

FCRT_EXPORT cudaError_t cudaFreeHost(void *ptr) {
  if (cudaError_t e = ensure()) return ret(e);
  if (!ptr) return cudaSuccess;
  return ret(driver().memFreeHost(ptr));
}

FCRT_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  return ret(alloc_out(devPtr, [&](CUdeviceptr *d) { return driver().memAllocAsync(d, size, hStream); }));
}

FCRT_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
  return ret(alloc_out(devPtr, [&](CUdeviceptr *d) { return driver().memAllocAsync_ptsz(d, size, hStream); }));
}

FCRT_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  FCRT_CALL(driver().memFreeAsync(dptr(devPtr), hStream));
}

FCRT_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) {
  FCRT_CALL(driver().memFreeAsync_ptsz(dptr(devPtr), hStream));
}

FCRT_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                                cudaStream_t stream) {
  return ret(alloc_out(ptr, [&](CUdeviceptr *d) {
    return driver().memAllocFromPoolAsync(d, size, memPool, stream);
  }));
}

FCRT_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                     cudaStream_t stream) {
  return ret(alloc_out(ptr, [&](CUdeviceptr *d) {
    return driver().memAllocFromPoolAsync_ptsz(d, size, memPool, stream);
  }));
}

FCRT_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  return ret(alloc_out(devPtr, [&](CUdeviceptr *d) { return driver().memAllocManaged(d, size, flags); }));
}

FCRT_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
  return ret(alloc_out(devPtr, [&](CUdeviceptr *d) {
    return driver().memAllocPitch(d, pitch, width, height, 4);
  }));
}

FCRT_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  FCRT_CALL(driver().deviceGetDefaultMemPool(memPool, device));
}

FCRT_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  FCRT_CALL(driver().memPoolTrimTo(memPool, minBytesToKeep));
}

FCRT_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
  static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle));
  if (!handle) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = ensure()) return ret(e);
  CUipcMemHandle h;
  CUresult r = driver().ipcGetMemHandle(&h, dptr(devPtr));
  if (r == CUDA_SUCCESS) std::memcpy(handle, &h, sizeof h);
  return ret(r);
}

FCRT_EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
                                             unsigned int flags) {
  CUipcMemHandle h;
  std::memcpy(&h, &handle, sizeof h);
  return ret(alloc_out(devPtr, [&](CUdeviceptr *d) { return driver().ipcOpenMemHandle_v2(d, h, flags); }));
}

FCRT_EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
  FCRT_CALL(driver().ipcCloseMemHandle(dptr(devPtr)));
}

// The 12.5+ four-argument form; it asks at the runtime's own version.
FCRT_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                                unsigned long long flags,
                                                cudaDriverEntryPointQueryResult *driverStatus) {
  return ret(entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus));
}

// Code built with per-thread default streams calls the _ptsz exports: "default" means per-thread.
FCRT_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                     unsigned long long flags,
                                                     cudaDriverEntryPointQueryResult *driverStatus) {
  if (flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
  return ret(entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus));
}

FCRT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                         unsigned int cudaVersion,
                                                         unsigned long long flags,
                                                         cudaDriverEntryPointQueryResult *driverStatus) {
  return ret(entry_point(symbol, funcPtr, static_cast<int>(cudaVersion), flags, driverStatus));
}

FCRT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    cudaDriverEntryPointQueryResult *driverStatus) {
  if (flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
  return ret(entry_point(symbol, funcPtr, static_cast<int>(cudaVersion), flags, driverStatus));
}

FCRT_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
  FCRT_CALL(driver().memcpy(dptr(dst), dptr(src), count));
}

FCRT_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                        enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
  FCRT_CALL(driver().memcpyAsync(dptr(dst), dptr(src), count, stream));
}

FCRT_EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  FCRT_CALL(driver().memsetD8(dptr(devPtr), static_cast<unsigned char>(value), count));
}

FCRT_EXPORT cudaError_t cudaDeviceSynchronize(void) { FCRT_CALL(driver().ctxSynchronize_v2(nullptr)); }

FCRT_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  FCRT_CALL(driver().streamCreate(pStream, 0));
}

FCRT_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  FCRT_CALL(driver().streamCreate(pStream, flags));
}

FCRT_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  FCRT_CALL(driver().streamDestroy(stream));
}

FCRT_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  FCRT_CALL(driver().streamSynchronize(stream));
}

FCRT_EXPORT cudaError_t cudaSetDevice(int device) {
  Driver &d = driver();
  if (d.error != cudaSuccess) return ret(d.error);
  int count = 0;
  if (CUresult r = d.deviceGetCount(&count)) return ret(r);
  if (device < 0 || device >= count) return ret(cudaErrorInvalidDevice);
  CUcontext c;
  if (CUresult r = primary(device, &c)) return ret(r);
  if (CUresult r = d.ctxSetCurrent(c)) return ret(r);
  t_device = device;
  t_context_ready = true;
  return cudaSuccess;
}

FCRT_EXPORT cudaError_t cudaGetDevice(int *device) {
  if (!device) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = ensure()) return ret(e);
  *device = rt_device();
  return cudaSuccess;
}

FCRT_EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return ret(cudaErrorInvalidValue);
  Driver &d = driver();
  if (d.error != cudaSuccess) {
    *count = 0;
    return ret(d.error);
  }
  return ret(d.deviceGetCount(count));
}

FCRT_EXPORT cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

FCRT_EXPORT cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

FCRT_EXPORT const char *cudaGetErrorString(cudaError_t error) { return error_text(error, false); }

FCRT_EXPORT const char *cudaGetErrorName(cudaError_t error) { return error_text(error, true); }

// Without a usable driver the runtime reports 0, as the real one does.
FCRT_EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return ret(cudaErrorInvalidValue);
  Driver &d = driver();
  *driverVersion = 0;
  if (d.error == cudaErrorInsufficientDriver) return cudaSuccess;
  if (d.driverGetVersion) return ret(d.driverGetVersion(driverVersion));
  return cudaSuccess;
}

FCRT_EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return ret(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;  // 13000
  return cudaSuccess;
}

FCRT_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                                 const void *ptr) {
  if (!attributes) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = ensure()) return ret(e);
  unsigned type = 0;
  int ordinal = -2, managed = 0;
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void *data[] = {&type, &ordinal, &managed};
  if (CUresult r = driver().pointerGetAttributes(3, which, data, dptr(ptr))) return ret(r);
  attributes->device = ordinal;
  if (managed) {
    attributes->type = cudaMemoryTypeManaged;
    attributes->devicePointer = attributes->hostPointer = const_cast<void *>(ptr);
  } else if (type == CU_MEMORYTYPE_DEVICE) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void *>(ptr);
    attributes->hostPointer = nullptr;
  } else if (type == CU_MEMORYTYPE_HOST) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = attributes->hostPointer = const_cast<void *>(ptr);
  } else {  // memory the driver does not know: unregistered host memory, not an error
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->devicePointer = nullptr;
    attributes->hostPointer = const_cast<void *>(ptr);
  }
  return cudaSuccess;
}

FCRT_EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  FCRT_CALL(driver().memGetInfo(free, total));
}

FCRT_EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream) { FCRT_CALL(driver().streamQuery(stream)); }

FCRT_EXPORT cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream) {
  FCRT_CALL(driver().streamQuery_ptsz(stream));
}

// ---- stream capture and graphs: one driver call each, as the real runtime makes them ----------
// The runtime's capture modes and statuses have the driver's values.
static_assert(static_cast<int>(cudaStreamCaptureModeRelaxed) == CU_STREAM_CAPTURE_MODE_RELAXED &&
              static_cast<int>(cudaStreamCaptureStatusInvalidated) ==
                  CU_STREAM_CAPTURE_STATUS_INVALIDATED);

FCRT_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  FCRT_CALL(driver().streamBeginCapture(stream, static_cast<CUstreamCaptureMode>(mode)));
}

FCRT_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                    enum cudaStreamCaptureMode mode) {
  FCRT_CALL(driver().streamBeginCapture_ptsz(stream, static_cast<CUstreamCaptureMode>(mode)));
}

FCRT_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
  FCRT_CALL(driver().streamEndCapture(stream, reinterpret_cast<CUgraph *>(pGraph)));
}

FCRT_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph) {
  FCRT_CALL(driver().streamEndCapture_ptsz(stream, reinterpret_cast<CUgraph *>(pGraph)));
}

FCRT_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus *pCaptureStatus) {
  FCRT_CALL(driver().streamIsCapturing(stream, reinterpret_cast<CUstreamCaptureStatus *>(pCaptureStatus)));
}

FCRT_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                                   enum cudaStreamCaptureStatus *pCaptureStatus) {
  FCRT_CALL(driver().streamIsCapturing_ptsz(stream,
                                            reinterpret_cast<CUstreamCaptureStatus *>(pCaptureStatus)));
}

FCRT_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  FCRT_CALL(driver().threadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode *>(mode)));
}

FCRT_EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags) {
  FCRT_CALL(driver().graphCreate(reinterpret_cast<CUgraph *>(pGraph), flags));
}

FCRT_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  FCRT_CALL(driver().graphDestroy(reinterpret_cast<CUgraph>(graph)));
}

// cudaMemAllocNodeParams and CUDA_MEM_ALLOC_NODE_PARAMS describe the same fields in the same order.
static_assert(sizeof(cudaMemAllocNodeParams) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) &&
              sizeof(cudaMemPoolProps) == sizeof(CUmemPoolProps) &&
              sizeof(cudaMemAccessDesc) == sizeof(CUmemAccessDesc));

FCRT_EXPORT cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                 const cudaGraphNode_t *pDependencies,
                                                 size_t numDependencies,
                                                 struct cudaMemAllocNodeParams *nodeParams) {
  if (!nodeParams) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = ensure()) return ret(e);
  CUDA_MEM_ALLOC_NODE_PARAMS p;
  std::memcpy(&p, nodeParams, sizeof p);
  CUresult r = driver().graphAddMemAllocNode(reinterpret_cast<CUgraphNode *>(pGraphNode),
                                             reinterpret_cast<CUgraph>(graph),
                                             reinterpret_cast<const CUgraphNode *>(pDependencies),
                                             numDependencies, &p);
  if (r == CUDA_SUCCESS) nodeParams->dptr = reinterpret_cast<void *>(p.dptr);
  return ret(r);
}

FCRT_EXPORT cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                const cudaGraphNode_t *pDependencies,
                                                size_t numDependencies, void *devPtr) {
  FCRT_CALL(driver().graphAddMemFreeNode(reinterpret_cast<CUgraphNode *>(pGraphNode),
                                         reinterpret_cast<CUgraph>(graph),
                                         reinterpret_cast<const CUgraphNode *>(pDependencies),
                                         numDependencies, fcrt::dptr(devPtr)));
}

FCRT_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                             unsigned long long flags) {
  FCRT_CALL(driver().graphInstantiateWithFlags(reinterpret_cast<CUgraphExec *>(pGraphExec),
                                               reinterpret_cast<CUgraph>(graph), flags));
}

FCRT_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                      unsigned long long flags) {
  FCRT_CALL(driver().graphInstantiateWithFlags(reinterpret_cast<CUgraphExec *>(pGraphExec),
                                               reinterpret_cast<CUgraph>(graph), flags));
}

FCRT_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  FCRT_CALL(driver().graphLaunch(reinterpret_cast<CUgraphExec>(graphExec), stream));
}

FCRT_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
  FCRT_CALL(driver().graphLaunch_ptsz(reinterpret_cast<CUgraphExec>(graphExec), stream));
}

FCRT_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  FCRT_CALL(driver().graphExecDestroy(reinterpret_cast<CUgraphExec>(graphExec)));
}

FCRT_EXPORT cudaError_t cudaDeviceGraphMemTrim(int device) {
  FCRT_CALL(driver().deviceGraphMemTrim(device));
}
