// SPDX-License-Identifier: Apache-2.0
// Exported stream-capture and graph entry points, runtime and driver: one line each into the
// handlers (handlers_capture.h). They are reached like the memory hooks: the runtime's through the
// PLT and dlsym, the driver's through the PLT, dlsym and cuGetProcAddress routing (the runtime gets
// every driver function that way: real-driver.md section 5). A runtime call reaches the driver
// underneath; the re-entry guard records it once, under the runtime's name.
#include <cstring>

#include "handlers_capture.h"

using namespace cmg::shim;

namespace {
std::uint64_t h(const void *p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
constexpr int kGlobal = CU_STREAM_CAPTURE_MODE_GLOBAL;
// A mode the program passes (or the driver writes back) read as the number it is: a program may
// pass any value, which is then no enumerator, and loading it as the enum type is undefined.
static_assert(sizeof(CUstreamCaptureMode) == sizeof(int) &&
              sizeof(cudaStreamCaptureMode) == sizeof(int));
int mode_at(const void *mode) {
  int v = -1;
  if (mode) std::memcpy(&v, mode, sizeof v);
  return v;
}
}  // namespace

// ---- driver ------------------------------------------------------------------------------------

// The CUDA 10.0 entry points take no mode: they begin a global-mode capture.
CMG_EXPORT CUresult cuStreamBeginCapture(CUstream s) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture, h(s), false, kGlobal,
                                 [&] { return CMG_REAL(cuStreamBeginCapture)(s); });
}

CMG_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture_ptsz, h(s), true, kGlobal,
                                 [&] { return CMG_REAL(cuStreamBeginCapture_ptsz)(s); });
}

CMG_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture_v2, h(s), false, mode,
                                 [&] { return CMG_REAL(cuStreamBeginCapture_v2)(s, mode); });
}

CMG_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return capture_begin<CUresult>(Api::cuStreamBeginCapture_v2_ptsz, h(s), true, mode,
                                 [&] { return CMG_REAL(cuStreamBeginCapture_v2_ptsz)(s, mode); });
}

CMG_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
  return capture_end<CUresult>(
      Api::cuStreamEndCapture, h(s), false, [&] { return CMG_REAL(cuStreamEndCapture)(s, g); },
      [&] { return g ? h(*g) : 0; });
}

CMG_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
  return capture_end<CUresult>(
      Api::cuStreamEndCapture_ptsz, h(s), true,
      [&] { return CMG_REAL(cuStreamEndCapture_ptsz)(s, g); }, [&] { return g ? h(*g) : 0; });
}

CMG_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  const int asked = mode_at(mode);
  return graph_call<CUresult>(
      Api::cuThreadExchangeStreamCaptureMode, StackWhen::Never,
      [&] { return CMG_REAL(cuThreadExchangeStreamCaptureMode)(mode); },
      [&](Call &c, int r) { capture_after_exchange(c, asked, mode_at(mode), r); });
}

CMG_EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                       size_t n) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiate, StackWhen::Never,
      [&] { return CMG_REAL(cuGraphInstantiate)(e, g, err, log, n); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                          size_t n) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiate_v2, StackWhen::Never,
      [&] { return CMG_REAL(cuGraphInstantiate_v2)(e, g, err, log, n); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g,
                                                unsigned long long flags) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiateWithFlags, StackWhen::Never,
      [&] { return CMG_REAL(cuGraphInstantiateWithFlags)(e, g, flags); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                                 CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiateWithParams, StackWhen::Never,
      [&] { return CMG_REAL(cuGraphInstantiateWithParams)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  return graph_call<CUresult>(
      Api::cuGraphInstantiateWithParams_ptsz, StackWhen::Never,
      [&] { return CMG_REAL(cuGraphInstantiateWithParams_ptsz)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  return graph_call<CUresult>(
      Api::cuGraphLaunch, StackWhen::Never, [&] { return CMG_REAL(cuGraphLaunch)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), false, r); });
}

CMG_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return graph_call<CUresult>(
      Api::cuGraphLaunch_ptsz, StackWhen::Never, [&] { return CMG_REAL(cuGraphLaunch_ptsz)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), true, r); });
}

CMG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  return graph_call<CUresult>(
      Api::cuGraphExecDestroy, StackWhen::Never, [&] { return CMG_REAL(cuGraphExecDestroy)(e); },
      [&](Call &c, int r) { graph_after_exec_destroy(c, h(e), r); });
}

CMG_EXPORT CUresult cuGraphDestroy(CUgraph g) {
  return graph_call<CUresult>(
      Api::cuGraphDestroy, StackWhen::Never, [&] { return CMG_REAL(cuGraphDestroy)(g); },
      [&](Call &c, int r) { graph_after_destroy(c, h(g), r); });
}

CMG_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                           size_t n, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  return graph_call<CUresult>(
      Api::cuGraphAddMemAllocNode, StackWhen::Sampled,
      [&] { return CMG_REAL(cuGraphAddMemAllocNode)(node, g, deps, n, p); },
      [&](Call &c, int r) {
        graph_after_alloc_node(c, h(g), p ? p->dptr : 0, p ? p->bytesize : 0,
                               p ? p->poolProps.location.id : -1, r);
      });
}

CMG_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                          size_t n, CUdeviceptr p) {
  return graph_call<CUresult>(
      Api::cuGraphAddMemFreeNode, StackWhen::Never,
      [&] { return CMG_REAL(cuGraphAddMemFreeNode)(node, g, deps, n, p); },
      [&](Call &c, int r) { graph_after_free_node(c, h(g), p, r); });
}

CMG_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
  return graph_call<CUresult>(
      Api::cuDeviceGraphMemTrim, StackWhen::Never,
      [&] { return CMG_REAL(cuDeviceGraphMemTrim)(dev); },
      [&](Call &c, int r) { graph_after_mem_trim(c, dev, r); });
}

// ---- runtime -----------------------------------------------------------------------------------

CMG_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  return capture_begin<cudaError_t>(Api::cudaStreamBeginCapture, h(s), false, mode,
                                    [&] { return CMG_REAL(cudaStreamBeginCapture)(s, mode); });
}

CMG_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s,
                                                   enum cudaStreamCaptureMode mode) {
  return capture_begin<cudaError_t>(Api::cudaStreamBeginCapture_ptsz, h(s), true, mode,
                                    [&] { return CMG_REAL(cudaStreamBeginCapture_ptsz)(s, mode); });
}

CMG_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  return capture_end<cudaError_t>(
      Api::cudaStreamEndCapture, h(s), false, [&] { return CMG_REAL(cudaStreamEndCapture)(s, g); },
      [&] { return g ? h(*g) : 0; });
}

CMG_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g) {
  return capture_end<cudaError_t>(
      Api::cudaStreamEndCapture_ptsz, h(s), true,
      [&] { return CMG_REAL(cudaStreamEndCapture_ptsz)(s, g); }, [&] { return g ? h(*g) : 0; });
}

CMG_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  const int asked = mode_at(mode);
  return graph_call<cudaError_t>(
      Api::cudaThreadExchangeStreamCaptureMode, StackWhen::Never,
      [&] { return CMG_REAL(cudaThreadExchangeStreamCaptureMode)(mode); },
      [&](Call &c, int r) { capture_after_exchange(c, asked, mode_at(mode), r); });
}

CMG_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g,
                                            unsigned long long flags) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiate, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphInstantiate)(e, g, flags); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g,
                                                     unsigned long long flags) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiateWithFlags, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphInstantiateWithFlags)(e, g, flags); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *e, cudaGraph_t g,
                                                      cudaGraphInstantiateParams *p) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiateWithParams, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphInstantiateWithParams)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *e, cudaGraph_t g,
                                                           cudaGraphInstantiateParams *p) {
  return graph_call<cudaError_t>(
      Api::cudaGraphInstantiateWithParams_ptsz, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphInstantiateWithParams_ptsz)(e, g, p); },
      [&](Call &c, int r) { graph_after_instantiate(c, e ? h(*e) : 0, h(g), r); });
}

CMG_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  return graph_call<cudaError_t>(
      Api::cudaGraphLaunch, StackWhen::Never, [&] { return CMG_REAL(cudaGraphLaunch)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), false, r); });
}

CMG_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t e, cudaStream_t s) {
  return graph_call<cudaError_t>(
      Api::cudaGraphLaunch_ptsz, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphLaunch_ptsz)(e, s); },
      [&](Call &c, int r) { graph_after_launch(c, h(e), h(s), true, r); });
}

CMG_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  return graph_call<cudaError_t>(
      Api::cudaGraphExecDestroy, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphExecDestroy)(e); },
      [&](Call &c, int r) { graph_after_exec_destroy(c, h(e), r); });
}

CMG_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  return graph_call<cudaError_t>(
      Api::cudaGraphDestroy, StackWhen::Never, [&] { return CMG_REAL(cudaGraphDestroy)(g); },
      [&](Call &c, int r) { graph_after_destroy(c, h(g), r); });
}

CMG_EXPORT cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *node, cudaGraph_t g,
                                                const cudaGraphNode_t *deps, size_t n,
                                                struct cudaMemAllocNodeParams *p) {
  return graph_call<cudaError_t>(
      Api::cudaGraphAddMemAllocNode, StackWhen::Sampled,
      [&] { return CMG_REAL(cudaGraphAddMemAllocNode)(node, g, deps, n, p); },
      [&](Call &c, int r) {
        graph_after_alloc_node(c, h(g), p ? h(p->dptr) : 0, p ? p->bytesize : 0,
                               p ? p->poolProps.location.id : -1, r);
      });
}

CMG_EXPORT cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *node, cudaGraph_t g,
                                               const cudaGraphNode_t *deps, size_t n, void *p) {
  return graph_call<cudaError_t>(
      Api::cudaGraphAddMemFreeNode, StackWhen::Never,
      [&] { return CMG_REAL(cudaGraphAddMemFreeNode)(node, g, deps, n, p); },
      [&](Call &c, int r) { graph_after_free_node(c, h(g), h(p), r); });
}

CMG_EXPORT cudaError_t cudaDeviceGraphMemTrim(int dev) {
  return graph_call<cudaError_t>(
      Api::cudaDeviceGraphMemTrim, StackWhen::Never,
      [&] { return CMG_REAL(cudaDeviceGraphMemTrim)(dev); },
      [&](Call &c, int r) { graph_after_mem_trim(c, dev, r); });
}
