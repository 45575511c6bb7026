// SPDX-License-Identifier: Apache-2.0
// Residency boundaries, the shim half (see resident.h): which run each call belongs to, the checks
// when a sleep or a wake-up ends (what a failed wake-up left, what stayed mapped across a sleep),
// and the devices a rank uses. The findings here belong to no single call: they are reported with
// the stack of the event that makes them (the refused call, the first use of a device).
#include "resident.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "diag.h"
#include "errors.h"
#include "exiting.h"
#include "resident_findings.h"
#include "stacks.h"
#include "summary.h"

namespace cmg::shim {
namespace {

CallRole role_of(Api api) {
  switch (api) {
    case Api::cuMemUnmap:
    case Api::cuMemRelease:
    case Api::cuMemAddressFree:
    case Api::cuMemFree_v2:
    case Api::cuMemFreeHost:
    case Api::cuMemFreeAsync:
    case Api::cuMemFreeAsync_ptsz:
    case Api::cuMemPoolTrimTo:
    case Api::cudaFree:
    case Api::cudaFreeHost:
    case Api::cudaFreeAsync:
    case Api::cudaFreeAsync_ptsz:
    case Api::cudaMemPoolTrimTo:
    case Api::cuIpcCloseMemHandle:
    case Api::cudaIpcCloseMemHandle:
      return CallRole::Takes;
    case Api::cuMemCreate:
    case Api::cuMemMap:
    case Api::cuMemSetAccess:
    case Api::cuMemRetainAllocationHandle:
      return CallRole::Wakes;
    default:
      return CallRole::Other;
  }
}

const char *cu_name(int res) {
  const char *n = status_name(Family::Driver, res);
  return n ? n : "";
}

// A finding that stands at a boundary: counted, written with its related events and the stack of
// the event that makes it, printed; strict mode stops here as it does at any finding.
void report_boundary(Finding f, const char *where, std::uint32_t stack) {
  const Action a = state().opts.action_for(f.cls);
  report_finding_without_call(std::move(f), where, /*print=*/true, stack);
  if (a == Action::Abort) {
    diag_line(LogLevel::Error,
              "strict mode: aborting at the first finding (CUMEMGUARD_MODE=strict)");
    exit_summary(ExitHow::Abort);
    std::abort();
  }
}

// Whether the mapping a wake-up made at m.va (its map was seq m.ev.seq) is still in place.
bool still_mapped(const WakeMade &m) {
  if (!m.va) return false;
  const auto pages = state().vmm.pages_of(m.va);
  if (!pages) return false;
  for (const PageView &p : pages->pages)
    if (pages->base + p.off == m.va && p.map_seq == m.ev.seq) return true;
  return false;
}

// Whether the handle a wake-up created (seq m.ev.seq) is still held in that issue.
bool still_held(const WakeMade &m) {
  const auto h = state().vmm.handle(m.handle);
  return h && h->refs > 0 && h->issued.seq == m.ev.seq;
}

void close_wake(const WakeRun &w) {
  if (w.failed) {
    std::vector<resident_findings::Left> left;
    std::vector<Leftover> keep;
    for (const WakeMade &m : w.made) {
      if (m.va && still_mapped(m)) {
        left.push_back({m, m.size, true});
        keep.push_back(Leftover{m, w.failed_call, w.failed_res, w.tid});
      } else if (!m.va && still_held(m)) {
        left.push_back({m, m.size, false});
      }
    }
    if (!left.empty()) {
      Finding f = resident_findings::failed_wake(w, left, cu_name(w.failed_res));
      report_boundary(std::move(f), "(wake-up boundary)", w.failed_call.stack);
    }
    if (!keep.empty()) boundaries().keep(std::move(keep));
  }
  SnapshotRun run{"wake-up", w.first, w.woken, w.woken_bytes, w.failed};
  take_snapshot(w.failed ? "wake-up (failed)" : "wake-up", SnapshotTrigger::Wake, true, &run);
}

// `at`: the boundary the sleep ends at (its label and trigger), when it ends at one; false when
// no snapshot was due (nothing was put to sleep).
struct At {
  const char *label = "sleep";
  SnapshotTrigger trigger = SnapshotTrigger::Sleep;
};

bool close_sleep(const SleepRun &sr, At at = {}) {
  // Ranges whose reservations were freed before the run ended were freed, not put to sleep
  // (NCCL's and many allocators' free: unmap, release, address free).
  std::size_t asleep = 0;
  sr.seen.each([&](const SleepRun::Range &r) {
    if (std::strcmp(state().vmm.range_state(r.va, r.size), "asleep") == 0) ++asleep;
  });
  if (asleep == 0 && sr.seen_all) return false;
  if (boundaries().has_leftovers()) {
    std::vector<Leftover> stayed, back;
    for (Leftover &l : boundaries().take_leftovers()) {
      if (!still_mapped(l.made)) continue;  // unmapped since: nothing left of it
      // The same allocator: the same map site where both have stacks, else the same thread.
      const bool same =
          l.made.site && sr.sites_known ? sr.sites.contains(l.made.site) : l.tid == sr.tid;
      (same ? stayed : back).push_back(std::move(l));
    }
    if (!stayed.empty()) {
      Finding f = resident_findings::stayed_mapped(sr, stayed, cu_name(stayed.front().failed_res));
      report_boundary(std::move(f), "(sleep boundary)", stayed.front().made.ev.stack);
    }
    if (!back.empty()) boundaries().keep(std::move(back));
  }
  SnapshotRun run{"sleep", sr.first, sr.ranges, sr.bytes, false};
  take_snapshot(at.label, at.trigger, true, &run);
  return true;
}

// True when a sleep ended at `at` took the boundary's snapshot.
bool close_runs(Boundaries::Ended e, At at = {}) {
  if (e.wake) close_wake(*e.wake);
  return e.sleep && close_sleep(*e.sleep, at);
}

// A rank by its environment (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK) or LOCAL_RANK.
bool rank_by_env() {
  return state().rank >= 0 || std::getenv("LOCAL_RANK") != nullptr;
}

void judge_first_use(int dev, EventRef ev, bool context) {
  const DeviceUse::Verdict v = device_use().first_use(dev, ev, context, rank_by_env());
  if (!v.stray) return;
  // Shown with its stack, stacks on or not: it is what the user needs to find the thread.
  if (!ev.stack && state().log.is_open()) ev.stack = capture_stack(kFindingFrames);
  Finding f = resident_findings::stray_device(dev, context, v, false, ev);
  report_boundary(std::move(f), context ? "cuDevicePrimaryCtxRetain" : ev.api, ev.stack);
}

}  // namespace

void boundary_call_slow(Api api, std::uint32_t tid) {
  // A run is open, but most calls (a sleep's own unmaps, another thread's calls) end none: those
  // take no lock.
  const CallRole role = role_of(api);
  if (!boundaries().ends_run(tid, role)) return;
  if (exit_in_progress()) return;  // nothing allocates once exit began
  Boundaries::Ended e = boundaries().on_call(tid, role);
  if (e.any()) close_runs(std::move(e));
}

void boundary_after_vmm_slow(const Call &c, const VmmTicket &t, bool called, int status) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (!c.tracked()) return;
  const bool ok = called && status == CUDA_SUCCESS;
  if (t.op == VmmTicket::Op::Unmap && ok && !t.unmapped.empty()) {
    std::uintptr_t sites[16];
    std::size_t n = 0;
    std::uint64_t bytes = 0;
    t.unmapped.each([&](const Mapping &m) {
      bytes += m.size;
      if (n < 16) sites[n++] = stack_site(m.mapped.stack);
    });
    close_runs(
        boundaries().on_sleep_unmap(c.ev(), t.va, t.size, t.unmapped.size(), bytes, sites, n));
  } else if (t.op == VmmTicket::Op::Map && ok) {
    const std::uintptr_t site = stack_site(c.ev().stack);
    if (t.woken.empty()) {
      boundaries().on_map(c.ev(), t.va, t.size, t.value, site);
    } else {
      std::uint64_t bytes = 0;
      t.woken.each([&](const Sleeper &s) { bytes += s.size; });
      close_runs(
          boundaries().on_wake_map(c.ev(), t.va, t.size, t.value, t.woken.size(), bytes, site));
    }
  } else if (t.op == VmmTicket::Op::Map && called && status != CUDA_SUCCESS) {
    boundaries().on_refused(c.ev(), status);
  }
}

void boundary_before_address_free(const Call &c, std::uint64_t ptr) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (c.tracked() && boundaries().open()) close_runs(boundaries().on_address_free(c.ev().tid, ptr));
}

void boundary_after_create_slow(const Call &c, int status, std::uint64_t handle,
                                std::uint64_t size) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (!c.tracked()) return;
  if (status == CUDA_SUCCESS)
    boundaries().on_create(c.ev(), handle, size);
  else
    boundaries().on_refused(c.ev(), status);
}

void boundary_after_access_slow(const Call &c, int status) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (c.tracked() && status != CUDA_SUCCESS) boundaries().on_refused(c.ev(), status);
}

void boundary_after_nccl(Api api, bool created, bool destroyed,
                         std::span<const CommOnDevice> comms) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (created && !comms.empty()) {
    std::vector<int> devs;
    for (const CommOnDevice &c : comms) devs.push_back(c.dev);
    for (const DeviceUse::First &f : device_use().communicators(devs)) {
      DeviceUse::Verdict v;
      v.stray = true;
      v.home = devs.front();
      Finding fd = resident_findings::stray_device(f.dev, f.context, v, true, f.ev);
      report_boundary(std::move(fd), api_name(api), f.ev.stack);
    }
  }
  if (destroyed) {
    close_runs(boundaries().end_all());
    take_snapshot(api_name(api), SnapshotTrigger::Destroy, true);
  }
}

void device_first_memory(const Call &c, int dev) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (c.tracked()) judge_first_use(dev, c.ev(), false);
}

namespace {

void device_context_retained(int dev) {
  if (disabled() || dev < 0 || device_use().seen(dev)) return;
  const DeviceUse::Verdict v = device_use().first_use(dev, EventRef{}, true, rank_by_env());
  if (!v.stray) return;
  activate();  // a rank's second device before any memory call: said, so the log opens
  EventRef ev;
  ev.api = "cuDevicePrimaryCtxRetain";
  ev.tid = thread_id();
  if (state().log.is_open()) ev.stack = capture_stack(kFindingFrames);
  report_boundary(resident_findings::stray_device(dev, true, v, false, ev),
                  "cuDevicePrimaryCtxRetain", ev.stack);
}

}  // namespace

CUresult context_retain(int dev, FnRef<CUresult()> real) {
  return shielded<CUresult>(Api::cuDevicePrimaryCtxRetain, real, [&](auto &fwd) {
    const CUresult r = fwd();
    // Not recorded as a call: the runtime makes it inside the program's calls, which the counts
    // already hold. Only the device is noted (nothing allocates once exit began).
    if (r == CUDA_SUCCESS && !exit_in_progress()) device_context_retained(dev);
    return r;
  });
}

void snapshot_at_boundary(const char *label, SnapshotTrigger trigger) {
  if (exit_in_progress()) return;  // nothing allocates once exit began
  if (!close_runs(boundaries().end_all(), At{label, trigger})) take_snapshot(label, trigger, true);
}

std::uint64_t snapshot_requested(const char *label, SnapshotTrigger trigger) {
  if (exit_in_progress()) return 0;  // nothing allocates once exit began
  close_runs(boundaries().end_all());
  return take_snapshot(label, trigger, false);
}

}  // namespace cmg::shim
