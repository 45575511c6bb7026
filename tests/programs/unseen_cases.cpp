// SPDX-License-Identifier: Apache-2.0
// Memory issued again through a path the shim does not see, then freed by the program (the
// legitimate free the model remembers as freed): a library holding the driver's own cuMemAlloc_v2
// or cuMemCreate, fetched where no interposer can stand in between (own_symbol.h, as a library
// that looked them up before the shim loaded), gets the address or handle value the program freed
// a moment ago (real-driver.md D18: reused, the last freed first on the fake). The program's free
// must reach the driver and release the memory; the classic double free after it stays a double
// free. Prints one "step STATUS" line per call whose result matters, and the driver's live memory
// where the fake driver can say (n/a on the real one).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_check.h"
#include "fakecuda.h"
#include "own_symbol.h"

namespace {

constexpr std::size_t kBytes = 1 << 20;
constexpr std::size_t G = 2u << 20;  // granularity (real-driver.md D19)

void out(const char *step, CUresult r) { std::printf("%s %s\n", step, cu_name(r)); }
void out(const char *step, cudaError_t r) { std::printf("%s %s\n", step, cudaGetErrorName(r)); }

// The driver's view of its own memory (the fake's state; n/a on the real driver).
void live(const char *step, bool handles) {
  auto f = reinterpret_cast<fakecuda_get_state_fn>(dlsym(RTLD_DEFAULT, "fakecuda_get_state"));
  fakecuda_state st{};
  if (!f || f(&st) != 0) {
    std::printf("%s n/a\n", step);
    return;
  }
  std::printf("%s %llu\n", step, handles ? st.handle_refs : st.linear_bytes);
}

// The driver's own entry point `name`, as a library that fetched it before the shim loaded holds.
template <class F>
F unseen(const char *name) {
  void *p = cmg_test::own_symbol(cmg_test::find_loaded("libcuda.so"), name);
  if (!p) {
    std::fprintf(stderr, "unseen_cases: no %s in the loaded libcuda\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(p);
}

// cuMemAlloc'ed and freed through the API the shim sees, then issued again unseen and freed.
int linear() {
  CHECK_CU(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  auto alloc = unseen<PFN_cuMemAlloc_v3020>("cuMemAlloc_v2");
  live("live_before", false);
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(cuMemAlloc(&p, kBytes));
  out("first_free", cuMemFree(p));
  out("unseen_alloc", alloc(&q, kBytes));
  std::printf("reused %d\n", p == q ? 1 : 0);
  live("live_unseen", false);
  out("reissued_free", cuMemFree(q));  // the legitimate free: the memory must go back
  live("live_after", false);
  out("double_free", cuMemFree(q));    // and now it is a double free
  return 0;
}

// The same through the runtime: cudaMalloc / cudaFree, the address issued again by the driver.
int runtime() {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, kBytes));
  auto alloc = unseen<PFN_cuMemAlloc_v3020>("cuMemAlloc_v2");
  live("live_before", false);
  out("first_free", cudaFree(p));
  CUdeviceptr q = 0;
  out("unseen_alloc", alloc(&q, kBytes));
  std::printf("reused %d\n", reinterpret_cast<CUdeviceptr>(p) == q ? 1 : 0);
  out("reissued_free", cudaFree(reinterpret_cast<void *>(q)));
  live("live_after", false);
  out("double_free", cudaFree(reinterpret_cast<void *>(q)));
  out("last_error", cudaGetLastError());
  return 0;
}

// A VMM handle value released through the API the shim sees, issued again unseen and released.
int handle() {
  CHECK_CU(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  auto create = unseen<PFN_cuMemCreate_v10020>("cuMemCreate");
  CUmemAllocationProp pr{};
  pr.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pr.location.id = 0;
  live("live_before", true);
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CHECK_CU(cuMemCreate(&h, G, &pr, 0));
  out("first_release", cuMemRelease(h));
  out("unseen_create", create(&h2, G, &pr, 0));
  std::printf("reused %d\n", h == h2 ? 1 : 0);
  live("live_unseen", true);
  out("reissued_release", cuMemRelease(h2));  // the legitimate release
  live("live_after", true);
  out("double_release", cuMemRelease(h2));    // and now it is a double release
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  const std::string c = argc > 1 ? argv[1] : "";
  if (c == "linear") return linear();
  if (c == "runtime") return runtime();
  if (c == "handle") return handle();
  std::fprintf(stderr, "usage: unseen_cases linear|runtime|handle\n");
  return 2;
}
