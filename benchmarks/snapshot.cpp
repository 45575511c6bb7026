// SPDX-License-Identifier: Apache-2.0
// cmg-bench-snapshot: what a boundary snapshot of what is resident costs with many live
// allocations (docs/performance.md, "Snapshots"). Run under the shim with an event log
// (tools/bench --snapshot does both, and runs it under callgrind for the instruction count).
//
//   cmg-bench-snapshot [--live N] [--sites S] [--reps R]
//
// N linear allocations of 64 KiB (default 100,000) are made from S distinct call stacks (default
// 1,024: a binary tree of call paths ten frames deep, so every allocation site is a stack of its
// own, as a program's many allocator call sites are), plus S VMM blocks mapped in one reservation.
// Then R snapshots are taken through cumemguard_snapshot() (what every boundary runs: the open
// runs end, then the models are visited in place and the rows written in chunks), each timed.
// Under callgrind the R snapshots, and nothing else, are dumped as "snapshot".
// Output: "op=snapshot live=N sites=S rows=... ns_median=... ns_min=... ns_max=...".
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../include/cumemguard.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define CMGB_ZERO() CALLGRIND_ZERO_STATS
#define CMGB_DUMP(name) CALLGRIND_DUMP_STATS_AT(name)
#else
#define CMGB_ZERO() ((void)0)
#define CMGB_DUMP(name) ((void)(name))
#endif

namespace {

#define CHECK(x)                                                           \
  do {                                                                     \
    const CUresult r_ = (x);                                               \
    if (r_ != CUDA_SUCCESS) {                                              \
      std::fprintf(stderr, "cmg-bench-snapshot: %s failed: %d\n", #x, r_); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

constexpr int kDepth = 10;  // 2^10 = 1,024 call paths
volatile int g_sink = 0;    // keeps each call a call (no tail call, no merge of the two sides)

__attribute__((noinline)) CUdeviceptr walk(unsigned path, int level, std::size_t size);

__attribute__((noinline)) CUdeviceptr left(unsigned path, int level, std::size_t size) {
  const CUdeviceptr p = walk(path, level + 1, size);
  g_sink = g_sink + 1;
  return p;
}

__attribute__((noinline)) CUdeviceptr right(unsigned path, int level, std::size_t size) {
  const CUdeviceptr p = walk(path, level + 1, size);
  g_sink = g_sink + 2;
  return p;
}

__attribute__((noinline)) CUdeviceptr walk(unsigned path, int level, std::size_t size) {
  if (level == kDepth) {
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, size));
    g_sink = g_sink + 3;
    return p;
  }
  return (path >> level) & 1 ? right(path, level, size) : left(path, level, size);
}

}  // namespace

int main(int argc, char **argv) {
  long live = 100000, sites = 1 << kDepth;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!std::strcmp(argv[i], "--live") && v) {
      live = std::atol(v), ++i;
    } else if (!std::strcmp(argv[i], "--sites") && v) {
      sites = std::clamp(std::atol(v), 1L, 1L << kDepth), ++i;
    } else if (!std::strcmp(argv[i], "--reps") && v) {
      reps = std::max(1, std::atoi(v)), ++i;
    } else {
      std::fprintf(stderr, "usage: cmg-bench-snapshot [--live N] [--sites S] [--reps R]\n");
      return 64;
    }
  }
  auto snap = reinterpret_cast<cumemguard_snapshot_fn>(dlsym(RTLD_DEFAULT, "cumemguard_snapshot"));
  if (!snap) {
    std::fprintf(stderr, "cmg-bench-snapshot: run it under the shim (LD_PRELOAD)\n");
    return 66;
  }
  CHECK(cuInit(0));
  CUdevice dev = 0;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  std::vector<CUdeviceptr> held(static_cast<std::size_t>(live));
  for (long i = 0; i < live; ++i)
    held[static_cast<std::size_t>(i)] = walk(static_cast<unsigned>(i % sites), 0, 64 << 10);

  // VMM blocks mapped in one reservation (one block per site count, at the granularity).
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  std::size_t g = 0;
  CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const std::size_t blocks = static_cast<std::size_t>(std::min(sites, 256L));
  CUdeviceptr va = 0;
  CHECK(cuMemAddressReserve(&va, blocks * g, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> hs(blocks);
  for (std::size_t b = 0; b < blocks; ++b) {
    CHECK(cuMemCreate(&hs[b], g, &prop, 0));
    CHECK(cuMemMap(va + b * g, g, 0, hs[b], 0));
  }

  if (snap("warm-up") == 0) {
    std::fprintf(stderr, "cmg-bench-snapshot: no snapshot written (is CUMEMGUARD_LOG set?)\n");
    return 66;
  }
  std::vector<double> ns;
  CMGB_ZERO();
  for (int r = 0; r < reps; ++r) {
    const std::uint64_t t0 = now_ns();
    snap("bench");
    ns.push_back(static_cast<double>(now_ns() - t0));
  }
  CMGB_DUMP("snapshot");
  std::sort(ns.begin(), ns.end());
  std::printf(
      "op=snapshot live=%ld vmm=%zu sites=%ld reps=%d ns_median=%.0f ns_min=%.0f "
      "ns_max=%.0f\n",
      live, blocks, sites, reps, ns[ns.size() / 2], ns.front(), ns.back());

  for (std::size_t b = 0; b < blocks; ++b) {
    CHECK(cuMemUnmap(va + b * g, g));
    CHECK(cuMemRelease(hs[b]));
  }
  CHECK(cuMemAddressFree(va, blocks * g));
  for (CUdeviceptr p : held) CHECK(cuMemFree(p));
  return 0;
}
