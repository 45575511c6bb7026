// SPDX-License-Identifier: Apache-2.0
// How driver functions are reached (bug-patterns.md P23-P25, real-driver.md section 5): the
// cuGetProcAddress chain before cuInit, per-ABI answers for one name at several versions and
// stream flags, handle-scoped lookups resolving in their handle's scope, NULL staying NULL, and
// RTLD_NEXT keeping its caller-relative meaning. Prints "check value" lines.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

extern "C" const char *nextdef_probe();  // libnextdef.so: asks dlsym(RTLD_NEXT) for its own symbol

namespace {

const char *where(void *p) {
  if (!p) return "null";
  Dl_info info{};
  if (!dladdr(p, &info) || !info.dli_fname) return "unknown";
  if (std::strstr(info.dli_fname, "cumemguard")) return "shim";
  if (std::strstr(info.dli_fname, "libcuda")) return "libcuda";
  return "other";
}

void line(const char *k, const char *v) { std::printf("%s %s\n", k, v); }
void line(const char *k, int v) { std::printf("%s %d\n", k, v); }

}  // namespace

int main() {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
    return 2;
  }
  // P23: what cudart does first, before cuInit.
  auto gpa2 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(h, "cuGetProcAddress_v2"));
  line("p23.dlsym_gpa", where(reinterpret_cast<void *>(gpa2)));
  void *self11 = nullptr, *self12 = nullptr;
  line("p23.gpa_11030_status", gpa2("cuGetProcAddress", &self11, 11030, 0, nullptr));
  line("p23.gpa_12000_status", gpa2("cuGetProcAddress", &self12, 12000, 0, nullptr));
  line("p23.self_11030", where(self11));
  line("p23.self_12000", where(self12));
  line("p23.self_differ", self11 != self12 ? 1 : 0);
  auto gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(self12);
  CUdriverProcAddressQueryResult st;
  void *init = nullptr;
  gpa("cuInit", &init, 2000, 0, &st);
  line("p23.cuinit", where(init));
  reinterpret_cast<PFN_cuInit_v2000>(init)(0);
  void *create = nullptr;
  gpa("cuMemCreate", &create, 12000, 0, &st);
  line("p23.later_lookup_cuMemCreate", where(create));
  void *nccl_create = nullptr;
  gpa("cuMemCreate", &nccl_create, 10020, 0, &st);
  line("p23.cuMemCreate_10020_same", create == nccl_create ? 1 : 0);

  // P24: one name, several ABI variants.
  void *a0 = nullptr, *a2 = nullptr;
  gpa("cuMemAllocAsync", &a0, 11020, 0, &st);
  gpa("cuMemAllocAsync", &a2, 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  line("p24.allocasync_legacy", where(a0));
  line("p24.allocasync_ptsz", where(a2));
  line("p24.allocasync_differ", a0 != a2 ? 1 : 0);
  void *s2000 = nullptr, *s13000 = nullptr;
  gpa("cuCtxSynchronize", &s2000, 2000, 0, &st);
  gpa("cuCtxSynchronize", &s13000, 13000, 0, &st);
  line("p24.ctxsync_differ", s2000 && s13000 && s2000 != s13000 ? 1 : 0);
  line("p24.ctxsync_2000", where(s2000));  // not wrapped: the driver's own pointer, zero cost
  void *c3020 = nullptr, *c11040 = nullptr;
  gpa("cuCtxCreate", &c3020, 3020, 0, &st);
  gpa("cuCtxCreate", &c11040, 11040, 0, &st);
  line("p24.ctxcreate_differ", c3020 && c11040 && c3020 != c11040 ? 1 : 0);
  void *ipc4010 = nullptr, *ipc11000 = nullptr;
  gpa("cuIpcOpenMemHandle", &ipc4010, 4010, 0, &st);
  gpa("cuIpcOpenMemHandle", &ipc11000, 11000, 0, &st);
  line("p24.ipcopen_4010", where(ipc4010));
  line("p24.ipcopen_11000", where(ipc11000));
  line("p24.ipcopen_differ", ipc4010 != ipc11000 ? 1 : 0);
  void *alloc3020 = nullptr;
  gpa("cuMemAlloc", &alloc3020, 3020, 0, &st);
  line("p24.memalloc_3020", where(alloc3020));
  void *none = reinterpret_cast<void *>(1);
  CUresult r = gpa("cuNoSuchFunction", &none, 12000, 0, &st);
  line("p24.missing_status", r);
  line("p24.missing_ptr", where(none));
  line("p24.missing_symstatus", st);

  // P25: a handle-scoped lookup resolves in that handle's scope (not in the shim).
  line("p25.dlsym_cuInit", where(dlsym(h, "cuInit")));
  line("p25.dlsym_default_cuInit", where(dlsym(RTLD_DEFAULT, "cuInit")));
  line("p25.dlsym_cuMemUnmap", where(dlsym(h, "cuMemUnmap")));

  // The runtime's entry-point lookups (PyTorch's DriverAPI path).
  void *rt = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemMap", &rt, 12000, cudaEnableDefault, &q);
  line("rt.entry_point_status", e);
  line("rt.entry_point_cuMemMap", where(rt));

  // RTLD_NEXT from a library that looks up the next definition of its own symbol.
  line("rtld_next.probe", nextdef_probe());
  return 0;
}
