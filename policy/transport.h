// SPDX-License-Identifier: Apache-2.0
// Transport-aware opportunistic cleanup, the pure half: the registry of live NCCL communicators
// (and transports announced through the C API), the sticky "opportunistic cleanup suppressed"
// state with the cleanup contract, the classification of a free's stack as a cache flush,
// and what the policy does with one.
//
// A communicator counts from the *entry* of its init call: NCCL starts proxy threads and lazily
// connects peers inside collectives (NCCL_RUNTIME_CONNECT, nccl-and-cleanup.md 1.2 and 6.1), so
// device work may be in flight before the init returns. Suppression is sticky: an empty
// communicator list does not prove the transports are quiet (the cleanup contract).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "event.h"
#include "units.h"
#include "options.h"

namespace cmg {

// ---- the registry ------------------------------------------------------------------------------

struct CommOnDevice {
  std::uint64_t comm = 0;
  int dev = -1;  // -1: not known
};

class Transport {
 public:
  static constexpr int kMaxDevices = 64;
  // Ended communicators remembered for comm-ended (the oldest forgotten first).
  static constexpr std::size_t kEndedKept = 4096;

  // An init/split/shrink/grow begins: suppression starts now, before the real call starts
  // background work, and this returns only once a flush already running under run_flush() has
  // finished. Returns true when this call turned suppression on.
  bool on_create_enter(const EventRef &ev);
  // It returned: these communicators exist now (none when it failed; a non-blocking init that
  // answered ncclInProgress has its communicator and counts as live).
  void on_create_exit(std::span<const CommOnDevice> created, const EventRef &ev = {});
  // A destroy or abort succeeded. Returns the communicator's device, -1 when it was not known
  // (it is remembered as ended either way).
  int on_destroy(std::uint64_t comm, const EventRef &ev = {});
  // cumemguard_suppress_opportunistic_cleanup(): a transport the shim cannot see (UCXX, a custom
  // one) is about to start. Same serialization as on_create_enter. True when it turned it on.
  bool suppress_external(const EventRef &ev);

  // ncclCommSuspend(NCCL_SUSPEND_MEM) succeeded: the communicator is quiet until it resumes.
  // NCCL synchronized the device and passed a barrier of all ranks before it released its memory
  // (2.29.7 src/mem_manager.cc ncclCommMemSuspend), and it takes no operation while suspended.
  // False when the communicator is not a live one the registry knows.
  bool on_suspended(std::uint64_t comm, const EventRef &ev);
  // ncclCommResume begins: the communicator may run collectives again as soon as it returns, so
  // it counts as running from now on, with the same serialization as an init: this returns once
  // a flush running under run_flush() has finished. on_resume_exit: it returned (ok: resumed;
  // else it is still suspended, as NCCL keeps its state when a resume fails).
  void on_resume_enter(std::uint64_t comm);
  void on_resume_exit(std::uint64_t comm, bool ok);

  int live() const { return live_.load(std::memory_order_relaxed); }
  int live_on(int dev) const;
  std::vector<std::pair<int, int>> live_by_device() const;  // (device, live), devices with any
  int device_of(std::uint64_t comm) const;                  // -1 when not known
  std::uint64_t created_total() const { return created_total_.load(std::memory_order_relaxed); }
  int suspended_count() const;
  // Where a live communicator stands: its device and since when it is suspended (not known():
  // running). nullopt when it is not live.
  struct CommState {
    int dev = -1;
    EventRef created;
    EventRef suspended;
  };
  std::optional<CommState> comm_state(std::uint64_t comm) const;
  // The end of a communicator that ended and was not created again since (comm-ended).
  std::optional<EventRef> ended(std::uint64_t comm) const;

  // Whether an optional flush must be suppressed now: from the first communicator's init on
  // (sticky: the cleanup contract), except while every communicator the process made is live and suspended
  // (proven quiet, see on_suspended) and no other transport was announced.
  bool suppressed() const { return suppressed_.load(std::memory_order_acquire); }
  // Whether suppression was ever turned on (sticky; suppressed() may be lifted meanwhile).
  bool ever_suppressed() const { return sticky_.load(std::memory_order_acquire); }
  // The event that turned suppression on (known once suppressed() has been true for a moment:
  // the first caller publishes it right after the flag).
  EventRef suppressed_by() const;

  // The cleanup contract (cumemguard_maybe_empty_cache): runs flush(arg) only while not
  // suppressed and returns whether it ran. Flushes run concurrently with each other; a transition
  // to suppressed waits for the ones running, and every request after the transition declines.
  bool run_flush(void (*flush)(void *), void *arg);
  // This thread is inside run_flush() of this registry: its frees are the program's adopted,
  // permitted flush, not an opportunistic one.
  bool flushing_here() const;
  std::uint64_t flushes_run() const { return flushes_run_.load(std::memory_order_relaxed); }
  std::uint64_t flushes_declined() const {
    return flushes_declined_.load(std::memory_order_relaxed);
  }

  // After fork(): the child has no communicators and no flush running; suppression stays (the
  // child inherits whatever the parent's transports left behind).
  void reset();

 private:
  struct Comm {
    int dev = -1;
    EventRef created, suspended;
    bool resuming = false;
  };
  bool set_suppressed(const EventRef &ev, bool external);
  // Publishes suppression and waits for the flushes running (unless this thread runs one).
  void wait_for_flushes();
  // Recomputes suppressed_ from the registry (comm_mu_ held). True when it turned it on.
  bool recompute_locked();
  std::atomic<int> live_{0};
  std::atomic<int> live_dev_[kMaxDevices + 1]{};  // the last slot: device not known
  std::atomic<std::uint64_t> created_total_{0};
  mutable std::mutex comm_mu_;
  std::unordered_map<std::uint64_t, Comm> comms_;  // live communicators
  std::unordered_map<std::uint64_t, EventRef> ended_;
  std::deque<std::uint64_t> ended_order_;
  int suspended_n_ = 0;  // live and suspended (not resuming)
  int creating_ = 0;     // create calls in flight
  bool unproven_ = false;  // a communicator ended or failed to start, or a transport was announced
  std::atomic<bool> sticky_{false};
  std::atomic<bool> suppressed_{false};
  std::atomic<bool> by_ready_{false};
  EventRef suppressed_by_{};  // written once, by the caller that turned suppression on
  std::atomic<std::uint64_t> flushes_run_{0}, flushes_declined_{0};
  std::shared_mutex flush_mu_;  // shared: a flush runs; exclusive: a transition waits for them
};

// ---- flush classification ----------------------------------------------------------------------

// What one stack frame says about a free made below it.
enum class FrameKind : std::uint8_t {
  Other,
  Flush,  // a cache flush (PyTorch's emptyCache, or a CUMEMGUARD_FLUSH_FRAMES pattern)
  Retry,  // an allocation that releases cached memory to retry (PyTorch's OOM path): intentional
  Nccl,   // code of libnccl itself: NCCL's own buffers, never the program's cache
};

// Function-name patterns: a frame matches when its demangled or mangled name contains one.
class FlushPatterns {
 public:
  // Built-in patterns (PyTorch 2.x, nccl-and-cleanup.md 4.2-4.5) plus CUMEMGUARD_FLUSH_FRAMES:
  // comma-separated; an entry starting with '!' marks an intentional-release frame instead.
  static FlushPatterns from_option(std::string_view extra);
  static std::span<const std::string_view> builtin_flush();
  static std::span<const std::string_view> builtin_retry();

  FrameKind classify(std::string_view mangled, std::string_view demangled,
                     std::string_view module_path) const;
  const std::vector<std::string> &flush() const { return flush_; }
  const std::vector<std::string> &retry() const { return retry_; }

 private:
  std::vector<std::string> flush_, retry_;
};

// A stack (innermost frame first) judged as a whole.
struct FlushVerdict {
  enum class Why : std::uint8_t { NoFlushFrame, Flush, RetryFrame, FromNccl };
  Why why = Why::NoFlushFrame;
  int flush_frame = -1;   // the innermost flush frame
  int caller_frame = -1;  // the first frame above the flush frames: where the flush was called
  bool opportunistic() const { return why == Why::Flush; }
};
// A free is opportunistic when a flush frame is on its stack, no allocation-retry frame is (an
// OOM retry releases cached blocks from inside malloc: intentional), and no frame is libnccl's.
FlushVerdict classify_stack(std::span<const FrameKind> frames);

// ---- what the policy does ----------------------------------------------------------------------

enum class FlushTarget : std::uint8_t { Free, Trim };

// For an opportunistic flush while suppressed (CUMEMGUARD_OPPORTUNISTIC is not allow):
//   Forward - report it and let it run (report); also what an explicit ACTION_..=forward asks
//   Defer   - hold the free back (defer); the caller forwards it after all when the held bytes
//             would exceed CUMEMGUARD_DEFER_LIMIT
//   Skip    - a pool trim under defer: not made at all (it only returns memory already free in
//             the pool, which keeps it for its next allocations; see docs/transport.md)
//   Abort   - strict mode or ACTION_OPPORTUNISTIC_FLUSH=abort
Action decide_flush(const Options &o, FlushTarget target);

// Everything a finding about one opportunistic flush says.
struct FlushEvent {
  std::string_view api;  // the call the program made
  FlushTarget target = FlushTarget::Free;
  Action action = Action::Forward;
  bool over_limit = false;       // would have been deferred; the limit made it go through
  std::uint64_t bytes = 0;       // the free's size (0 for a trim)
  std::uint64_t blocked_ns = 0;  // how long the call itself took (0 when not made now)
  std::uint64_t held_bytes = 0;  // deferred bytes held after this call
  std::uint64_t defer_limit = 0;
  std::string_view flush_frame;  // the matching function
  std::string_view site;         // "flush <- caller": where the flush was called
  int live = 0;                  // communicators live now
  EventRef suppressed_by;        // the init or C API call that turned suppression on
};
Finding flush_finding(const FlushEvent &e);


}  // namespace cmg
