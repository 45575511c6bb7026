// SPDX-License-Identifier: Apache-2.0
// A stand-in for a vendor library with a known defect: it frees a device buffer it was handed,
// and the caller frees it again. The suppressions tests silence its finding by function name or
// by module, and keep the program's own defect reported.
#include <cuda_runtime_api.h>

__attribute__((noinline, visibility("default"))) int vendor_release(void *p) {
  int r = (int)cudaFree(p);
  __asm__ volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
  return r;
}
