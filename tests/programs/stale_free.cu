// SPDX-License-Identifier: Apache-2.0
// The stale free of an address the driver re-issued, then a kernel on the memory that now owns it
// (bug-patterns.md P30): cudaMalloc p; cudaFree p; cudaMalloc q (the driver hands back p's
// address); cudaFree p — which frees q — and a kernel writing q fails with an illegal address
// (error 700) once q's memory is gone. Under `cumemguard run` the quarantine keeps p's address
// held, the stale free is recognised as the double free it is, and the kernel succeeds.
//   stale_free            prints reused / stale_free / kernel / bytes_ok lines; exit 0
//   stale_free crash      then dereferences a null host pointer (SIGSEGV), for crash reports
// nvcc's default static cudart, as users build.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

__global__ void fill(unsigned char *p, int n, unsigned char v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

__attribute__((noinline)) static cudaError_t stale_free(void *p) { return cudaFree(p); }

int main(int argc, char **argv) {
  const int n = 1 << 20;
  void *p = nullptr, *q = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) return 2;
  if (cudaFree(p) != cudaSuccess) return 2;
  if (cudaMalloc(&q, n) != cudaSuccess) return 2;
  std::printf("reused %d\n", p == q ? 1 : 0);
  std::printf("stale_free %s\n", cudaGetErrorName(stale_free(p)));  // the bug: frees q if reused
  fill<<<(n + 255) / 256, 256>>>(static_cast<unsigned char *>(q), n, 0x5a);
  const cudaError_t k = cudaDeviceSynchronize();
  std::printf("kernel %s\n", cudaGetErrorName(k));
  std::vector<unsigned char> host(n, 0);
  const cudaError_t c = cudaMemcpy(host.data(), q, n, cudaMemcpyDeviceToHost);
  bool ok = c == cudaSuccess;
  for (int i = 0; ok && i < n; ++i) ok = host[i] == 0x5a;
  std::printf("bytes_ok %d\n", ok ? 1 : 0);
  std::fflush(stdout);
  if (argc > 1 && std::strcmp(argv[1], "crash") == 0) {
    volatile int *null = nullptr;
    *null = 1;  // the crash: a fatal signal the program leaves to its default action
  }
  return 0;
}
