// SPDX-License-Identifier: Apache-2.0
// Tests of the fake driver's multicast objects (driver_multicast.cpp): off unless asked, the
// argument rules of cuda.h 13.0, and bindings that keep the memory they bind alive.
#include <catch2/catch.hpp>
#include <cuda.h>

#include "fakecuda.h"
#include "selftest_state.h"

namespace {

using selftest::require_nothing_live;
using selftest::state;

constexpr size_t G = size_t{2} << 20;

CUmulticastObjectProp mc_prop(unsigned ndev, size_t size) {
  CUmulticastObjectProp p{};
  p.numDevices = ndev;
  p.size = size;
  p.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

CUmemGenericAllocationHandle device_memory(size_t size, int dev = 0) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(cuMemCreate(&h, size, &p, 0) == CUDA_SUCCESS);
  return h;
}

}  // namespace

TEST_CASE("without multicast support every call is NOT_SUPPORTED", "[multicast-off]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int v = -1;
  REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0) == CUDA_SUCCESS);
  CHECK(v == 0);
  CUmulticastObjectProp p = mc_prop(1, G);
  CUmemGenericAllocationHandle mc = 0;
  CHECK(cuMulticastCreate(&mc, &p) == CUDA_ERROR_NOT_SUPPORTED);
  size_t gran = 0;
  CHECK(cuMulticastGetGranularity(&gran, &p, CU_MULTICAST_GRANULARITY_MINIMUM) ==
        CUDA_ERROR_NOT_SUPPORTED);
}

TEST_CASE("multicast objects: team, binds, unbinds, release", "[env-multicast]") {
  // FAKECUDA_MULTICAST=1 FAKECUDA_DEVICES=2
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int v = -1;
  REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0) == CUDA_SUCCESS);
  CHECK(v == 1);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  CUmulticastObjectProp p = mc_prop(2, 2 * G);
  size_t gran = 0;
  REQUIRE(cuMulticastGetGranularity(&gran, &p, CU_MULTICAST_GRANULARITY_RECOMMENDED) ==
          CUDA_SUCCESS);
  CHECK(gran == G);
  CUmulticastObjectProp odd = mc_prop(2, G + 4096);
  CUmemGenericAllocationHandle mc = 0;
  CHECK(cuMulticastCreate(&mc, &odd) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMulticastCreate(&mc, &p) == CUDA_SUCCESS);
  CUmemGenericAllocationHandle mem = device_memory(2 * G);
  // Binds wait for the whole team (here: refused until it is complete).
  REQUIRE(cuMulticastAddDevice(mc, 0) == CUDA_SUCCESS);
  CHECK(cuMulticastAddDevice(mc, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMulticastBindMem(mc, 0, mem, 0, G, 0) == CUDA_ERROR_NOT_PERMITTED);
  REQUIRE(cuMulticastAddDevice(mc, 1) == CUDA_SUCCESS);
  CHECK(cuMulticastAddDevice(mc, 5) == CUDA_ERROR_INVALID_DEVICE);
  CHECK(cuMulticastBindMem(mc, 0, mem, 4096, G, 0) == CUDA_ERROR_INVALID_VALUE);   // not aligned
  CHECK(cuMulticastBindMem(mc, G, mem, 0, 2 * G, 0) == CUDA_ERROR_INVALID_VALUE);  // past the end
  REQUIRE(cuMulticastBindMem(mc, 0, mem, 0, G, 0) == CUDA_SUCCESS);
  CHECK(cuMulticastBindMem(mc, 0, mem, G, G, 0) ==
        CUDA_ERROR_INVALID_VALUE);  // same device, overlap
  // By address: the second half of a mapping.
  CUdeviceptr va = 0;
  REQUIRE(cuMemAddressReserve(&va, 2 * G, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(va, 2 * G, 0, mem, 0) == CUDA_SUCCESS);
  CUmemGenericAllocationHandle mc2 = 0;
  CUmulticastObjectProp p1 = mc_prop(1, G);
  REQUIRE(cuMulticastCreate(&mc2, &p1) == CUDA_SUCCESS);
  REQUIRE(cuMulticastAddDevice(mc2, 0) == CUDA_SUCCESS);
  REQUIRE(cuMulticastBindAddr(mc2, 0, va + G, G, 0) == CUDA_SUCCESS);
  // A binding keeps the memory alive: released and unmapped, it is still there.
  REQUIRE(cuMemUnmap(va, 2 * G) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(mem) == CUDA_SUCCESS);
  CHECK(state().phys_allocs == 1);
  CHECK(cuMulticastUnbind(mc, 0, 0, 2 * G) == CUDA_ERROR_INVALID_VALUE);  // not as bound
  REQUIRE(cuMulticastUnbind(mc, 0, 0, G) == CUDA_SUCCESS);
  CHECK(state().phys_allocs == 1);             // still bound to mc2
  REQUIRE(cuMemRelease(mc2) == CUDA_SUCCESS);  // releasing the object drops its bindings
  CHECK(state().phys_allocs == 0);
  CHECK(cuMemRelease(mc2) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemRelease(mc) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, 2 * G) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
  require_nothing_live();
}
