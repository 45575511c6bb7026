// SPDX-License-Identifier: Apache-2.0
// A host that changes its environment from one thread (setenv of ever new names, which makes
// glibc reallocate `environ`, and of PYTORCH_CUDA_ALLOC_CONF) while another exports VMM memory
// with legacy IPC, whose finding names PyTorch's allocator setting as it stands now. The shim read
// `environ` there on every export: a read of the array setenv had just freed (AddressSanitizer:
// heap-use-after-free). Prints how many exports the driver refused (all: VMM memory, section 2)
// and how many ran.
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "cuda_check.h"

int main() {
  CHECK_CU(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  const std::size_t g = 2u << 20;
  CUmemAllocationProp pr{};
  pr.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pr.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  CHECK_CU(cuMemCreate(&h, g, &pr, 0));
  CHECK_CU(cuMemAddressReserve(&v, g, 0, 0, 0));
  CHECK_CU(cuMemMap(v, g, 0, h, 0));
  constexpr int kNames = 3000, kExports = 3000;
  std::atomic<bool> go{false};
  std::thread changer([&] {
    while (!go.load()) {
    }
    for (int i = 0; i < kNames; ++i) {
      setenv(("CMG_ENV_RACE_" + std::to_string(i)).c_str(), "x", 1);
      if (i % 16 == 0)
        setenv("PYTORCH_CUDA_ALLOC_CONF", i % 32 ? "expandable_segments:True" : "", 1);
    }
  });
  int refused = 0;
  go.store(true);
  for (int i = 0; i < kExports; ++i) {
    CUipcMemHandle ih;
    refused += cuIpcGetMemHandle(&ih, v) != CUDA_SUCCESS;
  }
  changer.join();
  std::printf("exports %d\nrefused %d\n", kExports, refused);
  CHECK_CU(cuMemUnmap(v, g));
  CHECK_CU(cuMemRelease(h));
  CHECK_CU(cuMemAddressFree(v, g));
  return 0;
}
