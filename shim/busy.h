// SPDX-License-Identifier: Apache-2.0
// Whether a device still has work queued when its memory is unmapped (CUMEMGUARD_BUSY_CHECK): the
// bug behind sleep modes that unmap while the model's kernels still run (they then fault with an
// illegal address, reported by whatever call comes next).
#pragma once

#include <cstdint>

#include "options.h"

namespace cmg::shim {

struct BusyResult {
  bool busy = false;
  const char *how = "";      // "query" or "sync"
  std::uint64_t waited_ns = 0;
};

// Asks the driver about device `dev`, the device of the memory being unmapped, whatever the
// calling thread's current device: its primary context is made current for the check when the
// thread is on another device or has no context (a free callback running on a thread that works on
// device 1 can unmap device-0 memory). A device whose primary context is not active has no work
// and is not asked. `query`: one cuStreamQuery of that context's legacy default stream, which
// never waits (work on other streams is not seen). `sync`: cuCtxSynchronize of that context,
// timed; it waits for every stream of it.
BusyResult busy_check(BusyCheck mode, int dev);

}  // namespace cmg::shim
