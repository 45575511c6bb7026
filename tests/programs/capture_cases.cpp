// SPDX-License-Identifier: Apache-2.0
// Stream capture, graphs and stream-ordered memory through the CUDA runtime (dynamic or static
// cudart) and the driver: each finding's failing program and its fixed variant, graph allocations
// freed and launched again, the shim's own work around an open capture. Prints one "step STATUS"
// line per call whose result matters. The same binary runs on the fake stack and on the GPU.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "cuda_check.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

void out(const char *step, cudaError_t r) {
  std::printf("%s %s\n", step, cudaGetErrorName(r));
}
void out_cu(const char *step, CUresult r) {
  std::printf("%s %s\n", step, cu_name(r));
}

cudaStream_t nonblocking() {
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// Ends the capture of s, prints the status and whether a graph came back, destroys it.
void end(cudaStream_t s) {
  cudaGraph_t g = nullptr;
  out("end", cudaStreamEndCapture(s, &g));
  std::printf("graph %s\n", g ? "graph" : "null");
  if (g) CHECK_CUDA(cudaGraphDestroy(g));
  (void)cudaGetLastError();
}

// Keeps `stream` busy for about ms milliseconds: the fake driver's busy model, or a host function
// queued on the stream of the real one (looked up at run time: the fake runtime has none).
void make_busy(cudaStream_t stream, int ms) {
  using busy_fn = void (*)(int, unsigned long long);
  if (auto f = reinterpret_cast<busy_fn>(dlsym(RTLD_DEFAULT, "fakecuda_set_busy"))) {
    f(0, static_cast<unsigned long long>(ms) * 1000000ULL);
    return;
  }
  using host_fn = cudaError_t (*)(cudaStream_t, cudaHostFn_t, void *);
  auto launch = reinterpret_cast<host_fn>(dlsym(RTLD_DEFAULT, "cudaLaunchHostFunc"));
  static int wait_ms;
  wait_ms = ms;
  if (launch)
    CHECK_CUDA(launch(
        stream,
        [](void *p) {
          std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int *>(p)));
        },
        &wait_ms));
}

// ---- capture-unsafe ----------------------------------------------------------------------------

// A synchronous free inside a global-mode capture of the same thread (an allocator releasing a
// block when an allocation inside the capture fails).
int unsafe_free(bool fixed) {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, kMiB));
  cudaStream_t s = nonblocking();
  if (fixed) out("free_before", cudaFree(p));  // fixed: freed before the capture begins
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (!fixed) out("free_in_capture", cudaFree(p));
  end(s);
  if (!fixed) out("free_after", cudaFree(p));  // the refused free did nothing
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// Another thread allocates while a capture is open (a library connecting lazily inside capture).
// Fixed: the capture is begun in thread-local mode, which other threads' calls do not meet.
int unsafe_other_thread(bool fixed) {
  cudaStream_t s = nonblocking();
  CHECK_CUDA(cudaStreamBeginCapture(
      s, fixed ? cudaStreamCaptureModeThreadLocal : cudaStreamCaptureModeGlobal));
  cudaError_t r = cudaErrorUnknown;
  std::thread t([&] {
    CHECK_CUDA(cudaSetDevice(0));
    void *q = nullptr;
    r = cudaMalloc(&q, kMiB);
    if (r == cudaSuccess) CHECK_CUDA(cudaFree(q));
    (void)cudaGetLastError();
  });
  t.join();
  out("other_thread_malloc", r);
  end(s);
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// ---- capture-failed ----------------------------------------------------------------------------

// A capture that allocates its pool with cudaMalloc in relaxed mode (as PyTorch's allocator does)
// and is then invalidated by a query of the capturing stream. Fixed: no query.
int failed(bool fixed) {
  cudaStream_t s = nonblocking();
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  void *pool = nullptr;
  out("pool_malloc", cudaMalloc(&pool, 2 * kMiB));
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  if (!fixed) out("query", cudaStreamQuery(s));
  cudaGraph_t g = nullptr;
  out("end", cudaStreamEndCapture(s, &g));
  std::printf("graph %s\n", g ? "graph" : "null");
  (void)cudaGetLastError();
  if (g) {
    cudaGraphExec_t x = nullptr;
    out("instantiate", cudaGraphInstantiate(&x, g, 0));
    out("launch", cudaGraphLaunch(x, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaGraphExecDestroy(x));
    CHECK_CUDA(cudaGraphDestroy(g));
  }
  out("pool_free", cudaFree(pool));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// ---- free-kind-mismatch ------------------------------------------------------------------------

// cudaFree of cudaMallocAsync memory while its stream still works. Fixed: the stream is
// synchronized first.
int kind_sync_of_async(bool fixed) {
  cudaStream_t s = nonblocking();
  void *p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kMiB, s));
  make_busy(s, 300);
  if (fixed) out("sync", cudaStreamSynchronize(s));
  out("free", cudaFree(p));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// cudaFreeAsync on stream s of cudaMalloc memory while the legacy stream still works. Fixed: the
// device is synchronized first.
int kind_async_of_sync(bool fixed) {
  cudaStream_t s = nonblocking();
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, kMiB));
  make_busy(nullptr, 300);
  if (fixed) out("sync", cudaDeviceSynchronize());
  out("free_async", cudaFreeAsync(p, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// ---- graph-owned addresses
// -----------------------------------------------------------------------

// A graph allocation at an address a freed cudaMalloc had (the driver hands it out again): freed
// after each launch and launched again. A model that took the second address for a freed linear
// allocation would skip the free as a double free, and the relaunch would fail (cuda.h,
// cuGraphLaunch: unfreed allocations).
int graph_owned() {
  void *old = nullptr;
  CHECK_CUDA(cudaMalloc(&old, kMiB));
  CHECK_CUDA(cudaFree(old));
  cudaStream_t s = nonblocking();
  cudaGraph_t g = nullptr;
  CHECK_CUDA(cudaGraphCreate(&g, 0));
  cudaMemAllocNodeParams np{};
  np.poolProps.allocType = cudaMemAllocationTypePinned;
  np.poolProps.location.type = cudaMemLocationTypeDevice;
  np.poolProps.location.id = 0;
  np.bytesize = kMiB;
  cudaGraphNode_t n = nullptr;
  out("alloc_node", cudaGraphAddMemAllocNode(&n, g, nullptr, 0, &np));
  std::printf("reused %d\n", np.dptr == old ? 1 : 0);
  cudaGraphExec_t x = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&x, g, 0));
  for (int i = 1; i <= 3; ++i) {
    char step[32];
    std::snprintf(step, sizeof step, "launch%d", i);
    out(step, cudaGraphLaunch(x, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    std::snprintf(step, sizeof step, "free%d", i);
    out(step, i % 2 ? cudaFree(np.dptr) : cudaFreeAsync(np.dptr, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
  }
  out("free_again", cudaFree(np.dptr));  // not live: the driver refuses
  (void)cudaGetLastError();
  CHECK_CUDA(cudaGraphExecDestroy(x));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// A captured stream-ordered allocation the graph does not free, freed by the program after each
// launch; and one left live at exit, with the pool allocation of another capture (leak records
// tagged as the graphs').
int graph_memory(bool leave) {
  cudaStream_t s = nonblocking();
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  void *pool = nullptr;
  out("pool_malloc", cudaMalloc(&pool, 3 * kMiB));
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  void *p = nullptr, *t = nullptr;
  out("capture_malloc_async", cudaMallocAsync(&p, 4 * kMiB, s));
  out("capture_tmp_async", cudaMallocAsync(&t, kMiB, s));
  out("capture_free_async", cudaFreeAsync(t, s));
  cudaGraph_t g = nullptr;
  out("end", cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&x, g, 0));
  out("launch1", cudaGraphLaunch(x, s));
  out("free1", cudaFreeAsync(p, s));
  out("launch2", cudaGraphLaunch(x, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  if (!leave) {
    out("free2", cudaFree(p));
    out("pool_free", cudaFree(pool));
  }
  CHECK_CUDA(cudaGraphExecDestroy(x));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// ---- the shim's own work around an open capture
// ---------------------------------------------------

// Memory freed before a capture (held back by the quarantine under the shim) is needed by a VMM
// allocation inside it (PyTorch's expandable segments growing during a capture). Without the
// shim the free happened and the allocation succeeds; a shim that released its held frees to retry
// inside the capture would invalidate it.
int quarantine_capture() {
  init_primary();
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 40 * kMiB));
  out("free_before", cudaFree(p));
  cudaStream_t s = nonblocking();
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  CUresult c = cuMemCreate(&h, 40 * kMiB, &prop, 0);
  out_cu("create_in_capture", c);
  end(s);
  if (c == CUDA_SUCCESS) out_cu("release", cuMemRelease(h));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// An unmap inside a capture of a blocking stream (allowed), with the shim's busy check on: its
// query of the legacy stream would be refused and invalidate the capture.
int busy_in_capture() {
  init_primary();
  const CUmemAllocationProp prop = device_prop();
  const size_t size = 2 * kMiB;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  CHECK_CU(cuMemCreate(&h, size, &prop, 0));
  CHECK_CU(cuMemAddressReserve(&v, size, 0, 0, 0));
  CHECK_CU(cuMemMap(v, size, 0, h, 0));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreate(&s));  // blocking: the legacy stream depends on it
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  out_cu("unmap_in_capture", cuMemUnmap(v, size));
  end(s);
  out_cu("release", cuMemRelease(h));
  out_cu("address_free", cuMemAddressFree(v, size));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// The driver API's capture (cuStreamBeginCapture_v2 / cuStreamEndCapture): a synchronous
// cuMemAlloc in a global-mode capture.
int driver_unsafe() {
  init_primary();
  CUstream s = nullptr;
  CHECK_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr p = 0;
  out_cu("alloc_in_capture", cuMemAlloc(&p, kMiB));
  CUgraph g = nullptr;
  out_cu("end", cuStreamEndCapture(s, &g));
  std::printf("graph %s\n", g ? "graph" : "null");
  CHECK_CU(cuStreamDestroy(s));
  return 0;
}

// A mode that is no enumerator (7), passed to the runtime's and the driver's exchange: refused,
// and the thread's mode stays what it was (global), so a relaxed exchange afterwards returns global
// and the relaxed thread's cudaMalloc inside a global-mode capture is allowed, with no finding.
int exchange_invalid() {
  init_primary();
  int bad = 7;
  out("exchange_invalid",
      cudaThreadExchangeStreamCaptureMode(reinterpret_cast<cudaStreamCaptureMode *>(&bad)));
  out_cu("cu_exchange_invalid",
         cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode *>(&bad)));
  std::printf("value_after %d\n", bad);
  cudaStream_t s = nonblocking();
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  out("exchange_relaxed", cudaThreadExchangeStreamCaptureMode(&m));
  std::printf("previous %d\n", static_cast<int>(m));
  void *p = nullptr;
  out("relaxed_malloc", cudaMalloc(&p, kMiB));
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  end(s);
  out("free_after", cudaFree(p));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: capture_cases CASE\n");
    return 64;
  }
  const std::string c = argv[1];
  if (c == "unsafe-free") return unsafe_free(false);
  if (c == "unsafe-free-fixed") return unsafe_free(true);
  if (c == "unsafe-other-thread") return unsafe_other_thread(false);
  if (c == "unsafe-other-thread-fixed") return unsafe_other_thread(true);
  if (c == "failed") return failed(false);
  if (c == "failed-fixed") return failed(true);
  if (c == "kind-sync-of-async") return kind_sync_of_async(false);
  if (c == "kind-sync-of-async-fixed") return kind_sync_of_async(true);
  if (c == "kind-async-of-sync") return kind_async_of_sync(false);
  if (c == "kind-async-of-sync-fixed") return kind_async_of_sync(true);
  if (c == "graph-owned") return graph_owned();
  if (c == "graph-memory") return graph_memory(false);
  if (c == "graph-leak") return graph_memory(true);
  if (c == "quarantine-capture") return quarantine_capture();
  if (c == "busy-in-capture") return busy_in_capture();
  if (c == "driver-unsafe") return driver_unsafe();
  if (c == "exchange-invalid") return exchange_invalid();
  std::fprintf(stderr, "capture_cases: unknown case %s\n", c.c_str());
  return 64;
}
