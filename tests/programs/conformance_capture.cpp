// SPDX-License-Identifier: Apache-2.0
// The stream-capture rows C1-C17 of real-driver.md section 7: which calls a capture refuses in
// which mode, when it is invalidated, what cuStreamEndCapture answers, and graph memory nodes.
// Their expected results come from NVIDIA's documentation (cuda.h 13.0 and the CUDA programming
// guide, cited per row there), not from a measurement; the gpu suite compares them with the real
// driver. Every row begins on a stream that is not capturing and leaves none capturing.
#include <cuda.h>

#include <thread>

#include "conformance.h"

namespace {

const char *status_name(CUstreamCaptureStatus s) {
  switch (s) {
    case CU_STREAM_CAPTURE_STATUS_NONE:
      return "none";
    case CU_STREAM_CAPTURE_STATUS_ACTIVE:
      return "active";
    case CU_STREAM_CAPTURE_STATUS_INVALIDATED:
      return "invalidated";
    default:
      return "unknown";
  }
}

const char *status_of(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = cuStreamIsCapturing(s, &st);
  return r == CUDA_SUCCESS ? status_name(st) : en(r);
}

const char *mode_name(CUstreamCaptureMode m) {
  switch (m) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL:
      return "global";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
      return "thread-local";
    case CU_STREAM_CAPTURE_MODE_RELAXED:
      return "relaxed";
    default:
      return "unknown";
  }
}

// Ends the capture on `s`; destroys the graph it returns. Writes whether there was one.
CUresult end(CUstream s, const char **graph = nullptr) {
  CUgraph g = nullptr;
  CUresult r = cuStreamEndCapture(s, &g);
  if (graph) *graph = g ? "graph" : "null";
  if (g) cuGraphDestroy(g);
  return r;
}

// Runs f on another thread with the same context current there (the mode rules are per thread).
template <class F>
CUresult on_other_thread(CUcontext ctx, F &&f) {
  CUresult r = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    r = cuCtxSetCurrent(ctx);
    if (r == CUDA_SUCCESS) r = f();
  });
  t.join();
  return r;
}

CUresult alloc_and_free() {
  CUdeviceptr p = 0;
  CUresult r = cuMemAlloc(&p, 1 << 20);
  if (r == CUDA_SUCCESS) cuMemFree(p);
  return r;
}

}  // namespace

void capture_rows(CUcontext ctx) {
  const size_t kMiB = size_t{1} << 20;
  CUstream ns = nullptr, bs = nullptr;  // a non-blocking and a blocking stream
  if (cuStreamCreate(&ns, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      cuStreamCreate(&bs, CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
    row("C0 stream-create failed");
    return;
  }

  {  // C1: an empty capture gives a graph.
    CUresult b = cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    const char *st = status_of(ns);
    CUgraph g = nullptr;
    CUresult e = cuStreamEndCapture(ns, &g);
    CUresult d = g ? cuGraphDestroy(g) : CUDA_ERROR_INVALID_VALUE;
    row("C1 capture-empty begin %s status %s end %s graph %s destroy %s", en(b), st, en(e),
        g ? "graph" : "null", en(d));
  }
  {  // C2: cuMemAlloc in a global-mode capture of the same thread.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUdeviceptr p = 0;
    CUresult a = cuMemAlloc(&p, kMiB);
    const char *st = status_of(ns);
    const char *graph = "";
    CUresult e = end(ns, &graph);
    if (a == CUDA_SUCCESS) cuMemFree(p);
    row("C2 global cuMemAlloc %s status %s end %s graph %s", en(a), st, en(e), graph);
  }
  {  // C3: cuMemFree in a global-mode capture; the refused free did nothing.
    CUdeviceptr p = 0;
    cuMemAlloc(&p, kMiB);
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult f = cuMemFree(p);
    CUresult e = end(ns);
    CUresult again = cuMemFree(p);
    row("C3 global cuMemFree %s end %s free-after-end %s", en(f), en(e), en(again));
  }
  {  // C4: the same calls from a thread in relaxed mode.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult x = cuThreadExchangeStreamCaptureMode(&m);
    const CUstreamCaptureMode previous = m;
    CUdeviceptr p = 0;
    CUresult a = cuMemAlloc(&p, kMiB);
    CUresult f = a == CUDA_SUCCESS ? cuMemFree(p) : a;
    cuThreadExchangeStreamCaptureMode(&m);
    CUresult e = end(ns);
    row("C4 global relaxed-thread exchange %s previous %s cuMemAlloc %s cuMemFree %s end %s", en(x),
        mode_name(previous), en(a), en(f), en(e));
  }
  {  // C5: a thread-local capture prohibits its own thread only.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    CUresult o = on_other_thread(ctx, alloc_and_free);
    CUdeviceptr p = 0;
    CUresult a = cuMemAlloc(&p, kMiB);
    if (a == CUDA_SUCCESS) cuMemFree(p);
    CUresult e = end(ns);
    row("C5 thread-local other-thread cuMemAlloc %s own-thread cuMemAlloc %s end %s", en(o), en(a),
        en(e));
  }
  {  // C6: a global-mode capture prohibits other threads in global mode too.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult o = on_other_thread(ctx, alloc_and_free);
    CUresult e = end(ns);
    row("C6 global other-thread cuMemAlloc %s end %s", en(o), en(e));
  }
  {  // C7: a relaxed capture prohibits nothing.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_RELAXED);
    CUresult a = alloc_and_free();
    CUresult e = end(ns);
    row("C7 relaxed own-thread cuMemAlloc %s end %s", en(a), en(e));
  }
  {  // C8: a synchronous copy uses the legacy stream while a blocking stream captures.
    CUdeviceptr p = 0;
    cuMemAlloc(&p, 4096);
    unsigned char host[64] = {};
    cuStreamBeginCapture(bs, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult c = cuMemcpyHtoD(p, host, sizeof host);
    CUresult e = end(bs);
    cuMemFree(p);
    row("C8 blocking-stream sync cuMemcpyHtoD %s end %s", en(c), en(e));
  }
  {  // C9: asking the legacy stream whether it captures: refused, the capture stays valid.
    cuStreamBeginCapture(bs, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult q = cuStreamIsCapturing(CU_STREAM_LEGACY, &st);
    const char *own = status_of(bs);
    CUresult e = end(bs);
    row("C9 blocking-stream legacy is-capturing %s capture %s end %s", en(q), own, en(e));
  }
  {  // C10: querying a capturing stream.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult q = cuStreamQuery(ns);
    CUresult e = end(ns);
    row("C10 query-capturing-stream %s end %s", en(q), en(e));
  }
  {  // C11: stream-ordered allocation in a capture: an allocation node and a free node.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUdeviceptr p = 0;
    CUresult a = cuMemAllocAsync(&p, kMiB, ns);
    CUresult f = a == CUDA_SUCCESS ? cuMemFreeAsync(p, ns) : a;
    CUgraph g = nullptr;
    CUresult e = cuStreamEndCapture(ns, &g);
    CUgraphExec x = nullptr;
    CUresult i = g ? cuGraphInstantiate(&x, g, 0) : e;
    CUresult l1 = x ? cuGraphLaunch(x, ns) : i;
    CUresult l2 = x ? cuGraphLaunch(x, ns) : i;
    CUresult sy = cuStreamSynchronize(ns);
    if (x) cuGraphExecDestroy(x);
    if (g) cuGraphDestroy(g);
    row("C11 capture cuMemAllocAsync %s %s cuMemFreeAsync %s end %s instantiate %s launch %s %s "
        "sync %s",
        en(a), p ? "address" : "null", en(f), en(e), en(i), en(l1), en(l2), en(sy));
  }
  {  // C12: an allocation node without a free node: live after a launch until freed outside.
    CUgraph g = nullptr;
    cuGraphCreate(&g, 0);
    CUDA_MEM_ALLOC_NODE_PARAMS np{};
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.poolProps.location.id = 0;
    np.bytesize = kMiB;
    CUgraphNode n = nullptr;
    CUresult an = cuGraphAddMemAllocNode(&n, g, nullptr, 0, &np);
    CUgraphExec x = nullptr;
    CUresult i = an == CUDA_SUCCESS ? cuGraphInstantiate(&x, g, 0) : an;
    CUresult l1 = x ? cuGraphLaunch(x, ns) : i;
    cuStreamSynchronize(ns);
    CUresult l2 = x ? cuGraphLaunch(x, ns) : i;
    CUresult f1 = np.dptr ? cuMemFreeAsync(np.dptr, ns) : an;
    cuStreamSynchronize(ns);
    CUresult l3 = x ? cuGraphLaunch(x, ns) : i;
    cuStreamSynchronize(ns);
    CUresult f2 = np.dptr ? cuMemFree(np.dptr) : an;
    if (x) cuGraphExecDestroy(x);
    cuGraphDestroy(g);
    row("C12 graph-alloc-node %s %s launch %s relaunch-unfreed %s cuMemFreeAsync %s relaunch %s "
        "cuMemFree %s",
        en(an), np.dptr ? "address" : "null", en(l1), en(l2), en(f1), en(l3), en(f2));
  }
  {  // C13: a free node must name a graph allocation.
    CUdeviceptr lin = 0;
    cuMemAlloc(&lin, kMiB);
    CUgraph g = nullptr;
    cuGraphCreate(&g, 0);
    CUgraphNode n = nullptr;
    CUresult fnode = cuGraphAddMemFreeNode(&n, g, nullptr, 0, lin);
    cuGraphDestroy(g);
    cuMemFree(lin);
    row("C13 graph-free-node non-graph-address %s", en(fnode));
  }
  {  // C14: a captured cuMemFreeAsync of memory no graph allocated.
    CUdeviceptr lin = 0;
    cuMemAlloc(&lin, kMiB);
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult f = cuMemFreeAsync(lin, ns);
    CUresult e = end(ns);
    CUresult again = cuMemFree(lin);
    row("C14 capture cuMemFreeAsync non-graph-address %s end %s free-after-end %s", en(f), en(e),
        en(again));
  }
  row("C15 graph-mem-trim %s", en(cuDeviceGraphMemTrim(0)));
  {  // C16: a global-mode capture is ended by the thread that began it.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult other = on_other_thread(ctx, [&] { return end(ns); });
    CUresult own = end(ns);
    row("C16 end-capture other-thread %s own-thread %s", en(other), en(own));
  }
  {  // C17: synchronising the context while one of its streams captures.
    cuStreamBeginCapture(ns, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult s = cuCtxSynchronize();
    CUresult e = end(ns);
    row("C17 ctx-synchronize-while-capturing %s end %s", en(s), en(e));
  }
  cuStreamDestroy(ns);
  cuStreamDestroy(bs);
}
