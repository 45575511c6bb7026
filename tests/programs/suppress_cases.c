// SPDX-License-Identifier: Apache-2.0
// Findings to suppress: a double free whose second free is inside libcmgvendor.so
// (vendor_release), and one made by the program itself (program_double_free).
//   suppress_cases vendor    only the vendor's double free
//   suppress_cases both      the vendor's, then the program's own
//   suppress_cases shared    two double frees in one function (release), one from path_a, one from
//                            path_b: a rule naming release matches both stacks
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

int vendor_release(void *p);

__attribute__((noinline)) static int program_double_free(void) {
  void *p = NULL;
  cudaMalloc(&p, 4096);
  cudaFree(p);
  int r = (int)cudaFree(p);
  __asm__ volatile("" ::: "memory");
  return r;
}

__attribute__((noinline)) static int release(void *p) {
  int r = (int)cudaFree(p);
  __asm__ volatile("" ::: "memory");  // no tail call: the caller stays on the stack
  return r;
}

__attribute__((noinline)) static int path_a(void) {
  void *p = NULL;
  cudaMalloc(&p, 4096);
  release(p);
  int r = release(p);
  __asm__ volatile("" ::: "memory");
  return r;
}

__attribute__((noinline)) static int path_b(void) {
  void *p = NULL;
  cudaMalloc(&p, 8192);
  release(p);
  int r = release(p);
  __asm__ volatile("" ::: "memory");
  return r;
}

int main(int argc, char **argv) {
  if (argc != 2) return 64;
  if (strcmp(argv[1], "shared") == 0) {
    printf("path_a %d\n", path_a());
    printf("path_b %d\n", path_b());
    return 0;
  }
  void *p = NULL;
  printf("malloc %d\n", (int)cudaMalloc(&p, 1 << 20));
  printf("own_free %d\n", (int)cudaFree(p));
  printf("vendor_free %d\n", vendor_release(p));
  if (strcmp(argv[1], "both") == 0) printf("program_free %d\n", program_double_free());
  return 0;
}
