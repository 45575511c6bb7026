// SPDX-License-Identifier: Apache-2.0
// A host whose memory is exhausted (RLIMIT_AS used up) and that handles malloc returning NULL and
// goes on: it calls CUDA while every allocation made from inside the shim fails. Deterministic:
// this program's malloc, calloc and realloc (they interpose for the whole process) refuse, while
// armed, the requests whose caller lies in libcumemguard.so — the shim's own operator new and
// containers — and serve every other one (the fake driver's included) from glibc. Each call must
// return what it returns without the shim, and the process must exit 0 (it was aborted with
// SIGABRT from cudaMalloc: std::bad_alloc left the hook). Prints "step STATUS" lines and, last,
// how many of the shim's requests were refused.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

extern "C" void *__libc_malloc(std::size_t);
extern "C" void *__libc_calloc(std::size_t, std::size_t);
extern "C" void *__libc_realloc(void *, std::size_t);

namespace {

std::atomic<bool> g_armed{false};
std::atomic<unsigned long> g_refused{0};
std::uintptr_t g_lo = 0, g_hi = 0;  // the shim's text, once found

bool refuse(void *caller) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(caller);
  if (a < g_lo || a >= g_hi) return false;
  g_refused.fetch_add(1, std::memory_order_relaxed);
  errno = ENOMEM;
  return true;
}

void find_shim() {
  dl_iterate_phdr(
      [](dl_phdr_info *i, std::size_t, void *) {
        if (!i->dlpi_name || !std::strstr(i->dlpi_name, "libcumemguard")) return 0;
        for (int k = 0; k < i->dlpi_phnum; ++k)
          if (i->dlpi_phdr[k].p_type == PT_LOAD && (i->dlpi_phdr[k].p_flags & PF_X)) {
            g_lo = i->dlpi_addr + i->dlpi_phdr[k].p_vaddr;
            g_hi = g_lo + i->dlpi_phdr[k].p_memsz;
          }
        return 1;
      },
      nullptr);
}

void out(const char *step, int r) { std::printf("%s %d\n", step, r); }

}  // namespace

extern "C" void *malloc(std::size_t n) {
  return refuse(__builtin_return_address(0)) ? nullptr : __libc_malloc(n);
}
extern "C" void *calloc(std::size_t n, std::size_t m) {
  return refuse(__builtin_return_address(0)) ? nullptr : __libc_calloc(n, m);
}
extern "C" void *realloc(void *p, std::size_t n) {
  return refuse(__builtin_return_address(0)) ? nullptr : __libc_realloc(p, n);
}

int main() {
  // Before the memory runs out: the runtime and the shim are set up, the log is open.
  void *warm = nullptr;
  if (cudaMalloc(&warm, 1 << 20) != cudaSuccess || cudaFree(warm) != cudaSuccess) return 2;
  find_shim();
  g_armed.store(true);
  constexpr int kN = 64;  // more than the shim keeps spare records for
  void *p[kN] = {};
  int malloc_failures = 0, free_failures = 0;
  for (void *&q : p) malloc_failures += cudaMalloc(&q, 1 << 20) != cudaSuccess;
  for (void *q : p) free_failures += cudaFree(q) != cudaSuccess;
  out("malloc_failures", malloc_failures);
  out("free_failures", free_failures);
  out("double_free", cudaFree(p[0]));  // the program's bug: what the driver answers
  cudaGetLastError();
  CUdeviceptr d = 0;
  out("cuMemAlloc", cuMemAlloc(&d, 1 << 20));
  out("cuMemFree", cuMemFree(d));
  CUmemAllocationProp pr{};
  pr.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pr.location.id = 0;
  const std::size_t g = 2u << 20;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  CUmemAccessDesc acc{};
  acc.location = pr.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  out("create", cuMemCreate(&h, g, &pr, 0));
  out("reserve", cuMemAddressReserve(&v, g, 0, 0, 0));
  out("map", cuMemMap(v, g, 0, h, 0));
  out("access", cuMemSetAccess(v, g, &acc, 1));
  out("unmap", cuMemUnmap(v, g));
  out("release", cuMemRelease(h));
  out("release_again", cuMemRelease(h));
  out("addrfree", cuMemAddressFree(v, g));
  g_armed.store(false);
  std::printf("shim_allocations_refused %lu\n", g_refused.load());
  return 0;
}
