// SPDX-License-Identifier: Apache-2.0
// The VMM lifecycle cases of bug-patterns.md (P01-P10, P31) as exact driver call sequences. Each
// case prints one "step STATUS" line per call whose result matters; the test harness compares them
// (and the shim's findings) with what the case table expects, on the fake stack and on the H200.
// Cases that need an injected fault exit 77 on the real driver.
#include <pthread.h>

#include <cstring>
#include <string>

#include "cuda_check.h"

namespace {

size_t G = 0;  // granularity, read from the driver
CUcontext g_ctx = nullptr;

void out(const char *step, CUresult r) { std::printf("%s %s\n", step, cu_name(r)); }

CUresult create(CUmemGenericAllocationHandle *h, size_t size,
                CUmemLocationType loc = CU_MEM_LOCATION_TYPE_DEVICE) {
  CUmemAllocationProp p = device_prop(loc);
  return cuMemCreate(h, size, &p, 0);
}

CUdeviceptr reserve(size_t size) {
  CUdeviceptr v = 0;
  CHECK_CU(cuMemAddressReserve(&v, size, 0, 0, 0));
  return v;
}

CUresult access(CUdeviceptr v, size_t size) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(v, size, &a, 1);
}

// One allocation the way vLLM's CuMemAllocator makes it: reserve, create, map, set access.
struct Alloc {
  CUdeviceptr v;
  CUmemGenericAllocationHandle h;
  size_t size;
};
Alloc make(size_t size) {
  Alloc a{reserve(size), 0, size};
  CHECK_CU(create(&a.h, size));
  CHECK_CU(cuMemMap(a.v, size, 0, a.h, 0));
  CHECK_CU(access(a.v, size));
  return a;
}

int p01() {
  Alloc a = make(G);
  out("sleep.unmap", cuMemUnmap(a.v, G));
  out("sleep.release", cuMemRelease(a.h));
  out("free.unmap", cuMemUnmap(a.v, G));
  out("free.release", cuMemRelease(a.h));
  out("free.addrfree", cuMemAddressFree(a.v, G));
  CUmemGenericAllocationHandle h;
  CUresult r = create(&h, G);
  out("next.create", r);  // errors are never sticky (real-driver.md D17)
  if (r == CUDA_SUCCESS) CHECK_CU(cuMemRelease(h));
  return 0;
}

int p02() {
  Alloc a = make(G);
  out("sleep.unmap", cuMemUnmap(a.v, G));
  out("sleep.release", cuMemRelease(a.h));
  Alloc b = make(G);  // another allocation while A sleeps
  std::printf("b.reused_value %d\n", b.h == a.h ? 1 : 0);
  CHECK_CU(cuMemsetD8(b.v, 0x5a, G));
  CHECK_CU(cuCtxSynchronize());
  out("free.unmap", cuMemUnmap(a.v, G));
  out("free.release", cuMemRelease(a.h));  // stale: the value may now be B's
  out("free.addrfree", cuMemAddressFree(a.v, G));
  unsigned char v = 0;
  out("b.read", cuMemcpyDtoH(&v, b.v + 100, 1));
  std::printf("b.value 0x%02x\n", v);
  out("b.unmap", cuMemUnmap(b.v, G));
  out("b.release", cuMemRelease(b.h));  // B's owner releases its own handle
  out("b.addrfree", cuMemAddressFree(b.v, G));
  return 0;
}

int p03() {
  Alloc a = make(2 * G);
  for (int pass = 1; pass <= 2; ++pass) {
    std::string u = "pass" + std::to_string(pass) + ".unmap";
    std::string r = "pass" + std::to_string(pass) + ".release";
    out(u.c_str(), cuMemUnmap(a.v, 2 * G));
    out(r.c_str(), cuMemRelease(a.h));
  }
  out("addrfree", cuMemAddressFree(a.v, 2 * G));
  return 0;
}

int p04() {
  Alloc a = make(G);
  CUmemGenericAllocationHandle h2;
  CHECK_CU(create(&h2, G));
  out("wake.map", cuMemMap(a.v, G, 0, h2, 0));  // still mapped: D12
  out("cleanup.release_new", cuMemRelease(h2));
  out("cleanup.unmap", cuMemUnmap(a.v, G));
  out("cleanup.release", cuMemRelease(a.h));
  out("cleanup.addrfree", cuMemAddressFree(a.v, G));
  return 0;
}

int p05() {
  CUdeviceptr v = reserve(2 * G);
  CUmemGenericAllocationHandle h1, h2;
  CHECK_CU(create(&h1, G));
  if (!fake_inject("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY)) return 77;
  out("wake.create2", create(&h2, G));
  out("cleanup.release1", cuMemRelease(h1));  // keeps the value
  out("teardown.unmap", cuMemUnmap(v, 2 * G));
  out("teardown.release1", cuMemRelease(h1));
  out("teardown.addrfree", cuMemAddressFree(v, 2 * G));
  return 0;
}

int p06() {
  CUdeviceptr v = reserve(3 * G);
  CUmemGenericAllocationHandle h[3];
  for (auto &x : h) CHECK_CU(create(&x, G));
  out("map0", cuMemMap(v, G, 0, h[0], 0));
  if (!fake_inject("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE)) return 77;
  out("map1", cuMemMap(v + G, G, 0, h[1], 0));
  out("teardown.unmap_all", cuMemUnmap(v, 3 * G));
  out("cleanup.unmap0", cuMemUnmap(v, G));
  for (auto &x : h) CHECK_CU(cuMemRelease(x));
  out("cleanup.addrfree", cuMemAddressFree(v, 3 * G));
  return 0;
}

int p07() {
  Alloc a = make(G);
  if (!fake_inject("cuMemUnmap", 1, CUDA_ERROR_INVALID_VALUE)) return 77;
  out("sleep.unmap", cuMemUnmap(a.v, G));  // fails; the caller ignores it
  out("sleep.release", cuMemRelease(a.h));
  CUmemGenericAllocationHandle h2;
  CHECK_CU(create(&h2, G));
  out("wake.map", cuMemMap(a.v, G, 0, h2, 0));
  out("cleanup.release_new", cuMemRelease(h2));
  out("cleanup.unmap", cuMemUnmap(a.v, G));
  out("cleanup.addrfree", cuMemAddressFree(a.v, G));
  return 0;
}

int p08() {
  Alloc a = make(G);
  // A pause/resume layer swaps the physical memory behind the owner's back.
  out("pause.unmap", cuMemUnmap(a.v, G));
  out("pause.release", cuMemRelease(a.h));
  CUmemGenericAllocationHandle h2;
  CHECK_CU(create(&h2, G));
  std::printf("resume.same_value %d\n", h2 == a.h ? 1 : 0);
  out("resume.map", cuMemMap(a.v, G, 0, h2, 0));
  CHECK_CU(access(a.v, G));
  // The owner tears down with its old handle.
  out("owner.unmap", cuMemUnmap(a.v, G));
  out("owner.release", cuMemRelease(a.h));
  out("layer.release", cuMemRelease(h2));
  out("owner.addrfree", cuMemAddressFree(a.v, G));
  return 0;
}

int p09() {
  CUdeviceptr v = reserve(2 * G);
  CUmemGenericAllocationHandle h0, h1;
  CHECK_CU(create(&h0, G));
  out("map0", cuMemMap(v, G, 0, h0, 0));
  if (!fake_inject("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY)) return 77;
  out("create1", create(&h1, G));
  out("addrfree_mapped", cuMemAddressFree(v, 2 * G));
  out("cleanup.unmap0", cuMemUnmap(v, G));
  out("cleanup.release0", cuMemRelease(h0));
  out("cleanup.addrfree", cuMemAddressFree(v, 2 * G));
  return 0;
}

// NCCL's pattern (real-driver.md section 6): release at once, later retain from the address.
void nccl_pattern(CUmemLocationType loc, const char *tag) {
  CUmemGenericAllocationHandle h, h2;
  CUresult r = create(&h, G, loc);
  std::string s = std::string(tag) + ".create";
  out(s.c_str(), r);
  if (r != CUDA_SUCCESS) return;
  CUdeviceptr v = reserve(G);
  out((std::string(tag) + ".map").c_str(), cuMemMap(v, G, 0, h, 0));
  if (loc == CU_MEM_LOCATION_TYPE_DEVICE) out((std::string(tag) + ".access").c_str(), access(v, G));
  out((std::string(tag) + ".release_at_once").c_str(), cuMemRelease(h));
  out((std::string(tag) + ".retain").c_str(), cuMemRetainAllocationHandle(&h2, reinterpret_cast<void *>(v)));
  out((std::string(tag) + ".unmap").c_str(), cuMemUnmap(v, G));
  out((std::string(tag) + ".release_retained").c_str(), cuMemRelease(h2));
  out((std::string(tag) + ".addrfree").c_str(), cuMemAddressFree(v, G));
}

void *no_context_thread(void *) {
  // A thread with no current context (P27): cuCtxGetDevice fails here, VMM calls still work.
  CUdevice d = -1;
  out("thread.ctx_get_device", cuCtxGetDevice(&d));
  nccl_pattern(CU_MEM_LOCATION_TYPE_HOST_NUMA, "host");
  return nullptr;
}

int p10() {
  nccl_pattern(CU_MEM_LOCATION_TYPE_DEVICE, "device");
  pthread_t t;
  pthread_create(&t, nullptr, no_context_thread, nullptr);
  pthread_join(t, nullptr);
  return 0;
}

// A wake-up whose map fails (out of memory) after the handle value was re-issued: the allocator's
// unmap_and_release of that fresh, never-mapped handle is a legitimate release, not a stale one.
int wakefail() {
  Alloc a = make(G);
  out("sleep.unmap", cuMemUnmap(a.v, G));
  out("sleep.release", cuMemRelease(a.h));
  CUmemGenericAllocationHandle h2;
  CHECK_CU(create(&h2, G));
  std::printf("wake.same_value %d\n", h2 == a.h ? 1 : 0);
  if (!fake_inject("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY)) return 77;
  out("wake.map", cuMemMap(a.v, G, 0, h2, 0));
  out("cleanup.unmap", cuMemUnmap(a.v, G));
  out("cleanup.release", cuMemRelease(h2));
  out("cleanup.addrfree", cuMemAddressFree(a.v, G));
  return 0;
}

int p31() {
  CUdeviceptr v = reserve(G);
  CUmemGenericAllocationHandle h = 0;
  if (!fake_inject("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY)) return 77;
  out("wake.create", create(&h, G));
  out("wake.map", cuMemMap(v, G, 0, 0, 0));
  out("wake.access", access(v, G));
  out("cleanup.addrfree", cuMemAddressFree(v, G));
  return 0;
}

// vLLM's sleep while the model's kernels still run: the device has 300 ms of work queued when the
// allocation is unmapped and released (the fake's busy model; exit 77 on the real driver, where the
// gpu suite runs busy_unmap.cu with a real kernel instead).
int busy() {
  using set_busy_fn = void (*)(int, unsigned long long);
  auto set_busy = reinterpret_cast<set_busy_fn>(dlsym(RTLD_DEFAULT, "fakecuda_set_busy"));
  if (!set_busy) return 77;
  Alloc a = make(G);
  set_busy(0, 300'000'000ull);
  out("sleep.unmap", cuMemUnmap(a.v, G));
  out("sleep.release", cuMemRelease(a.h));
  out("sync", cuCtxSynchronize());
  out("free.addrfree", cuMemAddressFree(a.v, G));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: vmm_cases P01|P02|...|P10|P31\n");
    return 64;
  }
  g_ctx = init_primary();
  CUmemAllocationProp p = device_prop();
  CHECK_CU(cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::string c = argv[1];
  if (c == "P01") return p01();
  if (c == "P02") return p02();
  if (c == "P03") return p03();
  if (c == "P04") return p04();
  if (c == "P05") return p05();
  if (c == "P06") return p06();
  if (c == "P07") return p07();
  if (c == "P08") return p08();
  if (c == "P09") return p09();
  if (c == "P10") return p10();
  if (c == "P31") return p31();
  if (c == "busy") return busy();
  if (c == "wakefail") return wakefail();
  std::fprintf(stderr, "unknown case %s\n", argv[1]);
  return 64;
}
