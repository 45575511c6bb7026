/* SPDX-License-Identifier: Apache-2.0 */
/* A plugin that module_fifo dlopens and then replaces by a FIFO at the same path: it frees one
 * allocation twice, so the finding's stack has a frame in an object whose file is now a FIFO. */
#include <cuda_runtime_api.h>

__attribute__((visibility("default"), noinline)) int plugin_double_free(int *first, int *second) {
  void *p = 0;
  if (cudaMalloc(&p, 4096) != cudaSuccess) return -1;
  *first = (int)cudaFree(p);
  *second = (int)cudaFree(p);
  return 0;
}
