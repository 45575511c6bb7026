// SPDX-License-Identifier: Apache-2.0
// Catch2 helpers of the fake stack's tests: the driver's state, and "nothing is left alive".
#pragma once

#include <catch2/catch.hpp>

#include "fakecuda.h"

namespace selftest {

inline fakecuda_state state() {
  fakecuda_state s{};
  REQUIRE(fakecuda_get_state(&s) == 0);
  return s;
}

inline void require_nothing_live() {
  fakecuda_state s = state();
  CHECK(s.linear_allocs == 0);
  CHECK(s.host_allocs == 0);
  CHECK(s.phys_allocs == 0);
  CHECK(s.handle_refs == 0);
  CHECK(s.reservations == 0);
  CHECK(s.mappings == 0);
  CHECK(s.ipc_imports == 0);
  CHECK(s.streams == 0);
  for (unsigned long long used : s.device_used) CHECK(used == 0);
}

}  // namespace selftest
