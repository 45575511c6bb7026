// SPDX-License-Identifier: Apache-2.0
// The PyTorch allocator path check and the release check, driven like PyTorch drives CUDA: the
// stand-in libc10_cuda.so (fake_c10_cuda.cpp) is loaded first, as `import torch` loads it, then
// makes segments. Steps:
//   torch_path_cases LIB STEP...
//     seg:N:M        N segments of 1 MiB, M = cudaMalloc (linear) or vmm (expandable)
//     main-malloc    a cudaMalloc from this program (not from PyTorch's allocator)
//     applied:CONF   tell the shim CONF was passed to PyTorch's setter (C API, when present)
// Prints one "step status" line per step (tests/torch/run_torch_cases.py checks them).
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_check.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: torch_path_cases LIB STEP...\n");
    return 64;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }
  using seg_fn = int (*)(std::size_t, int);
  using rel_fn = int (*)();
  auto seg = reinterpret_cast<seg_fn>(dlsym(lib, "fake_torch_segment"));
  auto rel = reinterpret_cast<rel_fn>(dlsym(lib, "fake_torch_release_all"));
  if (!seg || !rel) return 2;
  CHECK_CU(cuInit(0));
  CHECK_CUDA(cudaSetDevice(0));
  void *mine = nullptr;
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    if (s.rfind("seg:", 0) == 0) {
      const std::size_t colon = s.find(':', 4);
      const int n = std::stoi(s.substr(4, colon - 4));
      const bool vmm = s.substr(colon + 1) == "vmm";
      int bad = 0;
      for (int k = 0; k < n; ++k) bad += seg(1 << 20, vmm ? 1 : 0) != 0;
      std::printf("%s %s\n", s.c_str(), bad ? "failed" : "ok");
    } else if (s == "main-malloc") {
      std::printf("%s %s\n", s.c_str(), cudaGetErrorName(cudaMalloc(&mine, 1 << 20)));
    } else if (s.rfind("applied:", 0) == 0) {
      using fn = int (*)(const char *);
      auto f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "cumemguard_torch_settings_applied"));
      std::printf("%s %s\n", s.c_str(), f ? std::to_string(f(s.c_str() + 8)).c_str() : "absent");
    } else {
      std::fprintf(stderr, "unknown step %s\n", s.c_str());
      return 64;
    }
  }
  if (mine) CHECK_CUDA(cudaFree(mine));
  std::printf("release %s\n", rel() == 0 ? "ok" : "failed");
  return 0;
}
