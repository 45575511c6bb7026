// SPDX-License-Identifier: Apache-2.0
// Tests of the fake driver's capture and graph model beyond what the conformance rows print: what a
// graph allocation holds (address, device memory only while live), when it is forgotten, and that
// a failed capture leaves nothing behind. Device memory is small ([env-small-memory-graph]) so that
// charging shows.
#include <catch2/catch.hpp>
#include <cuda.h>

#include "fakecuda.h"
#include "selftest_state.h"

namespace {

using selftest::require_nothing_live;
using selftest::state;

constexpr size_t kMiB = size_t{1} << 20;

fakecuda_graph_state graphs() {
  fakecuda_graph_state g{};
  REQUIRE(fakecuda_get_graph_state(&g) == 0);
  return g;
}

void init_ctx() {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext c = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c) == CUDA_SUCCESS);
}

}  // namespace

TEST_CASE("graph allocations: device memory while live, forgotten with their graphs",
          "[env-small-memory-graph]") {
  init_ctx();
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);

  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAllocAsync(&p, 40 * kMiB, s) == CUDA_SUCCESS);
  CHECK(graphs().captures == 1);
  CUgraph g = nullptr;
  REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  // The address is held, the memory is not used until a launch.
  CHECK(graphs().graph_allocs == 1);
  CHECK(state().device_used[0] == 0);
  CUgraphExec x = nullptr;
  REQUIRE(cuGraphInstantiate(&x, g, 0) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(x, s) == CUDA_SUCCESS);
  CHECK(graphs().graph_live == 1);
  CHECK(graphs().graph_live_bytes == 40 * kMiB);
  CHECK(state().device_used[0] == 40 * kMiB);
  // 64 MiB of device memory: a second 40 MiB does not fit while the graph's allocation is live.
  CUdeviceptr q = 0;
  CHECK(cuMemAlloc(&q, 40 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  // Its graph destroyed, the live allocation stays until it is freed (cuda.h).
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  CHECK(graphs().graph_allocs == 1);
  REQUIRE(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
  CHECK(state().device_used[0] == 0);
  CHECK(graphs().graph_allocs == 1);  // the executable graph allocates it again at each launch
  REQUIRE(cuGraphLaunch(x, s) == CUDA_SUCCESS);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);            // cuMemFree of a graph allocation does not wait
  CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);  // not live any more
  REQUIRE(cuGraphExecDestroy(x) == CUDA_SUCCESS);
  CHECK(graphs().graph_allocs == 0);

  // A capture invalidated by a prohibited call gives no graph and keeps none of its allocations.
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuMemAllocAsync(&p, kMiB, s) == CUDA_SUCCESS);
  CHECK(cuMemAlloc(&q, kMiB) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuMemAllocAsync(&q, kMiB, s) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  g = reinterpret_cast<CUgraph>(1);
  CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(g == nullptr);
  CHECK(graphs().graph_allocs == 0);
  CHECK(graphs().captures == 0);

  // Auto-free on launch: each launch frees what the last one left.
  REQUIRE(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
  CUDA_MEM_ALLOC_NODE_PARAMS np{};
  np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  np.bytesize = 8 * kMiB;
  CUgraphNode n = nullptr;
  REQUIRE(cuGraphAddMemAllocNode(&n, g, nullptr, 0, &np) == CUDA_SUCCESS);
  REQUIRE(cuGraphInstantiate(&x, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) ==
          CUDA_SUCCESS);
  CHECK(cuGraphInstantiate(&x, g, 0) == CUDA_ERROR_INVALID_VALUE);  // one instantiation at a time
  REQUIRE(cuGraphLaunch(x, s) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(x, s) == CUDA_SUCCESS);
  CHECK(state().device_used[0] == 8 * kMiB);
  REQUIRE(cuMemFree(np.dptr) == CUDA_SUCCESS);
  REQUIRE(cuGraphExecDestroy(x) == CUDA_SUCCESS);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  CHECK(graphs().graph_allocs == 0);
  CHECK(graphs().graphs == 0);
  CHECK(graphs().execs == 0);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  require_nothing_live();
}

TEST_CASE("the interaction mode is per thread and validated", "[capture]") {
  init_ctx();
  CUstreamCaptureMode m = static_cast<CUstreamCaptureMode>(7);
  CHECK(cuThreadExchangeStreamCaptureMode(&m) == CUDA_ERROR_INVALID_VALUE);
  m = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  REQUIRE(cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS);
  CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL);
  REQUIRE(cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS);
  CHECK(m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  // The legacy stream cannot be captured; a stream cannot be captured twice.
  CHECK(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
  CUgraph g = nullptr;
  REQUIRE(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
  CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  REQUIRE(cuGraphDestroy(g) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
}
