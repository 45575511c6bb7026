// SPDX-License-Identifier: Apache-2.0
// Sleep-mode allocators racing with owners of the handle values the driver re-issues to them
// (real-driver.md D18: values come back, on the fake deterministically the last released first).
//
//   vmm_race ITERATIONS [SLEEPERS OWNERS]
//
// Each sleeper thread maps an allocation, puts it to sleep (unmap + release, as vLLM's
// CuMemAllocator does) and then frees it while asleep (unmap again, release again): the second
// unmap is a no-op and the second release names a value that may already belong to another
// thread's new allocation. Each owner thread runs an ordinary lifecycle with NCCL's
// retain-and-release (create, map, set access, retain from the address, release the retained
// handle, unmap, release). Under the shim every owner call must succeed, every redundant call must
// be answered with SUCCESS, and — on the fake driver, which can tell — no redundant release may
// reach the driver and nothing may be left live. Without the shim the same run fails (the control
// run of run_vmm_race.py checks that it does). Prints one line of counts; exit 1 on any failure.
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../programs/cuda_check.h"
#include "fakecuda.h"

namespace {

constexpr std::size_t kG = 2u << 20;  // VMM granularity of the fake and of the H200 (D19)

std::atomic<unsigned long long> g_legit{0}, g_legit_failed{0}, g_redundant{0},
    g_redundant_failed{0}, g_redundant_forwarded{0};
CUcontext g_ctx;
fakecuda_thread_calls_fn g_thread_calls;
fakecuda_thread_last_call_fn g_last_call;

void legit(CUresult r) {
  g_legit.fetch_add(1, std::memory_order_relaxed);
  if (r != CUDA_SUCCESS) g_legit_failed.fetch_add(1, std::memory_order_relaxed);
}

// A call the program should not have made (the free while asleep): under the shim it is answered
// with SUCCESS and, when the fake driver can tell, never reaches the driver.
template <class F>
void redundant(const char *exact, F &&f) {
  const unsigned long long before = g_thread_calls ? g_thread_calls() : 0;
  const CUresult r = f();
  g_redundant.fetch_add(1, std::memory_order_relaxed);
  if (r != CUDA_SUCCESS) g_redundant_failed.fetch_add(1, std::memory_order_relaxed);
  fakecuda_call last{};
  if (g_last_call && g_last_call(exact, &last) == 0 && last.serial > before)
    g_redundant_forwarded.fetch_add(1, std::memory_order_relaxed);
}

CUmemAccessDesc access() {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

void sleeper(int iterations) {
  CHECK_CU(cuCtxSetCurrent(g_ctx));
  const CUmemAllocationProp prop = device_prop();
  const CUmemAccessDesc acc = access();
  CUdeviceptr r = 0;
  CHECK_CU(cuMemAddressReserve(&r, kG, 0, 0, 0));
  for (int i = 0; i < iterations; ++i) {
    CUmemGenericAllocationHandle h = 0;
    legit(cuMemCreate(&h, kG, &prop, 0));
    legit(cuMemMap(r, kG, 0, h, 0));
    legit(cuMemSetAccess(r, kG, &acc, 1));
    legit(cuMemUnmap(r, kG));  // sleep
    legit(cuMemRelease(h));
    redundant("cuMemUnmap", [&] { return cuMemUnmap(r, kG); });  // free while asleep
    redundant("cuMemRelease", [&] { return cuMemRelease(h); });
  }
  legit(cuMemAddressFree(r, kG));
}

void owner(int iterations) {
  CHECK_CU(cuCtxSetCurrent(g_ctx));
  const CUmemAllocationProp prop = device_prop();
  const CUmemAccessDesc acc = access();
  CUdeviceptr r = 0;
  CHECK_CU(cuMemAddressReserve(&r, kG, 0, 0, 0));
  for (int i = 0; i < iterations; ++i) {
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    legit(cuMemCreate(&h, kG, &prop, 0));
    legit(cuMemMap(r, kG, 0, h, 0));
    legit(cuMemSetAccess(r, kG, &acc, 1));
    legit(cuMemRetainAllocationHandle(&h2, reinterpret_cast<void *>(r)));
    legit(cuMemRelease(h2));
    legit(cuMemUnmap(r, kG));
    legit(cuMemRelease(h));
  }
  legit(cuMemAddressFree(r, kG));
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vmm_race ITERATIONS [SLEEPERS OWNERS]\n");
    return 64;
  }
  const int iterations = std::atoi(argv[1]);
  const int sleepers = argc > 2 ? std::atoi(argv[2]) : 3;
  const int owners = argc > 3 ? std::atoi(argv[3]) : 3;
  g_ctx = init_primary();
  g_thread_calls =
      reinterpret_cast<fakecuda_thread_calls_fn>(dlsym(RTLD_DEFAULT, "fakecuda_thread_calls"));
  g_last_call = reinterpret_cast<fakecuda_thread_last_call_fn>(
      dlsym(RTLD_DEFAULT, "fakecuda_thread_last_call"));
  std::vector<std::thread> ts;
  for (int i = 0; i < sleepers; ++i) ts.emplace_back(sleeper, iterations);
  for (int i = 0; i < owners; ++i) ts.emplace_back(owner, iterations);
  for (auto &t : ts) t.join();
  long long live = -1;  // what the driver still holds (the fake can tell; -1 on the real driver)
  if (auto get = reinterpret_cast<fakecuda_get_state_fn>(dlsym(RTLD_DEFAULT, "fakecuda_get_state"))) {
    fakecuda_state st{};
    get(&st);
    live = static_cast<long long>(st.handle_refs + st.phys_allocs + st.mappings + st.reservations);
  }
  std::printf("legit_calls=%llu legit_failed=%llu redundant_calls=%llu redundant_failed=%llu "
              "redundant_forwarded=%llu live_at_end=%lld\n",
              g_legit.load(), g_legit_failed.load(), g_redundant.load(), g_redundant_failed.load(),
              g_redundant_forwarded.load(), live);
  const bool bad = g_legit_failed || g_redundant_failed || g_redundant_forwarded || live > 0;
  return bad ? 1 : 0;
}
