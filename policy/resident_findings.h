// SPDX-License-Identifier: Apache-2.0
// The findings that stand at a residency boundary (boundaries.h, device_use.h), phrased here from
// what the shim found still in place, so that the shim's part stays free of policy text.
#pragma once

#include <cstdint>
#include <vector>

#include "boundaries.h"
#include "device_use.h"
#include "event.h"

namespace cmg::resident_findings {

// One of a failed wake-up's allocations, as the model holds it when the wake-up's run ended.
struct Left {
  WakeMade made;
  std::uint64_t bytes = 0;  // the mapping's size, or the allocation's for a created handle
  bool mapped = false;      // still mapped at made.va; else created and still held
};

// failed-wake: `res_name` is the refused call's status by name ("CUDA_ERROR_OUT_OF_MEMORY").
Finding failed_wake(const WakeRun &w, const std::vector<Left> &left, const char *res_name);
// stayed-mapped: the leftovers still mapped at the end of sleep `s`.
Finding stayed_mapped(const SleepRun &s, const std::vector<Leftover> &stayed, const char *res_name);
// stray-device: the first context or memory on `dev` (`context`), judged against `v`; for one
// judged when a communicator came (`by_comm`), `v.home` is that communicator's device.
Finding stray_device(int dev, bool context, const DeviceUse::Verdict &v, bool by_comm,
                     const EventRef &first);

}  // namespace cmg::resident_findings
