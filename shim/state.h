// SPDX-License-Identifier: Apache-2.0
// The shim's process-wide state and the pieces every hook uses: two-stage init, the re-entry
// guard, event stamping (seq, time, thread, stack), call records, findings and decisions.
// Hooks stay thin: they call into this and into policy/.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cuda_api.h"
#include "event.h"
#include "eventlog.h"
#include "options.h"
#include "tracker.h"
#include "transport.h"

namespace cmg::shim {

struct State {
  Options opts;
  ByteCounters counters;
  LinearModel linear;
  VmmModel vmm{counters};
  Transport transport;
  EventLog log;
  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::uint64_t> calls[kApiCount]{};
  std::atomic<std::uint64_t> findings[kFindingClassCount]{};
  std::atomic<std::int64_t> warned{0};
  std::uint64_t start_mono_ns = 0;
  std::uint64_t start_unix_ns = 0;
  int rank = -1;
  // Set once by whichever writes the last records: the exit summary, or the crash handler.
  std::atomic<bool> summary_printed{false};
};

// The state, created on first use and never destroyed (frees from static destructors after main()
// returns must still be understood).
State &state();

// Stage 1: options parsed (constructor or first use). Cheap; never opens files.
bool options_ready();
// Stage 2 ("active"): the first intercepted CUDA/NCCL call. Opens the log. A process that never
// calls CUDA stays silent and writes nothing.
void activate();
bool active();

std::uint64_t now_ns();  // since the log started
std::uint32_t thread_id();

// Re-entry guard: a runtime call that reaches the driver underneath is recorded once, under the
// name the program called (the runtime hook), not again by the driver wrapper.
class ReentryGuard {
 public:
  // hold=false: only asks whether this is an outermost call, without hiding what runs inside it
  // (NCCL's own driver calls during communicator init are the program's memory traffic too).
  explicit ReentryGuard(bool hold = true) : held_(hold), outermost_(depth_ == 0) {
    if (held_) ++depth_;
  }
  ~ReentryGuard() {
    if (held_) --depth_;
  }
  bool outermost() const { return outermost_; }
  static bool inside() { return depth_ > 0; }

 private:
  static thread_local int depth_;
  bool held_;
  bool outermost_;
};

// Arguments of a call record, without allocation.
struct Args {
  enum class T : std::uint8_t { Hex, U, I, S };
  struct A {
    const char *k;
    T t;
    std::uint64_t v;
    const char *s;
  };
  A a[8];
  int n = 0;
  Args &hex(const char *k, std::uint64_t v) { return add(k, T::Hex, v, nullptr); }
  Args &u(const char *k, std::uint64_t v) { return add(k, T::U, v, nullptr); }
  Args &i(const char *k, std::int64_t v) { return add(k, T::I, static_cast<std::uint64_t>(v), nullptr); }
  Args &s(const char *k, const char *v) { return add(k, T::S, 0, v); }

 private:
  Args &add(const char *k, T t, std::uint64_t v, const char *s) {
    if (n < 8) a[n++] = A{k, t, v, s};
    return *this;
  }
};

enum class StackWhen : std::uint8_t { Never, Sampled, Always };
// Whether the calls a hooked function makes underneath are hidden (a runtime call's driver calls)
// or recorded on their own (NCCL's allocations inside ncclCommInitRank*).
enum class Nested : std::uint8_t { Hidden, Recorded };

// One intercepted call: guard, activation, event stamp and timing.
class Call {
 public:
  Call(Api api, StackWhen stack, Nested nested = Nested::Hidden);
  ~Call();
  Call(const Call &) = delete;
  Call &operator=(const Call &) = delete;
  // Outermost call in an enabled shim: track it. Otherwise the hook just forwards.
  bool tracked() const { return tracked_; }
  const EventRef &ev() const { return ev_; }
  Api api() const { return api_; }

  struct Extra {
    int dev = -1;
    std::optional<MemKind> mem;
    std::int64_t delta = 0;
    bool skipped = false;
    bool deferred = false;
    const char *va_state = nullptr;  // VMM calls the driver refused: what the model knows of the range
  };
  void log(int res, const Args &args, const Extra &x);
  void log(int res, const Args &args) { log(res, args, Extra{}); }

 private:
  ReentryGuard guard_;
  Api api_;
  bool tracked_ = false;
  EventRef ev_;
  std::uint64_t t0_ = 0;
};

// What to do with a call the policy found something about. A Skip is honoured only when the model
// proved the call redundant; otherwise it becomes Forward (architecture.md: skip only what is proven).
Action decide(const Finding &f, bool skippable);
// Classes whose finding stands only if the driver refuses the call: when the driver accepts it, the
// model missed something (an allocation made through a path the shim does not see) and keeps quiet.
bool needs_driver_refusal(FindingClass c);

// Writes the finding record, counts it, prints it (rate-limited) and, for Action::Abort, aborts
// after flushing the log. `res` is what the caller gets.
void report_finding(const Call &c, Finding f, Action action, int res, const Args &args);

// A finding that belongs to no call (the environment at load, leaks): counted, printed when it is
// an error, and written to the log (kept until the log opens).
void report_finding_without_call(Finding f, const char *where, bool print);

// A one-line diagnostic on stderr ("cumemguard: warning: …") and a `note` record in the log.
void note(LogLevel level, std::string_view msg);

// The current context's device, or -1 (no context on this thread, driver not loaded: P27).
int current_device();

}  // namespace cmg::shim
