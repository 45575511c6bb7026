// SPDX-License-Identifier: Apache-2.0
// A stand-in for PyTorch's libc10_cuda.so (built under that name) for the allocator path check:
// it makes a segment the two ways CUDACachingAllocator does — cudaMalloc, or an expandable segment
// (cuMemAddressReserve once, then cuMemCreate + cuMemMap + cuMemSetAccess per page) — so that the
// shim sees the caller it sees in PyTorch. Built without sibling calls: the cudaMalloc must return
// into this library, as PyTorch's does (its caller frame is alloc_block in libc10_cuda.so).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace {
std::vector<void *> g_linear;
CUdeviceptr g_va = 0;
std::size_t g_va_size = 0, g_va_used = 0;
std::vector<CUmemGenericAllocationHandle> g_handles;
}  // namespace

extern "C" __attribute__((visibility("default"))) int fake_torch_segment(std::size_t size,
                                                                         int expandable) {
  if (!expandable) {
    void *p = nullptr;
    const cudaError_t r = cudaMalloc(&p, size);
    if (r == cudaSuccess) g_linear.push_back(p);
    return static_cast<int>(r);
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t gran = 0;
  if (CUresult r = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    return static_cast<int>(r);
  size = (size + gran - 1) / gran * gran;
  if (!g_va) {
    g_va_size = 64 * gran;
    if (CUresult r = cuMemAddressReserve(&g_va, g_va_size, 0, 0, 0)) return static_cast<int>(r);
  }
  if (g_va_used + size > g_va_size) return static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY);
  CUmemGenericAllocationHandle h = 0;
  if (CUresult r = cuMemCreate(&h, size, &prop, 0)) return static_cast<int>(r);
  if (CUresult r = cuMemMap(g_va + g_va_used, size, 0, h, 0)) return static_cast<int>(r);
  CUmemAccessDesc a{};
  a.location = prop.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = cuMemSetAccess(g_va + g_va_used, size, &a, 1)) return static_cast<int>(r);
  g_va_used += size;
  g_handles.push_back(h);
  return 0;
}

// Frees everything, as empty_cache() at exit would.
extern "C" __attribute__((visibility("default"))) int fake_torch_release_all() {
  int bad = 0;
  for (void *p : g_linear) bad += cudaFree(p) != cudaSuccess;
  g_linear.clear();
  if (g_va) {
    if (g_va_used) bad += cuMemUnmap(g_va, g_va_used) != CUDA_SUCCESS;
    for (CUmemGenericAllocationHandle h : g_handles) bad += cuMemRelease(h) != CUDA_SUCCESS;
    bad += cuMemAddressFree(g_va, g_va_size) != CUDA_SUCCESS;
    g_handles.clear();
    g_va = 0;
    g_va_used = 0;
  }
  return bad;
}
