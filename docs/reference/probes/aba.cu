// SPDX-License-Identifier: Apache-2.0
// Probe: stale-handle release after handle-value reuse (vLLM free-while-asleep pattern) on the real driver.
#include <cuda.h>
#include <cstdio>
static const char *en(CUresult r) { const char *s = "?"; cuGetErrorName(r, &s); return s; }
int main() {
  cuInit(0); CUdevice d; cuDeviceGet(&d, 0); CUcontext c; cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  CUmemAllocationProp p{}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  size_t g = 2 << 20; CUmemAccessDesc a{}; a.location = p.location; a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUmemGenericAllocationHandle h1, h3; CUdeviceptr p1, p3;
  cuMemCreate(&h1, g, &p, 0); cuMemAddressReserve(&p1, g, 0, 0, 0); cuMemMap(p1, g, 0, h1, 0); cuMemSetAccess(p1, g, &a, 1);
  printf("alloc A: h1=0x%llx p1=0x%llx\n", (unsigned long long)h1, (unsigned long long)p1);
  // sleep(): unmap + release A, keep VA reserved
  CUresult r1 = cuMemUnmap(p1, g); CUresult r2 = cuMemRelease(h1); printf("sleep: unmap p1 -> %s, release h1 -> %s\n", en(r1), en(r2));
  // another allocation while asleep
  cuMemCreate(&h3, g, &p, 0); cuMemAddressReserve(&p3, g, 0, 0, 0); cuMemMap(p3, g, 0, h3, 0); cuMemSetAccess(p3, g, &a, 1);
  printf("alloc B while A asleep: h3=0x%llx (same value as h1: %d) p3=0x%llx\n", (unsigned long long)h3, h3 == h1, (unsigned long long)p3);
  cuMemsetD8(p3, 0x5a, g); cuCtxSynchronize();
  // free A while asleep, buggy allocator: unmap + release stale h1
  CUresult f1 = cuMemUnmap(p1, g); CUresult f2 = cuMemRelease(h1); CUresult f3 = cuMemAddressFree(p1, g); printf("free-while-asleep: unmap p1 -> %s, release stale h1 -> %s, address free p1 -> %s\n", en(f1), en(f2), en(f3));
  unsigned char v = 0; CUresult r = cuMemcpyDtoH(&v, p3 + 100, 1); printf("B still readable: %s val=0x%x\n", en(r), v);
  printf("B: unmap p3 -> %s\n", en(cuMemUnmap(p3, g)));
  printf("B: release h3 (its owner) -> %s\n", en(cuMemRelease(h3)));
  CUmemGenericAllocationHandle h4; printf("next cuMemCreate -> %s\n", en(cuMemCreate(&h4, g, &p, 0)));
  return 0;
}
