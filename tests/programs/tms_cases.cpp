// SPDX-License-Identifier: Apache-2.0
// Runs under another preloaded allocator (libtmslike.so, torch_memory_saver-style) together with
// the shim, in either order: plain chaining of cudaMalloc/cudaFree, and VMM-backed allocations
// paused and resumed many times (the handles are made inside the allocator's cudaMalloc).
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "forward";
  std::vector<void *> ps(6, nullptr);
  int bad = 0;
  for (auto &p : ps) bad += cudaMalloc(&p, 3 << 20) != cudaSuccess;
  std::printf("malloc_failures %d\n", bad);
  if (mode == "vmm") {
    auto pause = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "tmslike_pause"));
    auto resume = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "tmslike_resume"));
    if (!pause || !resume) {
      std::printf("allocator missing\n");
      return 2;
    }
    int resume_bad = 0;
    for (int i = 0; i < 20; ++i) {
      pause();
      resume_bad += resume();
    }
    pause();  // free while paused: the fixed allocator releases nothing twice
    std::printf("resume_failures %d\n", resume_bad);
  }
  int free_bad = 0;
  for (auto p : ps) free_bad += cudaFree(p) != cudaSuccess;
  std::printf("free_failures %d\n", free_bad);
  return 0;
}
