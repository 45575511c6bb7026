// SPDX-License-Identifier: Apache-2.0
// The busy check at unmap: see busy.h. It calls the driver's own exports (never the shim's
// wrappers), so nothing of it is recorded as the program's.
#include "busy.h"

#include "clock.h"
#include "cuda_api.h"
#include "handlers_capture.h"
#include "loader.h"
#include "state.h"

namespace cmg::shim {

namespace {
// A context synchronisation that returns within this was idle: the call itself costs microseconds.
constexpr std::uint64_t kWaitedNs = 100'000;
}  // namespace

BusyResult busy_check(BusyCheck mode, int dev) {
  BusyResult r;
  if (mode == BusyCheck::Off || dev < 0 || current_device() != dev) return r;
  // Querying the legacy stream, or synchronizing the context, while a stream captures is refused
  // and invalidates the capture (real-driver.md C9, C10, C17): the check waits for the capture.
  if (capture_open() && !may_check_busy()) return r;
  if (mode == BusyCheck::Query) {
    static std::atomic<void *> slot{nullptr};
    auto q = driver_fn<PFN_cuStreamQuery_v2000>(slot, "cuStreamQuery");
    r.how = "query";
    r.busy = q && q(CU_STREAM_LEGACY) == CUDA_ERROR_NOT_READY;
    return r;
  }
  static std::atomic<void *> slot{nullptr};
  auto s = driver_fn<PFN_cuCtxSynchronize_v2000>(slot, "cuCtxSynchronize");
  if (!s) return r;
  const std::uint64_t t0 = mono_ns();
  if (s() != CUDA_SUCCESS) return r;
  r.how = "sync";
  r.waited_ns = mono_ns() - t0;
  r.busy = r.waited_ns >= kWaitedNs;
  return r;
}

}  // namespace cmg::shim
