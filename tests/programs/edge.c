/* SPDX-License-Identifier: Apache-2.0 */
/* A library linked at program start that asks for driver functions with dlsym(RTLD_DEFAULT), in a
   process that may have no CUDA at all (the shim must answer NULL, not crash), and an extension
   that allocates through a runtime it alone links (loaded RTLD_LOCAL under an unusual name). */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>

int edge_cuda_present(void) { return dlsym(RTLD_DEFAULT, "cuMemCreate") != 0; }
int edge_gpa_present(void) { return dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2") != 0; }

#ifdef EDGE_EXTENSION
int ext_alloc_free(void) {
  void *p = 0;
  cudaError_t a = cudaMalloc(&p, 1 << 20);
  cudaError_t f = cudaFree(p);
  return (a == cudaSuccess && f == cudaSuccess) ? 0 : 1;
}
#endif
