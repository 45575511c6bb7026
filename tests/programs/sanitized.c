// SPDX-License-Identifier: Apache-2.0
// A CUDA program built with -fsanitize=address, as users build theirs: gcc links libasan.so
// dynamically and lists it first, and the runtime aborts when anything is loaded before it
// ("ASan runtime does not come first"). `cumemguard run` must put it in front of the shim.
//   sanitized double-free   a CUDA double free (the shim's finding) under a live ASan runtime
//   sanitized overflow      a host heap overflow: ASan's own report must still come
//   sanitized leak          a CUDA double free and a 10-byte host leak: LeakSanitizer ends the
//                           process at exit (exit_group); the shim's summary and `end` still come
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 2) return 64;
  printf("asan_active %d\n", dlsym(RTLD_DEFAULT, "__asan_init") != NULL);
  if (strcmp(argv[1], "double-free") == 0) {
    void *p = NULL;
    printf("malloc %d\n", (int)cudaMalloc(&p, 1 << 20));
    printf("first_free %d\n", (int)cudaFree(p));
    printf("second_free %d\n", (int)cudaFree(p));
    return 0;
  }
  if (strcmp(argv[1], "leak") == 0) {
    void *p = NULL;
    printf("malloc %d\n", (int)cudaMalloc(&p, 1 << 20));
    printf("first_free %d\n", (int)cudaFree(p));
    printf("second_free %d\n", (int)cudaFree(p));
    static volatile char *leaked;
    leaked = malloc(10);
    leaked[0] = 1;
    leaked = NULL;  // the only pointer to it gone: a direct leak
    return 0;
  }
  if (strcmp(argv[1], "overflow") == 0) {
    fflush(stdout);
    static volatile int past_end = 16;  // volatile: the compiler cannot see the overflow
    volatile char *b = malloc(16);
    b[past_end] = 1;
    free((void *)b);
    return 0;
  }
  return 64;
}
