/* SPDX-License-Identifier: Apache-2.0 */
/* A preload allocator in the style of torch_memory_saver's preload mode: it defines cudaMalloc and
   cudaFree, finds the real ones with dlsym(RTLD_NEXT), and with TMSLIKE_VMM=1 serves allocations
   from VMM memory that tmslike_pause()/tmslike_resume() unmap+release and re-create+map (bug
   patterns P08, P12). The shim must chain with it in either preload order. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);

struct rec {
  CUdeviceptr va;
  size_t size;
  CUmemGenericAllocationHandle h;
  int asleep, used;
};
static struct rec recs[256];

static int vmm_mode(void) {
  const char *e = getenv("TMSLIKE_VMM");
  return e && e[0] == '1';
}

static CUmemAllocationProp prop(void) {
  CUmemAllocationProp p = {0};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  return p;
}

static int create_and_map(struct rec *r) {
  CUmemAllocationProp p = prop();
  if (cuMemCreate(&r->h, r->size, &p, 0) != CUDA_SUCCESS) return -1;
  if (cuMemMap(r->va, r->size, 0, r->h, 0) != CUDA_SUCCESS) return -1;
  CUmemAccessDesc a = {0};
  a.location = p.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(r->va, r->size, &a, 1) == CUDA_SUCCESS ? 0 : -1;
}

cudaError_t cudaMalloc(void **ptr, size_t n) {
  if (!vmm_mode()) {
    malloc_fn real = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    return real ? real(ptr, n) : cudaErrorInitializationError;
  }
  cudaFree(0); /* the runtime's context, as a caching allocator would have */
  size_t g = 0;
  CUmemAllocationProp p = prop();
  cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  for (int i = 0; i < 256; ++i) {
    if (recs[i].used) continue;
    struct rec *r = &recs[i];
    r->size = (n + g - 1) / g * g;
    if (cuMemAddressReserve(&r->va, r->size, 0, 0, 0) != CUDA_SUCCESS) return cudaErrorMemoryAllocation;
    if (create_and_map(r) != 0) return cudaErrorMemoryAllocation;
    r->used = 1;
    r->asleep = 0;
    *ptr = (void *)r->va;
    return cudaSuccess;
  }
  return cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *ptr) {
  for (int i = 0; ptr && vmm_mode() && i < 256; ++i) {
    struct rec *r = &recs[i];
    if (!r->used || r->va != (CUdeviceptr)ptr) continue;
    if (!r->asleep) { /* the fixed TMS: release only what is not asleep (PR #95) */
      cuMemUnmap(r->va, r->size);
      cuMemRelease(r->h);
    }
    cuMemAddressFree(r->va, r->size);
    r->used = 0;
    return cudaSuccess;
  }
  free_fn real = (free_fn)dlsym(RTLD_NEXT, "cudaFree");
  return real ? real(ptr) : cudaErrorInitializationError;
}

void tmslike_pause(void) {
  for (int i = 0; i < 256; ++i) {
    struct rec *r = &recs[i];
    if (!r->used || r->asleep) continue;
    cuMemUnmap(r->va, r->size);
    cuMemRelease(r->h);
    r->asleep = 1;
  }
}

int tmslike_resume(void) {
  int bad = 0;
  for (int i = 0; i < 256; ++i) {
    struct rec *r = &recs[i];
    if (!r->used || !r->asleep) continue;
    bad += create_and_map(r) != 0;
    r->asleep = 0;
  }
  return bad;
}
