// SPDX-License-Identifier: Apache-2.0
// A sleep mode that unmaps while the model's kernels still run (vLLM's `/sleep` returning while
// requests are in flight): a kernel keeps writing a VMM allocation for about 300 ms on the default
// stream, and the host unmaps and releases the allocation meanwhile. Without a check the kernel
// faults on the unmapped range and the next synchronising call returns error 700; under the shim
// the unmap is reported (unmap-while-busy), and with CUMEMGUARD_BUSY_CHECK=sync the shim waits
// for the kernel before the driver unmaps, so nothing faults.
//   busy_unmap          prints unmap / release / sync lines; exit 0
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>

__global__ void keep_writing(unsigned int *p, int n, long long cycles) {
  const long long t0 = clock64();
  int i = threadIdx.x;
  while (clock64() - t0 < cycles) {
    p[i] += 1;
    i = (i + blockDim.x) % n;
  }
}

static const char *name(CUresult r) {
  const char *s = nullptr;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}

int main() {
  cudaFree(nullptr);  // the runtime's primary context, current on this thread
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle h;
  CUdeviceptr v;
  if (cuMemCreate(&h, g, &prop, 0) || cuMemAddressReserve(&v, g, 0, 0, 0) || cuMemMap(v, g, 0, h, 0))
    return 2;
  CUmemAccessDesc a{};
  a.location = prop.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cuMemSetAccess(v, g, &a, 1)) return 2;
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const long long cycles = static_cast<long long>(clock_khz) * 300;  // about 300 ms
  keep_writing<<<1, 256>>>(reinterpret_cast<unsigned int *>(v), static_cast<int>(g / 4), cycles);
  std::printf("unmap %s\n", name(cuMemUnmap(v, g)));  // the bug: the kernel still writes there
  std::printf("release %s\n", name(cuMemRelease(h)));
  std::printf("sync %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
  std::fflush(stdout);
  return 0;
}
