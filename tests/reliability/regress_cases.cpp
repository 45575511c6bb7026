// SPDX-License-Identifier: Apache-2.0
// Exact call sequences of defects the stress and fuzz runs found (docs/reliability.md, "Findings"),
// as cases of tests/integration/run_case.py. Fake driver only: they need its deterministic value
// reuse (the value released last is issued first) and its introspection.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cuda_check.h"

namespace {

constexpr size_t G = 2u << 20;

void out(const char *step, CUresult r) { std::printf("%s %s\n", step, cu_name(r)); }

CUmemGenericAllocationHandle create() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  CHECK_CU(cuMemCreate(&h, G, &p, 0));
  return h;
}

CUdeviceptr reserve() {
  CUdeviceptr v = 0;
  CHECK_CU(cuMemAddressReserve(&v, G, 0, 0, 0));
  return v;
}

int live(CUmemGenericAllocationHandle h) {
  using fn = int (*)(unsigned long long);
  auto f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "fakecuda_handle_live"));
  return f ? f(h) : -1;
}

// A range put to sleep (unmap, release of its handle value V), then a no-op unmap of it on this
// thread: the shim's pairing rule now expects the stale release of V. `issue` makes a fresh,
// legitimate handle with V on the same thread; its release must reach the driver.
template <class Issue>
int pairing(Issue &&issue) {
  CUdeviceptr r = reserve();
  CUmemGenericAllocationHandle a = create();
  CHECK_CU(cuMemMap(r, G, 0, a, 0));
  CHECK_CU(cuMemUnmap(r, G));  // sleep
  CHECK_CU(cuMemRelease(a));
  out("noop_unmap", cuMemUnmap(r, G));  // D3: success, nothing to do (a finding, skipped)
  CUmemGenericAllocationHandle fresh = issue();
  std::printf("value_reused %d\n", fresh == a ? 1 : 0);
  out("fresh_release", cuMemRelease(fresh));
  std::printf("fresh_live_after %d\n", live(fresh));
  CHECK_CU(cuMemAddressFree(r, G));
  return 0;
}

int import_pairing() {
  CUmemGenericAllocationHandle x = create();
  int fd = -1;
  CHECK_CU(cuMemExportToShareableHandle(&fd, x, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int rc = pairing([&] {
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(static_cast<long>(fd)),
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    return h;
  });
  close(fd);
  CHECK_CU(cuMemRelease(x));
  return rc;
}

int retain_pairing() {
  // B stays mapped at r2 with no live handle: a retain from its address issues a new value, and
  // the value released last is issued first (the sleeping range's).
  CUdeviceptr r2 = reserve();
  CUmemGenericAllocationHandle b = create();
  CHECK_CU(cuMemMap(r2, G, 0, b, 0));
  CHECK_CU(cuMemRelease(b));
  int rc = pairing([&] {
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemRetainAllocationHandle(&h, reinterpret_cast<void *>(r2)));
    return h;
  });
  CHECK_CU(cuMemUnmap(r2, G));
  CHECK_CU(cuMemAddressFree(r2, G));
  return rc;
}

// Legacy IPC export of VMM memory under CUMEMGUARD_IPC=deny: the shim answers without the driver,
// and its finding must say so (it said "forward" and "the driver returned 1").
int ipc_deny() {
  CUdeviceptr r = reserve();
  CUmemGenericAllocationHandle a = create();
  CHECK_CU(cuMemMap(r, G, 0, a, 0));
  CUipcMemHandle ih;
  out("ipc_get", cuIpcGetMemHandle(&ih, r));
  CHECK_CU(cuMemUnmap(r, G));
  CHECK_CU(cuMemRelease(a));
  CHECK_CU(cuMemAddressFree(r, G));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: regress_cases CASE\n");
    return 64;
  }
  if (!on_fake_driver()) return 77;
  init_primary();
  const std::string c = argv[1];
  if (c == "import-pairing") return import_pairing();
  if (c == "retain-pairing") return retain_pairing();
  if (c == "ipc-deny") return ipc_deny();
  std::fprintf(stderr, "unknown case %s\n", argv[1]);
  return 64;
}
