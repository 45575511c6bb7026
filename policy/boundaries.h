// SPDX-License-Identifier: Apache-2.0
// The boundaries at which the shim takes a snapshot of what is resident without being asked
// (docs/report.md, "Resident memory"), and what it checks there. Pure C++, thread-safe.
//
//  * A sleep is a run of calls on one thread that begins with a cuMemUnmap leaving a range asleep
//    (unmapped, its reservation kept: vLLM's CuMemAllocator.sleep, torch_memory_saver's pause,
//    PyTorch's empty_cache of expandable segments) and goes on while that thread only takes
//    memory away (unmaps, releases, address frees, linear frees, pool trims). Its boundary is the
//    thread's first call that does anything else: typically the wake-up's first cuMemCreate,
//    which then still finds the memory as it was while asleep.
//  * A wake-up is a run that begins with a cuMemMap into a sleeping range and goes on while the
//    thread creates, maps, retains and sets access. When one of those is refused, the wake-up has
//    failed; its rollback (unmaps, releases, address frees on that thread) still belongs to it.
//    Its boundary is the thread's first call of another kind. What a failed wake-up created or
//    mapped and still holds then was not rolled back (finding failed-wake); a mapping of it still
//    in place at the end of the next sleep, while the same allocator put the rest to sleep, is
//    finding stayed-mapped.
//  * Explicit snapshots (signal, C, Python) and NCCL boundaries end every open run first.
// Runs are per thread because sleep and wake-up are: vLLM and torch_memory_saver make them on the
// caller's thread, and another thread's allocations meanwhile (a data loader, NCCL's proxy) are
// neither. A second thread's run ends the first.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "event.h"
#include "inline_vec.h"
#include "lock_within.h"

namespace cmg {

// What a hooked call does, for the runs (the shim maps each API to one).
//  Takes: cuMemUnmap, cuMemRelease, cuMemAddressFree, linear frees, pool trims;
//  Wakes: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemRetainAllocationHandle;
//  Other: everything else (allocations, reservations, NCCL, IPC, the shim's C API).
enum class CallRole : std::uint8_t { Takes, Wakes, Other };

struct SleepRun {
  std::uint32_t tid = 0;
  EventRef first;                       // the first unmap that left a range asleep
  std::uint64_t ranges = 0, bytes = 0;  // ranges (and their bytes) the run put to sleep
  // The map sites (innermost frame of the map's stack, outside the shim) of what went to sleep,
  // distinct, at most kMaxSites; sites_known is false when some mapping had no stack.
  // Inline first: a run opens and ends with every unmap-release-free of a mapping, and a heap
  // allocation per run would be one per VMM call sequence (docs/performance.md).
  InlineVec<std::uintptr_t, 4> sites;
  bool sites_known = true;
  // The unmapped ranges, at most kMaxRanges: a run whose ranges all had their reservation freed
  // by its end freed memory, it did not put it to sleep.
  struct Range {
    std::uint64_t va, size;
  };
  InlineVec<Range, 4> seen;
  bool seen_all = true;
};

// An allocation a wake-up made: a mapping (va, size) of `handle`, or a handle created (va 0).
struct WakeMade {
  std::uint64_t va = 0, size = 0;  // a created handle: va 0, size the allocation's
  std::uint64_t handle = 0;
  EventRef ev;              // the create or the map
  std::uintptr_t site = 0;  // the map site; 0 when not known
};

struct WakeRun {
  std::uint32_t tid = 0;
  EventRef first;                            // the first map into a sleeping range
  std::uint64_t woken = 0, woken_bytes = 0;  // sleeping ranges mapped again
  std::vector<WakeMade> made;                // at most kMaxMade
  std::uint64_t made_dropped = 0;
  bool failed = false;
  EventRef failed_call;
  int failed_res = 0;
};

// A mapping a failed wake-up made that was still in place when its run ended.
struct Leftover {
  WakeMade made;
  EventRef failed_call;
  int failed_res = 0;
  std::uint32_t tid = 0;  // the wake-up's thread
};

class Boundaries {
 public:
  static constexpr std::size_t kMaxMade = 4096, kMaxSites = 64, kMaxLeftovers = 1024,
                               kMaxRanges = 64;

  // One relaxed load: every hooked call asks it, so nothing more happens on the common path.
  bool open() const { return open_.load(std::memory_order_relaxed) != 0; }
  // Whether a hooked call of `role` on thread `tid` may end an open run: false is exact without
  // the lock. Only thread `tid` opens a run of its own or marks its wake-up failed; other threads
  // only end or replace it. So a run of this thread seen here is still as seen, or gone (the
  // locked on_call then finds nothing), and a run not seen as this thread's cannot become one.
  bool ends_run(std::uint32_t tid, CallRole role) const;
  // Whether thread `tid` may have a wake-up open: false is exact without the lock, as for
  // ends_run (only that thread opens one). A create or a refused call concerns only such a run.
  bool wake_open_on(std::uint32_t tid) const { return wake_of(tid); }

  struct Ended {
    std::optional<SleepRun> sleep;
    std::optional<WakeRun> wake;
    bool any() const { return sleep.has_value() || wake.has_value(); }
  };
  // A hooked call of `role` begins on thread `tid`: the runs it ends, which the caller closes
  // (snapshot, checks) before the call changes anything.
  Ended on_call(std::uint32_t tid, CallRole role);
  // Every open run ends now.
  Ended end_all();
  // cuMemAddressFree of the reservation at `va` begins on thread `tid`: freeing a range the open
  // sleep unmapped is part of a free (unmap, release, address free), freeing any other ends the
  // sleep (a teardown of what the allocator counts as asleep).
  Ended on_address_free(std::uint32_t tid, std::uint64_t va);

  // The driver accepted an unmap of [va, va+size) that left `ranges` ranges (`bytes`) asleep;
  // `sites` are the map sites of the mappings it took away (0 for one without a stack). Returns a
  // run of another thread that this one ends.
  Ended on_sleep_unmap(const EventRef &ev, std::uint64_t va, std::uint64_t size,
                       std::uint64_t ranges, std::uint64_t bytes, const std::uintptr_t *sites,
                       std::size_t nsites);
  // The driver accepted a map of `handle` at [va, va+size) that replaced `woken` sleeping ranges
  // (`woken_bytes`). Returns the runs it ends (a sleep: memory is being woken).
  Ended on_wake_map(const EventRef &ev, std::uint64_t va, std::uint64_t size, std::uint64_t handle,
                    std::uint64_t woken, std::uint64_t woken_bytes, std::uintptr_t site);
  // A map that replaced no sleeping range, accepted on a thread whose wake-up is open.
  void on_map(const EventRef &ev, std::uint64_t va, std::uint64_t size, std::uint64_t handle,
              std::uintptr_t site);
  // cuMemCreate succeeded: on a thread whose wake-up is open, the handle is the wake-up's.
  void on_create(const EventRef &ev, std::uint64_t handle, std::uint64_t size);
  // The driver refused a create, map or access call: an open wake-up of that thread failed.
  void on_refused(const EventRef &ev, int res);

  // Failed wake-ups' mappings still in place, for the check at the end of the next sleep.
  void keep(std::vector<Leftover> l);
  std::vector<Leftover> take_leftovers();
  // One relaxed load (every sleep's end asks): exact for the thread that ends the sleep, which
  // takes the leftovers under the lock when there are any.
  bool has_leftovers() const { return nleft_.load(std::memory_order_relaxed) != 0; }

  void fork_child();

 private:
  void set_open_locked();
  Ended take_locked();
  // The open runs' threads for ends_run, stored under the lock: kRun | tid for a sleep, and for a
  // wake-up also kFailed once it failed; 0 when none is open.
  static constexpr std::uint64_t kRun = 1ull << 32, kFailed = 1ull << 33;
  // Whether thread `tid` may have a wake-up open (exact when false, as for ends_run).
  bool wake_of(std::uint32_t tid) const {
    return (wake_run_.load(std::memory_order_relaxed) & ~kFailed) == (kRun | tid);
  }
  // One atomic instruction to take and one to give back (lock_within.h): a VMM free sequence takes
  // it three times (the unmap that opens the run, the address free, the call that ends the run).
  mutable FutexLock mu_;
  std::atomic<int> open_{0};
  std::atomic<std::uint64_t> sleep_run_{0}, wake_run_{0};
  std::atomic<std::size_t> nleft_{0};
  std::optional<SleepRun> sleep_;
  std::optional<WakeRun> wake_;
  std::vector<Leftover> leftovers_;
};

}  // namespace cmg
