// SPDX-License-Identifier: Apache-2.0
// Lookups at the edges: a process without CUDA whose startup library asks dlsym(RTLD_DEFAULT) for
// driver names; a -lcuda program that calls cuGetProcAddress first thing, including the 32-bit v1
// ABI of cuMemAlloc (which the shim must not wrap); an extension loaded RTLD_LOCAL that links a
// runtime under another name.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

extern "C" int edge_cuda_present(void);
extern "C" int edge_gpa_present(void);

#ifndef EDGE_NOCUDA
namespace {
const char *where(void *p) {
  if (!p) return "null";
  Dl_info info{};
  if (!dladdr(p, &info) || !info.dli_fname) return "unknown";
  if (std::strstr(info.dli_fname, "cumemguard")) return "shim";
  if (std::strstr(info.dli_fname, "libcuda")) return "libcuda";
  return "other";
}
}  // namespace
#endif

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "nocuda") {
    std::printf("cuda_present %d\n", edge_cuda_present());
    std::printf("gpa_present %d\n", edge_gpa_present());
    return 0;
  }
#ifndef EDGE_NOCUDA
  if (mode == "gpa") {
    // Through the PLT, before anything has dlopen()ed libcuda.
    void *v1 = nullptr, *v2 = nullptr, *create = nullptr;
    CUdriverProcAddressQueryResult st;
    std::printf("v1_status %d\n", cuGetProcAddress("cuMemAlloc", &v1, 2000, 0, &st));
    std::printf("v1_in %s\n", where(v1));
    cuGetProcAddress("cuMemAlloc", &v2, 3020, 0, &st);
    std::printf("v2_in %s\n", where(v2));
    cuGetProcAddress("cuMemCreate", &create, 12000, 0, &st);
    std::printf("create_in %s\n", where(create));
    std::printf("v1_differs %d\n", v1 != v2 ? 1 : 0);
    return 0;
  }
  if (mode == "extension") {
    void *h = dlopen("libedge_ext.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::printf("dlopen %s\n", dlerror());
      return 2;
    }
    auto f = reinterpret_cast<int (*)()>(dlsym(h, "ext_alloc_free"));
    std::printf("ext_alloc_free %d\n", f ? f() : -1);
    return 0;
  }
#endif
  return 64;
}
