/* SPDX-License-Identifier: Apache-2.0 */
/* A library that allocates CUDA memory when it is loaded and frees it in its destructor, as
   framework singletons do: the program's libraries are finalised after the preloaded shim's own
   destructor, so these frees arrive after it (tests/reliability life-library-dtor). */
#include <cuda_runtime_api.h>
#include <stdio.h>

static void *p;

__attribute__((constructor)) static void late_init(void) {
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess) p = 0;
}

__attribute__((destructor)) static void late_fini(void) {
  const int a = cudaFree(p);
  const int b = cudaFree(p); /* a double free, from a destructor, after the shim's own one ran */
  printf("lib.free %d\nlib.double_free %d\n", a, b);
  fflush(stdout);
}

__attribute__((visibility("default"))) int late_free_loaded(void) { return p != 0; }
