// SPDX-License-Identifier: Apache-2.0
// The driver's view of a freed address or a released handle value: see driver_view.h.
#include "driver_view.h"

#include <atomic>

#include "loader.h"

namespace cmg::shim {
namespace {

DriverView from_status(CUresult r) {
  DriverView v;
  // Only a refusal that names the object as unknown proves it is not live; any other error (no
  // context, a driver being torn down) proves nothing, and the call goes to the driver.
  v.live = r == CUDA_SUCCESS               ? DriverView::Live::Yes
           : r == CUDA_ERROR_INVALID_VALUE ? DriverView::Live::No
                                           : DriverView::Live::Unknown;
  return v;
}

}  // namespace

DriverView driver_view_of_address(std::uint64_t ptr) {
  static std::atomic<void *> slot{nullptr};
  auto attr = driver_fn<PFN_cuPointerGetAttribute_v4000>(slot, "cuPointerGetAttribute");
  if (!attr) return {};
  CUdeviceptr start = 0;
  DriverView v = from_status(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr));
  if (v.live != DriverView::Live::Yes) return v;
  // Memory of a pool comes from a CUDA graph's memory node or a stream-ordered allocation.
  CUmemoryPool pool = nullptr;
  if (attr(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) == CUDA_SUCCESS && pool)
    v.path = "a memory pool the shim does not see allocate (a CUDA graph's memory node, or a "
             "stream-ordered allocation made through a path it does not see)";
  return v;
}

DriverView driver_view_of_handle(std::uint64_t handle) {
  static std::atomic<void *> slot{nullptr};
  auto props = driver_fn<PFN_cuMemGetAllocationPropertiesFromHandle_v10020>(
      slot, "cuMemGetAllocationPropertiesFromHandle");
  if (!props) return {};
  CUmemAllocationProp prop{};
  return from_status(props(&prop, static_cast<CUmemGenericAllocationHandle>(handle)));
}

}  // namespace cmg::shim
