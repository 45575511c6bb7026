// SPDX-License-Identifier: Apache-2.0
// A small caching allocator shaped like PyTorch's (c10/cuda/CUDACachingAllocator.cpp,
// nccl-and-cleanup.md 4.2-4.4), for the flush tests: freed blocks stay cached; the flush
// (NativeCachingAllocator::emptyCache) gives them back with cudaFree; an allocation that fails
// with out-of-memory releases the cache from inside DeviceCachingAllocator::malloc and retries
// once (the OOM path); CudaMallocAsyncAllocator::emptyCache trims the default pool. Like in the
// torch wheel these functions are local symbols: hidden, so they are in .symtab and not in
// .dynsym, and dladdr() cannot name them. Only the extern "C" entry points are exported.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <vector>

#define CMG_LOCAL __attribute__((visibility("hidden"), noinline))

namespace c10::cuda::CUDACachingAllocator {

namespace Native {

struct Block {
  void *ptr;
  size_t size;
};

class DeviceCachingAllocator {
 public:
  CMG_LOCAL cudaError_t malloc(void **out, size_t size, int *released);
  CMG_LOCAL void free(void *p, size_t size);
  CMG_LOCAL int release_cached_blocks();
  CMG_LOCAL bool release_block(const Block &b);
  CMG_LOCAL size_t cached_bytes();
  int release_errors = 0;

 private:
  std::mutex mu_;
  std::vector<Block> cached_;
};

class NativeCachingAllocator {
 public:
  CMG_LOCAL int emptyCache();
  DeviceCachingAllocator device;
};

// release_block: the cudaFree of one cached segment (4.2 step 2).
bool DeviceCachingAllocator::release_block(const Block &b) {
  const cudaError_t r = cudaFree(b.ptr);
  if (r != cudaSuccess) ++release_errors;
  return r == cudaSuccess;
}

// Shared by the flush and the OOM path, as in PyTorch: it decides nothing about which one it is.
int DeviceCachingAllocator::release_cached_blocks() {
  std::vector<Block> go;
  {
    std::lock_guard<std::mutex> lk(mu_);
    go.swap(cached_);
  }
  int n = 0;
  for (const Block &b : go) n += release_block(b) ? 1 : 0;
  return n;
}

// Reuses a cached block of the same size; otherwise cudaMalloc, and on out-of-memory releases
// the cache and retries once (4.3: alloc_block -> release_cached_blocks -> alloc_block).
cudaError_t DeviceCachingAllocator::malloc(void **out, size_t size, int *released) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = cached_.begin(); it != cached_.end(); ++it)
      if (it->size == size) {
        *out = it->ptr;
        cached_.erase(it);
        return cudaSuccess;
      }
  }
  cudaError_t r = cudaMalloc(out, size);
  if (r == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    const int n = release_cached_blocks();
    if (released) *released = n;
    r = cudaMalloc(out, size);
  }
  return r;
}

void DeviceCachingAllocator::free(void *p, size_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  cached_.push_back(Block{p, size});
}

size_t DeviceCachingAllocator::cached_bytes() {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const Block &b : cached_) n += b.size;
  return n;
}

// Built with -fno-optimize-sibling-calls (tests/integration/meson.build): a tail call would drop
// this frame from the stack, which the real allocator's flush keeps.
int NativeCachingAllocator::emptyCache() {
  return device.release_cached_blocks();
}

NativeCachingAllocator g_allocator;

}  // namespace Native

namespace CudaMallocAsync {

class CudaMallocAsyncAllocator {
 public:
  CMG_LOCAL cudaError_t emptyCache();
};

// 4.4: the default pool of the device, trimmed to nothing (PyTorch synchronizes the device
// first; that wait is PyTorch's own and not seen here).
cudaError_t CudaMallocAsyncAllocator::emptyCache() {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaMemPool_t pool = nullptr;
  cudaError_t r = cudaDeviceGetDefaultMemPool(&pool, dev);
  if (r != cudaSuccess) return r;
  r = cudaMemPoolTrimTo(pool, 0);
  return r;
}

CudaMallocAsyncAllocator g_async;

}  // namespace CudaMallocAsync
}  // namespace c10::cuda::CUDACachingAllocator

namespace cca = c10::cuda::CUDACachingAllocator;

extern "C" {

// Like torch.cuda.empty_cache() (THCPModule_emptyCache): returns the blocks released.
__attribute__((visibility("default"))) int fakecache_empty_cache(void) {
  return cca::Native::g_allocator.emptyCache();
}

// Like caching_allocator.malloc: *released = blocks the OOM path gave back (0 when none).
__attribute__((visibility("default"))) cudaError_t fakecache_malloc(void **p, size_t size,
                                                                    int *released) {
  if (released) *released = 0;
  return cca::Native::g_allocator.device.malloc(p, size, released);
}

// Like a tensor going out of scope: the block goes back to the cache.
__attribute__((visibility("default"))) void fakecache_free(void *p, size_t size) {
  cca::Native::g_allocator.device.free(p, size);
}

__attribute__((visibility("default"))) size_t fakecache_cached_bytes(void) {
  return cca::Native::g_allocator.device.cached_bytes();
}

__attribute__((visibility("default"))) int fakecache_release_errors(void) {
  return cca::Native::g_allocator.device.release_errors;
}

// Like torch.cuda.empty_cache() with backend:cudaMallocAsync.
__attribute__((visibility("default"))) cudaError_t fakecache_async_empty_cache(void) {
  return cca::CudaMallocAsync::g_async.emptyCache();
}
}
