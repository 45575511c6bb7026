// SPDX-License-Identifier: Apache-2.0
// What the driver says of an address or a handle value the model holds as freed or released: the
// second half of the proof before a free or release is answered without the driver
// (architecture.md, "Skip only what is proven redundant"). Asked only on that suspected path.
#pragma once

#include <cstdint>

#include "decide.h"

namespace cmg::shim {

// cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR): INVALID_VALUE for an address no
// live allocation covers (real-driver.md D22), SUCCESS for a live one; a pool's memory is named.
DriverView driver_view_of_address(std::uint64_t ptr);

// cuMemGetAllocationPropertiesFromHandle: INVALID_VALUE for a released value (real-driver.md D23),
// SUCCESS for a live one.
DriverView driver_view_of_handle(std::uint64_t handle);

}  // namespace cmg::shim
