// SPDX-License-Identifier: Apache-2.0
// What is still resident, the shim half: the boundaries the hooks report to (policy/boundaries.h,
// policy/device_use.h), the checks at each boundary, and the snapshots themselves (snapshot.cpp):
// a log record of what is live, mapped, held and asleep by device, kind and creating stack.
#pragma once

#include <cstdint>
#include <span>

#include "boundaries.h"
#include "cuda_api.h"
#include "shield.h"
#include "device_use.h"
#include "state.h"
#include "vmm_model.h"

namespace cmg::shim {

inline Boundaries &boundaries() {
  return state().boundaries;
}
inline DeviceUse &device_use() {
  return state().devices;
}

// After a VMM call whose transaction the model ran (handlers_vmm.cpp): `called` whether the
// driver was called, `status` what it returned. Inline: only an accepted unmap that took
// mappings away, or a map the driver answered, concerns a run; every other VMM call (a refused
// unmap, a release, an address free) passes at a few instructions.
void boundary_after_vmm_slow(const Call &c, const VmmTicket &t, bool called, int status);
inline void boundary_after_vmm(const Call &c, const VmmTicket &t, bool called, int status) {
  if (called && (t.op == VmmTicket::Op::Map ||
                 (t.op == VmmTicket::Op::Unmap && status == CUDA_SUCCESS && !t.unmapped.empty())))
    boundary_after_vmm_slow(c, t, called, status);
}
// Before cuMemAddressFree of the reservation at `ptr`.
void boundary_before_address_free(const Call &c, std::uint64_t ptr);
// After cuMemCreate (size asked) and cuMemSetAccess. Inline: both concern only a wake-up open on
// the calling thread (Boundaries::on_create, on_refused).
void boundary_after_create_slow(const Call &c, int status, std::uint64_t handle, std::uint64_t size);
inline void boundary_after_create(const Call &c, int status, std::uint64_t handle,
                                  std::uint64_t size) {
  if (c.tracked() && c.st().boundaries.wake_open_on(c.ev().tid))
    boundary_after_create_slow(c, status, handle, size);
}
void boundary_after_access_slow(const Call &c, int status);
inline void boundary_after_access(const Call &c, int status) {
  if (status != CUDA_SUCCESS && c.tracked() && c.st().boundaries.wake_open_on(c.ev().tid))
    boundary_after_access_slow(c, status);
}
// After an NCCL lifecycle call (handlers_nccl.cpp): the communicators it created (their devices
// are the rank's), or a destroy or abort that succeeded (a boundary).
void boundary_after_nccl(Api api, bool created, bool destroyed,
                         std::span<const CommOnDevice> comms);

// The body of the cuDevicePrimaryCtxRetain hook (hooks_driver.cpp): the runtime makes a device's
// primary context there, inside the program's own calls, so the first context on each device is
// seen with the stack of the thread that made it; the call itself is not recorded.
CUresult context_retain(int dev, FnRef<CUresult()> real);

// ---- snapshots (snapshot.cpp) ---------------------------------------------------------------

enum class SnapshotTrigger : std::uint8_t { Sleep, Wake, Boundary, Suspend, Destroy, Signal, Api };
// What a boundary adds to its snapshot record: the run that ended.
struct SnapshotRun {
  const char *what = nullptr;  // "sleep", "wake-up"
  EventRef first;
  std::uint64_t ranges = 0, bytes = 0;
  bool failed = false;
};
// Writes a snapshot of what is resident now to the log. Automatic ones (boundaries) count against
// CUMEMGUARD_SNAPSHOTS. Returns its id, 0 when none was written (no log, or the limit reached).
std::uint64_t take_snapshot(const char *label, SnapshotTrigger trigger, bool automatic,
                            const SnapshotRun *run = nullptr);
// Every open run ends (its own boundary snapshot and checks first), then a snapshot named `label`
// (trigger Boundary, or Suspend for the NCCL suspend hook): for other parts of the shim. A sleep
// that ends here (the suspend's own unmaps) is this snapshot's run, not a snapshot of its own.
void snapshot_at_boundary(const char *label, SnapshotTrigger trigger = SnapshotTrigger::Boundary);
// A snapshot asked for (the C API, Python, the signal): open runs end first. Returns its id or 0.
std::uint64_t snapshot_requested(const char *label, SnapshotTrigger trigger);

// CUMEMGUARD_SNAPSHOT_SIGNAL: the handler is installed at load (so the signal never ends the
// program), the snapshot thread starts at activation.
void snapshot_signal_install();
void snapshot_signal_start();
void resident_fork_child();

}  // namespace cmg::shim
