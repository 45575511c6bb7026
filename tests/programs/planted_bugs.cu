// SPDX-License-Identifier: Apache-2.0
// A CUDA program with planted memory bugs, for comparing what cumemguard and compute-sanitizer
// report and what each costs: a double cudaFree, a stale free of an address the driver re-issued
// (bug-patterns.md P30), a VMM double release, and a leak, between rounds of ordinary kernel work.
//   planted_bugs [rounds]     (kernel rounds before each bug; default 200)
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

__global__ void saxpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

static void work(float *x, float *y, int n, int rounds) {
  for (int r = 0; r < rounds; ++r) saxpy<<<(n + 255) / 256, 256>>>(n, 1.0001f, x, y);
  CHECK_CUDA(cudaDeviceSynchronize());
}

__attribute__((noinline)) static void release_twice(CUmemGenericAllocationHandle h) {
  std::printf("vmm_release_1 %d\n", cuMemRelease(h));
  std::printf("vmm_release_2 %d\n", cuMemRelease(h));  // planted: double release
}

__attribute__((noinline)) static void free_twice(void *p) {
  std::printf("free_1 %s\n", cudaGetErrorName(cudaFree(p)));
  std::printf("free_2 %s\n", cudaGetErrorName(cudaFree(p)));  // planted: double free
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  const int n = 1 << 22;
  auto t0 = std::chrono::steady_clock::now();
  float *x = nullptr, *y = nullptr;
  CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&y, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(x, 0, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(y, 0, n * sizeof(float)));
  work(x, y, n, rounds);

  // 1. Double cudaFree.
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  free_twice(p);
  cudaGetLastError();
  work(x, y, n, rounds);

  // 2. Stale free after the driver re-issued the address (P30).
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 1 << 20));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaMalloc(&b, 1 << 20));
  std::printf("reused %d\n", a == b ? 1 : 0);
  std::printf("stale_free %s\n", cudaGetErrorName(cudaFree(a)));  // planted: frees b if reused
  std::printf("owner_free %s\n", cudaGetErrorName(cudaFree(b)));
  cudaGetLastError();
  work(x, y, n, rounds);

  // 3. VMM double release.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle h;
  if (cuMemCreate(&h, g, &prop, 0) == CUDA_SUCCESS) release_twice(h);
  work(x, y, n, rounds);

  // 4. A leak: never freed.
  void *leak = nullptr;
  CHECK_CUDA(cudaMalloc(&leak, 3 << 20));

  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(y));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("elapsed_s %.3f\n", s);
  return 0;
}
