// SPDX-License-Identifier: Apache-2.0
// Intercepted-call benchmarks on the CUDA stack found at run time (the fake one in CI, with
// FAKECUDA_BENCH=1). The shim's cost is the difference of medians between a run without and a run
// with LD_PRELOAD=libcumemguard.so of this same binary (tools/bench does both and prints a table).
#include <benchmark/benchmark.h>

#include <thread>
#include <vector>

#include "cuda_ops.h"

using namespace cmgbench;

namespace {

void BM_cuMemAlloc_cuMemFree(benchmark::State &st) {
  Driver &d = ready();
  for (auto _ : st) alloc_free(d, 2 * kMiB);
}
BENCHMARK(BM_cuMemAlloc_cuMemFree);

void BM_cudaMalloc_cudaFree(benchmark::State &st) {
  (void)ready();
  for (auto _ : st) runtime_alloc_free(2 * kMiB);
}
BENCHMARK(BM_cudaMalloc_cudaFree);

void BM_vmm_cycle(benchmark::State &st) {
  Driver &d = ready();
  for (auto _ : st) vmm_cycle(d, 2 * kMiB);
}
BENCHMARK(BM_vmm_cycle);

// Expandable segments: a page mapped and unmapped at the end of a reservation holding 4096 mapped
// pages (8 GiB of 2 MiB pages); the model's look-ups must not grow with the pages mapped.
void BM_vmm_page_in_4096(benchmark::State &st) {
  Driver &d = ready();
  static BigReservation b = big_reservation(d, 4096);
  for (auto _ : st) grow_shrink(d, b);
}
BENCHMARK(BM_vmm_page_in_4096);

void BM_cuGetProcAddress_wrapped(benchmark::State &st) {
  Driver &d = ready();
  for (auto _ : st) benchmark::DoNotOptimize(lookup(d, "cuMemAlloc"));
}
BENCHMARK(BM_cuGetProcAddress_wrapped);

void BM_cuGetProcAddress_passthrough(benchmark::State &st) {
  Driver &d = ready();
  for (auto _ : st) benchmark::DoNotOptimize(lookup(d, "cuCtxSynchronize"));
}
BENCHMARK(BM_cuGetProcAddress_passthrough);

// A call the shim does not intercept, through the pointer cuGetProcAddress gave: the driver's own.
void BM_not_intercepted_cuCtxSynchronize(benchmark::State &st) {
  Driver &d = ready();
  auto sync = reinterpret_cast<PFN_cuCtxSynchronize_v2000>(lookup(d, "cuCtxSynchronize"));
  void *exported = dlsym(d.lib, "cuCtxSynchronize");
  st.counters["driver_pointer"] = sync == exported ? 1 : 0;
  for (auto _ : st) CMGB_CHECK(sync());
}
BENCHMARK(BM_not_intercepted_cuCtxSynchronize);

void BM_failing_cuMemUnmap(benchmark::State &st) {
  Driver &d = ready();
  for (auto _ : st) failing_unmap(d);
}
BENCHMARK(BM_failing_cuMemUnmap);

// Many threads allocating at once: per-thread time per pair (UseRealTime: wall clock).
void BM_threads_cuMemAlloc_cuMemFree(benchmark::State &st) {
  Driver &d = ready();
  for (auto _ : st) alloc_free(d, 2 * kMiB);
}
BENCHMARK(BM_threads_cuMemAlloc_cuMemFree)->ThreadRange(1, 8)->UseRealTime();

// The same pair with 10^6 other allocations live (the model's look-ups at that size).
void BM_live1M_cuMemAlloc_cuMemFree(benchmark::State &st) {
  Driver &d = ready();
  static std::vector<CUdeviceptr> *held = [&] {
    auto *v = new std::vector<CUdeviceptr>(1000000);
    for (auto &p : *v) CMGB_CHECK(d.memAlloc(&p, 64 << 10));
    return v;  // kept until exit: later benchmarks do not run with them
  }();
  for (auto _ : st) alloc_free(d, 2 * kMiB);
  st.counters["live"] = static_cast<double>(held->size());
}
BENCHMARK(BM_live1M_cuMemAlloc_cuMemFree);

}  // namespace

BENCHMARK_MAIN();
