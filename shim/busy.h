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

// Asks the driver about the calling thread's current context, which must be on device `dev`
// (otherwise, or without a context, nothing is known and nothing is reported). `query`: one
// cuStreamQuery of the legacy default stream, which never waits (work on other streams is not
// seen). `sync`: cuCtxSynchronize, timed; it waits for every stream of the context.
BusyResult busy_check(BusyCheck mode, int dev);

}  // namespace cmg::shim
